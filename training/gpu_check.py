"""GPU check for a lent single-GPU machine (one H200): the real trainer against the planner.

Runs ``training.trainer.run`` on one GPU for Llama-shaped ~1B and ~3B models with random
weights and random tokens (Llama 3.2 1B and 3B dimensions from the model catalogue), a few
dozen steps each, in BF16, FP8 tensorwise and FP8 rowwise, without and then with
``torch.compile``. For each run it prints measured tokens/s, MFU (BF16-equivalent,
``Architecture.flops_per_token`` over the GPU's BF16 peak) and peak allocated memory next
to the planner's memory prediction (``tiered_training.memory.estimate``), and writes
everything as JSON.

    python -m training.gpu_check --list                 # the runs and predictions; no GPU needed
    python -m training.gpu_check --out results.json     # on the GPU (default: $OUT/gpu_check.json)

First, a context-parallel case (``context_parallel_case``: ring attention on the CUDA SDPA
kernels and the trainer with context parallelism 2 against 1, two ranks under torchrun;
see ``training/context_parallel_check.py``; at most ``--cp-timeout-s``, counted in the
budget). Runs are ordered so that the most informative come first; once ``--budget-s`` is spent
the rest are recorded as skipped, so the whole check stays under eight minutes. A run
that fails (out of memory, a missing kernel, a missing package) is recorded with its
error and the check carries on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from tiered_training.catalogs import instances, models
from tiered_training.memory import GIB, estimate
from tiered_training.runconfig import RunConfig

MODELS = {"1b": "llama-3.2-1b", "3b": "llama-3.2-3b"}
PRECISIONS = {"bf16": ("bf16", None), "fp8-tensorwise": ("fp8", "tensorwise"), "fp8-rowwise": ("fp8", "rowwise")}
# GPU name (torch.cuda.get_device_name) to a catalogue instance with that GPU, for its BF16 peak.
GPU_INSTANCES = {"H200": "ml.p5en.48xlarge", "H100": "ml.p5.48xlarge", "B200": "ml.p6-b200.48xlarge",
                 "B300": "ml.p6-b300.48xlarge", "A100": "ml.p4de.24xlarge"}


@dataclass(frozen=True)
class Case:
    model: str  # key of MODELS
    precision: str  # key of PRECISIONS
    compile: bool
    sequence_length: int
    micro_batch: int
    checkpointing: str

    @property
    def name(self) -> str:
        return f"{self.model}-{self.precision}{'-compile' if self.compile else ''}"


def cases(args) -> list[Case]:
    out = []
    for compiled in (False, True) if not args.no_compile else (False,):
        for model in args.models:
            for precision in args.precisions:
                out.append(Case(model, precision, compiled, args.seq, args.micro_batch, args.ac))
    return out


def run_config(case: Case, *, steps: int, instance: str, hbm_bytes: int) -> RunConfig:
    entry = models()[MODELS[case.model]]
    precision, recipe = PRECISIONS[case.precision]
    peak = instances()[instance].peak_bf16_flops
    return RunConfig.model_validate({
        "recipe_name": f"gpu-check-{case.name}",
        "model": {"name": entry.id, **entry.architecture.model_dump()},
        "parallel": {"sharding": "full", "shard_group_size": 1},
        "precision": {"precision": precision, "fp8_recipe": recipe, "activation_checkpointing": case.checkpointing,
                      "compile": case.compile, "loss_chunk_tokens": 4096},
        "batch": {"sequence_length": case.sequence_length, "micro_batch_size": case.micro_batch, "grad_accum_steps": 1,
                  "global_batch_tokens": case.sequence_length * case.micro_batch, "total_steps": 1000},
        "optimizer": {"lr": 3e-4, "min_lr_ratio": 0.1, "warmup_steps": 10, "schedule": "cosine", "weight_decay": 0.1,
                      "grad_clip": 1.0, "beta1": 0.9, "beta2": 0.95},
        "data": {"token_dtype": "uint32", "seed": 0},
        "checkpoint": {"interval_minutes": 0, "keep_last": 1, "shutdown_deadline_seconds": 60},
        "hardware": {"instance_type": instance, "gpus_per_node": 1, "peak_bf16_flops": peak, "hbm_bytes": hbm_bytes},
        "probe": {"steps": steps, "micro_batch_candidates": [case.micro_batch]},
    })


def prediction(cfg: RunConfig) -> dict:
    memory = estimate(
        cfg.model, precision=cfg.precision.precision, checkpointing=cfg.precision.activation_checkpointing,
        sequence_length=cfg.batch.sequence_length, micro_batch=cfg.batch.micro_batch_size, shard_group=1,
        hbm_bytes=cfg.hardware.hbm_bytes, loss_chunk_tokens=cfg.precision.loss_chunk_tokens,
    )
    return {
        "parameters": cfg.model.parameters,
        "flops_per_token": cfg.model.flops_per_token(cfg.batch.sequence_length),
        "predicted_peak_gib": round(memory.total / GIB, 2),
        "predicted_breakdown_gib": memory.as_gib(),
    }


def _write_tokens(data_dir: Path, vocab: int, tokens: int) -> None:
    import numpy as np

    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, tokens, dtype=np.uint32).tofile(data_dir / "shard-00000.bin")


def _measure(cfg: RunConfig, root: Path, steps: int) -> dict:
    import torch

    from training.paths import Paths
    from training.trainer import run

    paths = Paths(data_dir=root / "data", checkpoint_dir=root / "ckpt", model_dir=root / "model")
    stats: list = []
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    run(cfg, paths, hooks=[stats.append], max_steps=steps, resume=False, save_checkpoints=False, export=False)
    wall = time.perf_counter() - started
    warm = max(1, min(5, len(stats) // 3))  # leave out warm-up (and compile) steps
    steady = stats[warm:] or stats
    seconds = sum(s.step_time_s for s in steady)
    tps = sum(s.tokens for s in steady) / seconds
    mfu = 100.0 * cfg.mfu(tps)
    peak = max((s.peak_memory_bytes or 0) for s in stats)
    return {
        "status": "ok", "steps": len(stats), "wall_s": round(wall, 1), "first_step_s": round(stats[0].step_time_s, 2),
        "tokens_per_second": round(tps, 1), "mfu_percent": round(mfu, 2), "measured_peak_gib": round(peak / GIB, 2),
        "final_loss": round(stats[-1].loss, 4),
    }


def _release() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001
        pass


def context_parallel_case(out_dir: Path, timeout_s: float) -> dict:
    """Context parallelism 2 (ring attention on the CUDA SDPA kernels, then the trainer against
    context parallelism 1): ``training.context_parallel_check`` under torchrun with 2 ranks."""
    out = out_dir / "context_parallel_check.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "training.context_parallel_check", "--out", str(out)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # torchrun and its workers, which hold the GPU
        log, _ = proc.communicate()
    result = json.loads(out.read_text()) if out.exists() else {}
    status = "ok" if result.get("passed") else "timeout" if proc.returncode == -9 else "error"
    row = {"status": status, "seconds": round(time.monotonic() - started, 1), **result}
    if status != "ok":
        row["log_tail"] = log[-6000:].splitlines()
    return row


def _table(rows: list[dict]) -> str:
    head = f"{'run':<28} {'status':<8} {'tok/s':>9} {'MFU%':>6} {'peak GiB':>9} {'pred GiB':>9} {'err%':>6}"
    lines = [head, "-" * len(head)]
    for row in rows:
        measured, predicted = row.get("measured_peak_gib"), row["predicted_peak_gib"]
        err = f"{100 * (predicted - measured) / measured:+.1f}" if measured else "-"
        lines.append(
            f"{row['run']:<28} {row['status']:<8} {row.get('tokens_per_second', '-'):>9} {row.get('mfu_percent', '-'):>6} "
            f"{measured if measured is not None else '-':>9} {predicted:>9} {err:>6}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the runs and the planner's predictions, run nothing")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default: $OUT/gpu_check.json, else ./gpu_check.json)")
    parser.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS), help="comma list of 1b,3b")
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=list(PRECISIONS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--ac", default="selective", choices=["none", "selective", "full"])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip the remaining runs after this many seconds")
    parser.add_argument("--instance", default=None, help="catalogue instance for the BF16 peak (default: from the GPU name)")
    parser.add_argument("--cp-timeout-s", type=float, default=180.0,
                        help="the context-parallel case (first, 2 ranks under torchrun); 0 skips it")
    args = parser.parse_args(argv)
    for key in args.models:
        if key not in MODELS:
            parser.error(f"unknown model {key!r}; choose from {', '.join(MODELS)}")
    for key in args.precisions:
        if key not in PRECISIONS:
            parser.error(f"unknown precision {key!r}; choose from {', '.join(PRECISIONS)}")

    if args.list:
        instance = args.instance or "ml.p5en.48xlarge"
        hbm = instances()[instance].hbm_bytes
        print(f"gpu_check: {len(cases(args))} runs, {args.steps} steps each, on {instance} ({hbm / GIB:.1f} GiB)")
        for case in cases(args):
            pred = prediction(run_config(case, steps=args.steps, instance=instance, hbm_bytes=hbm))
            print(f"  {case.name:<28} params {pred['parameters'] / 1e9:5.2f}B  flops/token {pred['flops_per_token']:.3e}"
                  f"  predicted peak {pred['predicted_peak_gib']:7.2f} GiB")
        return 0

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --list for a dry run", file=sys.stderr)
        return 2
    os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    gpu = torch.cuda.get_device_name(0)
    instance = args.instance or next((inst for key, inst in GPU_INSTANCES.items() if key in gpu), "ml.p5en.48xlarge")
    hbm = torch.cuda.get_device_properties(0).total_memory
    out_path = args.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    env = {"gpu": gpu, "instance_for_peak": instance, "peak_bf16_tflops": instances()[instance].peak_bf16_tflops,
           "hbm_gib": round(hbm / GIB, 1), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import torchao

        env["torchao"] = torchao.__version__
    except ImportError as error:
        env["torchao"] = f"missing ({error})"
    print("gpu_check:", json.dumps(env), flush=True)

    started = time.monotonic()
    extra: dict = {}
    if args.cp_timeout_s > 0:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        extra["context_parallel"] = context_parallel_case(out_path.parent, args.cp_timeout_s)
        print("gpu_check: context parallel: " + json.dumps({k: extra["context_parallel"].get(k) for k in (
            "status", "seconds", "attention", "trainer")}), flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = Path(tmp)
        _write_tokens(root / "data", 128256, max(4_000_000, 2 * args.steps * args.micro_batch * (args.seq + 1)))
        for case in cases(args):
            cfg = run_config(case, steps=args.steps, instance=instance, hbm_bytes=hbm)
            row = {"run": case.name, **asdict(case), **prediction(cfg)}
            if time.monotonic() - started > args.budget_s:
                row["status"] = "skipped"
                row["error"] = f"time budget of {args.budget_s:.0f} s spent"
            else:
                try:
                    row.update(_measure(cfg, root, args.steps))
                except torch.OutOfMemoryError as error:
                    row.update(status="oom", error=str(error).splitlines()[0])
                except Exception as error:  # noqa: BLE001 - record and carry on
                    row.update(status="error", error=f"{type(error).__name__}: {error}"[:500])
                    traceback.print_exc()
                _release()
            rows.append(row)
            print(f"gpu_check: {case.name}: " + json.dumps({k: row.get(k) for k in (
                "status", "tokens_per_second", "mfu_percent", "measured_peak_gib", "predicted_peak_gib", "error")}),
                flush=True)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps({"environment": env, "runs": rows, **extra}, indent=2))  # partial results survive a kill
    print(_table(rows))
    print(f"gpu_check: wrote {out_path} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
