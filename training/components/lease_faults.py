"""S3 faults on the run's lease, for rehearsals only: ``TIERED_TRAINING_LEASE_FAULT="SECONDS"`` in a training job's
Environment makes every PutObject on the lease object (acquire, renew) answer ``503 ServiceUnavailable`` from SECONDS
after the launcher made its S3 client, as S3 does under load. The answer comes from a botocore ``before-send``
handler, so botocore's own retries and error parsing run as they would against S3; reads (the fence's HeadObject) are
left alone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tiered_training.contract.container import LEASE_NAME

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
    try:
        after = float(text)
    except ValueError:
        raise ValueError(f"{FAULT_VARIABLE}={text[:40]!r}: expected the seconds after which lease writes fail") from None
    start = time.monotonic() + after

    def answer(request: Any, **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        if time.monotonic() < start or not request.url.split("?")[0].endswith("/" + LEASE_NAME):
            return None
        return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Raw())

    client.meta.events.register("before-send.s3.PutObject", answer)
    return client
