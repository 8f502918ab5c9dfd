"""S3 for a rehearsal: a moto server on 127.0.0.1, the channels' downloads and SageMaker's checkpoint sync.

- :class:`LocalS3` starts moto's threaded server on a free loopback port (and stops it), one per process.
- :func:`download_prefix` copies every object under an S3 prefix into a directory: a
  ``FullyReplicated`` data channel, and the checkpoint prefix at job start (every host gets
  the whole prefix).
- :class:`CheckpointSync` mirrors one host's checkpoint directory to the checkpoint prefix
  while the job runs and once more at its end: new and changed files are uploaded, files
  deleted locally are deleted in S3 (SageMaker's documented behaviour). It records how
  many checkpoints (``step-N/`` prefixes) the prefix held after every pass.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiered_training.contract.ports import serve_on_free_port

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer

STEP = re.compile(r"(?:^|/)(step-\d+)/")


def start_moto(port: int) -> ThreadedMotoServer:
    """A started moto server on 127.0.0.1:``port``; OSError (EADDRINUSE) when the port is taken.
    moto's own ``ThreadedMotoServer.start`` would wait forever: werkzeug's failed bind ends the
    server's thread with ``sys.exit(1)`` (after printing the reason on stderr)."""
    import errno

    from moto.server import ThreadedMotoServer

    class Server(ThreadedMotoServer):
        error: OSError | None = None

        def _server_entry(self) -> None:
            try:
                super()._server_entry()
            except (OSError, SystemExit) as error:
                self.error = (
                    error
                    if isinstance(error, OSError)
                    else OSError(errno.EADDRINUSE, f"127.0.0.1:{port} cannot be bound (in use)")
                )
                self._server_ready_event.set()

    server = Server(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    if server.error is not None:
        raise server.error
    return server


def split_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an S3 URI: {uri}")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix


class LocalS3:
    """moto's S3 on 127.0.0.1; ``client()`` gives boto3 clients bound to it.

    moto keeps its state per process, so the instances of one process share one server: the
    first to enter starts it from an empty S3, the last to leave stops it and empties it, and
    each instance deletes the buckets it created when it leaves. Two rehearsals in one
    process (one after the other, or at once) never wipe each other's buckets.
    """

    _lock = threading.Lock()
    _server: ThreadedMotoServer | None = None
    _port: int | None = None  # set with _server
    _users = 0

    def __init__(self) -> None:
        self.port: int | None = None
        self.endpoint: str | None = None
        self.created: set[str] = set()

    def __enter__(self) -> LocalS3:
        import logging

        with LocalS3._lock:
            if LocalS3._server is None or LocalS3._port is None:
                logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
                os.environ.setdefault("AWS_ACCESS_KEY_ID", "rehearsal")
                os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "rehearsal")
                server, port = serve_on_free_port(start_moto)
                LocalS3._server, LocalS3._port = server, port
                self._bind(port)
                self.reset()  # a rehearsal must not see an earlier one's S3 (moto's state is per process)
            else:
                self._bind(LocalS3._port)
            LocalS3._users += 1
        return self

    def _bind(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: Any) -> None:
        with LocalS3._lock:
            LocalS3._users -= 1
            last = LocalS3._users == 0
            if last:
                self.reset()
                if LocalS3._server is not None:  # the first to enter started it
                    LocalS3._server.stop()
                LocalS3._server = LocalS3._port = None
        if not last:
            self._delete_created()

    def _delete_created(self) -> None:
        client = self.client()
        for bucket in sorted(self.created):
            try:
                for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
                    objects = [
                        {"Key": v["Key"], "VersionId": v["VersionId"]}
                        for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
                    ]
                    if objects:
                        client.delete_objects(Bucket=bucket, Delete={"Objects": objects})
                client.delete_bucket(Bucket=bucket)
            except client.exceptions.NoSuchBucket:
                pass

    def reset(self) -> None:
        """Empty every bucket of this process's moto backends (moto's own reset endpoint)."""
        import urllib.request

        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=30
        ).close()

    def client(self, service: str = "s3"):
        """A boto3 client of ``service`` (moto serves S3 and SageMaker's model registry here)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="rehearsal",
            aws_secret_access_key="rehearsal",
            config=Config(retries={"mode": "standard", "max_attempts": 2}, max_pool_connections=16),
        )

    def ensure_bucket(self, client, bucket: str, *, versioned: bool = False) -> None:
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if bucket not in existing:
            client.create_bucket(Bucket=bucket)
            self.created.add(bucket)
            if versioned:
                client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})


def list_keys(client, uri: str) -> dict[str, int]:
    """``{key relative to the prefix: size}`` of every object under ``uri``."""
    bucket, prefix = split_uri(uri)
    keys: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            keys[item["Key"][len(prefix) :].lstrip("/")] = item["Size"]
    return keys


def checkpoints_in(keys: dict[str, int] | list[str]) -> set[str]:
    return {m.group(1) for key in keys if (m := STEP.search(key))}


def download_prefix(client, uri: str, target: Path) -> int:
    """Copy every object under ``uri`` into ``target``; returns the number of files."""
    bucket, prefix = split_uri(uri)
    count = 0
    for key in list_keys(client, uri):
        # an object whose key is the prefix itself (model.tar.gz) arrives under its name, as in SageMaker
        path = Path(target) / (key or prefix.rsplit("/", 1)[-1])
        path.parent.mkdir(parents=True, exist_ok=True)
        source = (f"{prefix.rstrip('/')}/{key}" if key else prefix) if prefix else key
        client.download_file(bucket, source, str(path))
        count += 1
    return count


def upload_dir(client, source: Path, uri: str) -> int:
    bucket, prefix = split_uri(uri)
    count = 0
    for path in sorted(Path(source).rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix.rstrip('/')}/{path.relative_to(source).as_posix()}")
            count += 1
    return count


@dataclass
class SyncStats:
    uploads: int = 0
    deletes: int = 0
    max_checkpoints: int = 0
    passes: int = 0
    uploaded_keys: set[str] = field(default_factory=set)


class CheckpointSync:
    """One host's checkpoint directory mirrored to the checkpoint prefix (``start``, then ``stop`` for the last
    pass)."""

    def __init__(
        self,
        client,
        local: Path,
        uri: str,
        host: str,
        *,
        period_s: float = 0.2,
        known: set[str] | None = None,
        lock: threading.Lock | None = None,
        observe=None,
    ):
        self.client, self.local, self.uri, self.host = client, Path(local), uri, host
        self.bucket, self.prefix = split_uri(uri)
        self.period_s = period_s
        self.stats = SyncStats()
        self._seen: dict[str, tuple[int, int]] = {}
        self._known = set(known or ())  # objects this host has a copy of (downloaded at start, or uploaded)
        self._lock = lock or threading.Lock()
        self._observe = observe
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CheckpointSync:
        for path in self.local.rglob("*"):  # what the start-of-job download put here is already in S3
            if path.is_file():
                stat = path.stat()
                self._seen[path.relative_to(self.local).as_posix()] = (stat.st_size, stat.st_mtime_ns)
        self._thread = threading.Thread(target=self._loop, name=f"checkpoint-sync-{self.host}", daemon=True)
        self._thread.start()
        return self

    def halt(self) -> None:
        """End the mirroring without the last pass (the rehearsal is stopping)."""
        self._stop.set()

    def stop(self) -> SyncStats:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sync_once()  # SageMaker uploads what is left when the job ends
        return self.stats

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sync_once()
            except Exception:  # noqa: BLE001 - a file removed mid-pass: the next pass sees it
                continue

    def _key(self, relative: str) -> str:
        return f"{self.prefix.rstrip('/')}/{relative}" if self.prefix else relative

    def sync_once(self) -> None:
        with self._lock:
            current: dict[str, tuple[int, int]] = {}
            if self.local.is_dir():
                for path in self.local.rglob("*"):
                    try:
                        if path.is_file():
                            stat = path.stat()
                            current[path.relative_to(self.local).as_posix()] = (stat.st_size, stat.st_mtime_ns)
                    except FileNotFoundError:
                        continue
            gone = sorted((set(self._seen) | self._known) - set(current))
            changed = not self.stats.passes or bool(gone)
            for relative in gone:  # deletions first: the prefix never holds more than the hosts do
                self.client.delete_object(Bucket=self.bucket, Key=self._key(relative))
                self.stats.deletes += 1
                self._seen.pop(relative, None)
                self._known.discard(relative)
            for relative, signature in sorted(current.items()):
                if self._seen.get(relative) == signature:
                    continue
                try:
                    self.client.upload_file(
                        str(self.local / relative),
                        self.bucket,
                        self._key(relative),
                        ExtraArgs={"Metadata": {"host": self.host}},
                    )
                except (FileNotFoundError, OSError):
                    continue
                self._seen[relative] = signature
                self._known.add(relative)
                self.stats.uploads += 1
                self.stats.uploaded_keys.add(relative)
                changed = True
            self.stats.passes += 1
            if not changed:  # the prefix changes only by the syncs' own passes: its count is known
                return
            held = len(checkpoints_in(list_keys(self.client, self.uri)))
            self.stats.max_checkpoints = max(self.stats.max_checkpoints, held)
            if self._observe is not None:
                self._observe(held)
