"""S3 faults on the run's lease, for rehearsals only: ``TIERED_TRAINING_LEASE_FAULT`` in a training job's
Environment makes every PutObject on the lease object (acquire, renew) answer ``503 ServiceUnavailable``, as S3 does
under load: ``SECONDS`` from that many seconds after the launcher made its S3 client, ``step-N`` from the moment
a checkpoint of step N or later is committed in this host's checkpoint directory. Once failing, always failing (pruning
may remove step-N soon after). The answer comes from a botocore ``before-send``
handler, so botocore's own retries and error parsing run as they would against S3; reads (the fence's HeadObject) are
left alone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiered_training.contract.container import CHECKPOINT_LOCAL_PATH, LEASE_NAME

FAULT_VARIABLE = "TIERED_TRAINING_LEASE_FAULT"
BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ServiceUnavailable</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class _Raw:
    def stream(self, **_: Any):
        yield BODY


def apply_faults(client: Any, environ: Mapping[str, str]) -> Any:
    """``client`` with the faults ``environ`` asks for (none: unchanged). ValueError names a bad value."""
    text = (environ.get(FAULT_VARIABLE) or "").strip()
    if not text:
        return client
    bad = f"{FAULT_VARIABLE}={text[:40]!r}: expected SECONDS or step-N (when lease writes start to fail)"
    root: Path | None = None
    after = 0
    start = time.monotonic()
    if text.startswith("step-"):
        if not text[5:].isdigit():
            raise ValueError(bad)
        root = Path(environ.get("TT_CHECKPOINT_DIR") or CHECKPOINT_LOCAL_PATH)
        after = int(text[5:])
    else:
        try:
            start += float(text)
        except ValueError:
            raise ValueError(bad) from None

    failed: list[bool] = []

    def committed_since() -> bool:
        assert root is not None
        return any(
            path.parent.name[5:].isdigit() and int(path.parent.name[5:]) >= after
            for path in root.glob("step-*/COMMITTED")
        )

    def failing() -> bool:
        if not failed and (committed_since() if root is not None else time.monotonic() >= start):
            failed.append(True)
        return bool(failed)

    def answer(request: Any, **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        if not request.url.split("?")[0].endswith("/" + LEASE_NAME) or not failing():
            return None
        return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Raw())

    client.meta.events.register("before-send.s3.PutObject", answer)
    return client
