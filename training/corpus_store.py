"""Where the Prepare step reads and writes: an S3 prefix (boto3) or a local directory (the rehearsal's and tests'
inputs), behind one small interface.

Objects are named by their URI (``s3://bucket/key`` or a path). Writes carry their SHA-256: S3 checks it on the way
in (``ChecksumSHA256``) and returns it on a ``HEAD`` (``ChecksumMode``; the object's ``sha256`` metadata where a
store returns none), so a shard is checked against its marker
without reading it back; whole-object reads ask S3 to check the object's checksum (``ChecksumMode``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Object:
    uri: str
    relative: str  # below the listed prefix
    etag: str
    size: int


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def split_uri(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def as_prefix(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


class Store:
    """Reads and writes objects by URI; one boto3 client per process, made on first use."""

    def __init__(self) -> None:
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client("s3", config=Config(retries={"max_attempts": 10, "mode": "adaptive"}))
        return self._client

    def list(self, uri: str) -> list[Object]:
        """Every object under the prefix ``uri``, in key order."""
        prefix = as_prefix(uri)
        if not is_s3(uri):
            root = Path(uri)
            if root.is_file():
                stat = root.stat()
                return [Object(str(root), root.name, f"{stat.st_mtime_ns:x}-{stat.st_size:x}", stat.st_size)]
            found = []
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                stat = path.stat()
                relative = path.relative_to(root).as_posix()
                found.append(Object(str(path), relative, f"{stat.st_mtime_ns:x}-{stat.st_size:x}", stat.st_size))
            return found
        bucket, key = split_uri(prefix)
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for item in page.get("Contents", []):
                if item["Key"].endswith("/"):
                    continue
                found.append(
                    Object(
                        f"s3://{bucket}/{item['Key']}", item["Key"][len(key) :], item["ETag"].strip('"'), item["Size"]
                    )
                )
        return sorted(found, key=lambda o: o.uri)

    def download(self, uri: str, path: Path) -> None:
        """The whole object to ``path``, its checksum checked by S3 where it has one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if not is_s3(uri):
            shutil.copyfile(uri, path)
            return
        bucket, key = split_uri(uri)
        body = self.client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")["Body"]
        partial = path.with_name(path.name + ".part")
        with open(partial, "wb") as handle:
            for block in iter(lambda: body.read(1 << 22), b""):
                handle.write(block)
        os.replace(partial, path)

    def read_bytes(self, uri: str) -> bytes | None:
        """The object, or None when there is none."""
        if not is_s3(uri):
            return Path(uri).read_bytes() if Path(uri).is_file() else None
        bucket, key = split_uri(uri)
        try:
            return self.client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None

    def put_bytes(self, uri: str, data: bytes) -> None:
        if not is_s3(uri):
            _write_atomic(Path(uri), data)
            return
        bucket, key = split_uri(uri)
        self.client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumSHA256=_b64(hashlib.sha256(data).digest()))

    def put_file(self, path: Path, uri: str, sha256: str) -> None:
        """``path`` to ``uri``; S3 refuses it if its bytes do not have ``sha256``."""
        if not is_s3(uri):
            target = Path(uri)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".part")
            shutil.copyfile(path, partial)
            os.replace(partial, target)
            return
        bucket, key = split_uri(uri)
        with open(path, "rb") as handle:
            self.client.put_object(
                Bucket=bucket,
                Key=key,
                Body=handle,
                ChecksumSHA256=_b64(bytes.fromhex(sha256)),
                Metadata={"sha256": sha256},  # also where S3's own checksum is not returned (moto)
            )

    def matches(self, uri: str, size: int, sha256: str) -> bool:
        """Whether the object is there with this size and SHA-256 (S3: its stored checksum; local: read)."""
        if not is_s3(uri):
            path = Path(uri)
            return path.is_file() and path.stat().st_size == size and sha256_file(path) == sha256
        bucket, key = split_uri(uri)
        try:
            head = self.client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        except self.client.exceptions.ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        stored = head.get("ChecksumSHA256")
        if stored is not None:
            return head["ContentLength"] == size and stored == _b64(bytes.fromhex(sha256))
        return head["ContentLength"] == size and head.get("Metadata", {}).get("sha256") == sha256  # ours carry it

    def exists(self, uri: str) -> bool:
        if not is_s3(uri):
            return Path(uri).is_file()
        bucket, key = split_uri(uri)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
        except self.client.exceptions.ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def open_range(self, obj: Object):
        """A seekable binary file over the object (Parquet reads its footer and row groups by range)."""
        if not is_s3(obj.uri):
            return open(obj.uri, "rb")
        return RangeFile(self.client, obj)


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of an S3 object by ranged GETs, pinned to the listed ETag (IfMatch): an object
    replaced while it is read fails the read instead of mixing two versions."""

    def __init__(self, client, obj: Object):
        self.client, self.obj = client, obj
        self.bucket, self.key = split_uri(obj.uri)
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.obj.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer) -> int:
        end = min(self.obj.size, self.position + len(buffer))
        if end <= self.position:
            return 0
        body = self.client.get_object(
            Bucket=self.bucket, Key=self.key, Range=f"bytes={self.position}-{end - 1}", IfMatch=f'"{self.obj.etag}"'
        )["Body"].read()
        buffer[: len(body)] = body
        self.position += len(body)
        return len(body)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    partial.write_bytes(data)
    os.replace(partial, path)
