"""A starting checkpoint given as an earlier run's export: the ``model.tar.gz`` a SageMaker training job
uploads from ``/opt/ml/model`` (``model.init_checkpoint: s3://.../output/model.tar.gz``).

The channel then holds the archive alone; :func:`unpacked` extracts it once per host (the local ranks
wait on a file lock, the first extracts, the others reuse it) into a directory under the temporary
directory named by the archive's size and modification time, with tarfile's ``data`` filter (no links
out of it, no absolute paths). A merged export is a Hugging Face checkpoint (config.json, safetensors,
tokenizer); an adapter export (the LoRA adapter alone) cannot be started from, and is refused by name.
"""

from __future__ import annotations

import fcntl
import hashlib
import tarfile
import tempfile
from pathlib import Path

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
DONE = ".unpacked"


class ArchiveError(ValueError):
    """An init archive that cannot be a starting checkpoint; the message names it and says why."""


def archive_in(directory: Path) -> Path | None:
    """The one archive in ``directory`` when it holds no config.json, else None."""
    if not directory.is_dir() or (directory / "config.json").is_file():
        return None
    archives = sorted(p for p in directory.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES))
    if len(archives) > 1:
        raise ArchiveError(f"{directory}: {len(archives)} archives ({', '.join(p.name for p in archives)}); give one")
    return archives[0] if archives else None


def unpacked(directory: Path, into: Path | None = None) -> Path:
    """``directory`` itself, or the checkpoint its one archive holds, extracted once."""
    archive = archive_in(directory)
    if archive is None:
        return directory
    stat = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = (into or Path(tempfile.gettempdir())) / f"tt-init-{key}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"tt-init-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / DONE).is_file():
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(target, filter="data")
            except (tarfile.TarError, OSError) as error:
                raise ArchiveError(f"{archive}: not a readable tar.gz archive ({error})") from None
            (target / DONE).touch()
    root = _checkpoint_root(target)
    if not (root / "config.json").is_file():
        what = (
            "an adapter export (the LoRA adapter alone): start from a merged export (export.format: merged), "
            "or from the base checkpoint"
            if (root / "adapter_config.json").is_file()
            else "no config.json in it: not a Hugging Face checkpoint"
        )
        raise ArchiveError(f"{archive}: {what}")
    return root


def _checkpoint_root(target: Path) -> Path:
    """The archive's top, or its one folder when it wraps everything in one."""
    entries = [p for p in target.iterdir() if p.name != DONE]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return target
