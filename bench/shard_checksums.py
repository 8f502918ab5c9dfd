"""What proving the data costs when the trainer opens it: SHA-256 of token shards (training/components/shard_manifest.py)
in seconds per GB, one process, the file just written (in the page cache: the hashing's own cost, not the disk's).

    .venv/bin/python bench/shard_checksums.py [--mb 512] [--out bench/shard_checksums.json]

A host's local ranks split the shards, so a host with R ranks hashes its copy in about (s/GB x GB) / R while its
disk keeps up; a second open of the same files in one process costs nothing (remembered per path, size and mtime).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.components import shard_manifest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=512, help="shard size in MiB")
    parser.add_argument("--out", default="bench/shard_checksums.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shard-00000.bin"
        with open(path, "wb") as handle:
            for _ in range(args.mb):
                handle.write(os.urandom(1 << 20))
        gb = args.mb / 1024
        for case in ("first (page cache warm)", "again (remembered)"):
            if case.startswith("first"):
                shard_manifest._hashes.clear()
            started = time.perf_counter()
            shard_manifest.file_sha256(path)
            seconds = time.perf_counter() - started
            rows.append(
                {"case": case, "gb": round(gb, 3), "seconds": round(seconds, 4), "s_per_gb": round(seconds / gb, 4)}
            )
    print(f"{'case':<26} {'GB':>6} {'s':>8} {'s/GB':>8}")
    for row in rows:
        print(f"{row['case']:<26} {row['gb']:>6} {row['seconds']:>8} {row['s_per_gb']:>8}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "cpu": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
