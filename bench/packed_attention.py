"""Packed attention on the CPU: the dense N x N mask against FlexAttention's block mask, memory and time.

One attention call of a packed sequence (examples of 128 to 2048 tokens, drawn once from a fixed seed,
filling ``N``), as the decoder makes it (``training.models.attention``): the mask built from the
positions, then ``sdpa_attention``:

- ``dense``: a boolean ``[1, 1, N, N]`` mask and SDPA (the CPU flash kernel with a mask; K/V heads
  repeated for GQA), the path CPU training keeps;
- ``flex``: the ``BlockMask`` and compiled FlexAttention, which skips the blocks between examples.

Forward only, under ``torch.no_grad``: PyTorch 2.13's FlexAttention has no CPU backward. Each case runs in
a fresh process; after a warm-up (for ``flex``, the compile), the process's peak resident memory is reset
(``/proc/self/clear_refs``) and ``peak_mib`` is the peak above the memory held before the timed calls
(the inputs, the output of the warm-up freed). ``mask_mib`` is the mask's own tensors; ``seconds`` the
median call, mask included (``--repeats`` calls, fewer once they have taken a minute); ``blocks`` the
128 x 128 blocks computed as a share of the causal square's (SDPA under a mask computes the whole square:
about 2). A case that runs past ``--timeout`` or is killed (out of memory) is recorded as such.

    .venv/bin/python bench/packed_attention.py                       # table + bench/packed_attention.json
    .venv/bin/python bench/packed_attention.py --lengths 4096 --paths flex --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MIB = 2**20
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64  # GQA as in Llama 3's 8B (32 / 8 heads), fewer heads for two CPUs
EXAMPLE_TOKENS = (128, 2048)  # each example's length is drawn in this range
LENGTHS = (4096, 16384, 32768)
PATHS = ("dense", "flex")
REPEAT_SECONDS = 60.0  # no further timed call once the calls have taken this long


def example_lengths(n: int, seed: int = 0) -> list[int]:
    """Lengths of the examples packed into ``n`` tokens (the last one cut to fit)."""
    import random

    draw, lengths = random.Random(seed), list[int]()
    while sum(lengths) < n:
        lengths.append(min(draw.randint(*EXAMPLE_TOKENS), n - sum(lengths)))
    return lengths


def causal_blocks(n: int) -> int:
    blocks = -(-n // 128)
    return blocks * (blocks + 1) // 2


def _memory_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS


def measure(n: int, path: str, repeats: int) -> dict:
    """One case in this process (see the module docstring)."""
    import gc

    import torch

    from training.models.attention import block_mask, dense_mask, document_ids, sdpa_attention

    torch.manual_seed(0)
    lengths = example_lengths(n)
    positions = torch.cat([torch.arange(length) for length in lengths])[None]
    q = torch.randn(1, HEADS, n, HEAD_DIM)
    k, v = (torch.randn(1, KV_HEADS, n, HEAD_DIM) for _ in range(2))
    scale = HEAD_DIM**-0.5

    def mask():
        example = document_ids(positions)
        assert example is not None  # several examples
        return block_mask(example) if path == "flex" else dense_mask(example)

    def call():
        return sdpa_attention(None, q, k, v, mask(), scale)

    row: dict = {"tokens": n, "path": path, "examples": len(lengths), "threads": torch.get_num_threads()}
    with torch.no_grad():
        start = time.perf_counter()
        if path == "flex":
            call()  # compiles
            row["compile_seconds"] = round(time.perf_counter() - start, 1)
        else:  # no compile: warm the kernel on a short sequence
            sdpa_attention(None, q[..., :256, :], k[..., :256, :], v[..., :256, :], None, scale)
        built = mask()
        if isinstance(built, torch.Tensor):
            row["mask_mib"] = built.numel() * built.element_size() / MIB
        else:
            tensors = [t for t in built.as_tuple() if isinstance(t, torch.Tensor)]
            row["mask_mib"] = sum(t.numel() * t.element_size() for t in tensors) / MIB
            row["blocks"] = round(float(built.to_dense().sum()) / causal_blocks(n), 4)
        del built
        gc.collect()
        baseline = _memory_kib("VmRSS")
        _reset_peak()
        times: list[float] = []
        while len(times) < repeats and sum(times) < REPEAT_SECONDS:  # one call at least
            start = time.perf_counter()
            out = call()
            times.append(time.perf_counter() - start)
            del out
        row["calls"] = len(times)
        row["peak_mib"] = round((_memory_kib("VmHWM") - baseline) / 1024, 1)
    row["seconds"] = round(statistics.median(times), 4)
    row["mask_mib"] = round(row["mask_mib"], 3)
    return row


def run_case(n: int, path: str, repeats: int, timeout: float) -> dict:
    """``measure`` in a fresh process; its row, or what stopped it."""
    command = [sys.executable, __file__, "--case", f"{n}:{path}", "--repeats", str(repeats)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"tokens": n, "path": path, "failed": f"still running after {timeout:.0f} s (stopped)"}
    if done.returncode != 0:
        why = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        tail = done.stderr.strip().splitlines()[-1:] if done.stderr.strip() else []
        return {"tokens": n, "path": path, "failed": why + (f": {tail[0]}" if tail else "")}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if path == "dense":  # every block of the square
        row["blocks"] = round((-(-n // 128)) ** 2 / causal_blocks(n), 4)
    row["process_seconds"] = round(time.perf_counter() - start, 1)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        f"{'tokens':>7} {'path':>6} {'examples':>8} {'blocks':>7} {'mask MiB':>9} {'peak MiB':>9} {'seconds':>9}  note"
    ]
    for row in rows:
        if "failed" in row:
            lines.append(
                f"{row['tokens']:>7} {row['path']:>6} {'':>8} {'':>7} {'':>9} {'':>9} {'':>9}  {row['failed']}"
            )
            continue
        note = f"compile {row['compile_seconds']} s" if "compile_seconds" in row else ""
        lines.append(
            f"{row['tokens']:>7} {row['path']:>6} {row['examples']:>8} {row['blocks']:>7.3f} {row['mask_mib']:>9.3f} "
            f"{row['peak_mib']:>9.1f} {row['seconds']:>9.3f}  {note}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case (a fresh process)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/packed_attention.json")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # N:path, run in this process (the child)
    args = parser.parse_args(argv)
    if args.case:
        n, path = args.case.split(":")
        print(json.dumps(measure(int(n), path, args.repeats)))
        return 0
    import torch

    rows = []
    for n in args.lengths:
        for path in args.paths:
            rows.append(run_case(n, path, args.repeats, args.timeout))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    document = {
        "torch": torch.__version__,
        "heads": HEADS,
        "kv_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "example_tokens": list(EXAMPLE_TOKENS),
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
