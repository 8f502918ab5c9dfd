"""GPU check for a lent single-GPU machine (one H200): the real trainer against the planner.

Runs ``training.trainer.run`` on one GPU for Llama-shaped ~1B and ~3B models with random
weights and random tokens (Llama 3.2 1B and 3B dimensions from the model catalogue), a few
dozen steps each, in BF16, FP8 tensorwise and FP8 rowwise, without and then with
``torch.compile``. For each run it measures tokens/s per GPU, MFU (BF16-equivalent,
``RunConfig.mfu``) and the steady-state peak memory, both allocated
(``torch.cuda.max_memory_allocated``) and reserved (``max_memory_reserved``), next to the
planner's ``tiered_training.planning.memory.estimate`` of the same two quantities (its
``allocated`` and ``reserved``: the fixed CUDA/NCCL reserve is in neither).

It writes one JSON document: ``rows`` are calibration rows that ``make calibrate`` reads
(see ``bench/gpu/README.md``); ``runs`` has every run's detail, errors included;
``environment`` says where each package was imported from.

    python -m training.tools.gpu_check --list                 # the runs and predictions; no GPU needed
    python -m training.tools.gpu_check                        # on the GPU: bench/gpu/gpu-check-<gpu>-<date>.json
    python -m training.tools.gpu_check --cpu-smoke --out x.json   # the same code path on the CPU, a tiny model

First, a packed-sequence case (``packing_case``: SFT examples packed in one sequence against
each alone on the device's SDPA kernels, which kernels ran, and the document mask's cost; see
``training/tools/packing_check.py``; seconds). Then a context-parallel case (``context_parallel_case``:
ring attention on the CUDA SDPA kernels and the trainer with context parallelism 2 against 1, two ranks under torchrun;
see ``training/tools/context_parallel_check.py``; at most ``--cp-timeout-s``, counted in the
budget). Runs are ordered so that the most informative come first; once ``--budget-s`` is spent
the rest are recorded as skipped, so the whole check stays under eight minutes. A run
that fails (out of memory, a missing kernel, a missing package) is recorded with its
error and the check carries on. ``bash training/tools/gpu_check.sh`` is the way to start it on
a machine whose image lacks pydantic, torchao or torchdata.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from tiered_training.catalog import instances, models
from tiered_training.contract.runconfig import RunConfig
from tiered_training.planning.memory import GIB, estimate

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"1b": "llama-3.2-1b", "3b": "llama-3.2-3b"}
# A Llama-shaped model for --cpu-smoke: the code path of the GPU runs in seconds on a CPU.
SMOKE_MODEL = {
    "layers": 2,
    "hidden_size": 128,
    "attention_heads": 4,
    "kv_heads": 2,
    "ffn_size": 352,
    "vocab_size": 512,
    "max_sequence_length": 256,
}
PRECISIONS = {"bf16": ("bf16", None), "fp8-tensorwise": ("fp8", "tensorwise"), "fp8-rowwise": ("fp8", "rowwise")}
# GPU name (torch.cuda.get_device_name) to a catalogue instance with that GPU, for its BF16 peak.
GPU_INSTANCES = {
    "H200": "ml.p5en.48xlarge",
    "H100": "ml.p5.48xlarge",
    "B200": "ml.p6-b200.48xlarge",
    "B300": "ml.p6-b300.48xlarge",
    "A100": "ml.p4de.24xlarge",
}
# The calibration row: exactly these keys (``make calibrate`` reads them; bench/gpu/README.md).
ROW_KEYS = (
    "id",
    "source",
    "date",
    "hardware",
    "gpu",
    "gpus",
    "framework",
    "model",
    "sequence_length",
    "micro_batch_size",
    "grad_accum_steps",
    "precision",
    "fp8_recipe",
    "activation_checkpointing",
    "sharding",
    "shard_group_size",
    "context_parallel",
    "compile",
    "tokens_per_second_per_gpu",
    "peak_memory_gib_allocated",
    "peak_memory_gib_reserved",
    "notes",
)
LOSS_CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class Case:
    model: str  # key of MODELS, or "smoke"
    precision: str  # key of PRECISIONS
    compile: bool
    sequence_length: int
    micro_batch: int
    checkpointing: str

    @property
    def name(self) -> str:
        return f"{self.model}-{self.precision}{'-compile' if self.compile else ''}"


def cases(args) -> list[Case]:
    if args.cpu_smoke:
        return [Case("smoke", precision, False, args.seq, args.micro_batch, args.ac) for precision in args.precisions]
    out = []
    for compiled in {"both": (False, True), "off": (False,), "on": (True,)}[args.compile]:
        for model in args.models:
            for precision in args.precisions:
                out.append(Case(model, precision, compiled, args.seq, args.micro_batch, args.ac))
    return out


def model_dimensions(case: Case) -> dict:
    if case.model == "smoke":
        return {"name": "smoke-llama", **SMOKE_MODEL}
    entry = models()[MODELS[case.model]]
    return {"name": entry.id, **entry.architecture.model_dump()}


def run_config(case: Case, *, steps: int, instance: str, hbm_bytes: int) -> RunConfig:
    precision, recipe = PRECISIONS[case.precision]
    peak = instances()[instance].peak_bf16_flops if instance in instances() else 1e12
    return RunConfig.model_validate(
        {
            "recipe_name": f"gpu-check-{case.name}",
            "model": model_dimensions(case),
            "parallel": {"sharding": "full", "shard_group_size": 1},
            "precision": {
                "precision": precision,
                "fp8_recipe": recipe,
                "activation_checkpointing": case.checkpointing,
                "compile": case.compile,
                "loss_chunk_tokens": LOSS_CHUNK_TOKENS,
            },
            "batch": {
                "sequence_length": case.sequence_length,
                "micro_batch_size": case.micro_batch,
                "grad_accum_steps": 1,
                "global_batch_tokens": case.sequence_length * case.micro_batch,
                "total_steps": 1000,
            },
            "optimizer": {
                "lr": 3e-4,
                "min_lr_ratio": 0.1,
                "warmup_steps": 10,
                "schedule": "cosine",
                "weight_decay": 0.1,
                "grad_clip": 1.0,
                "beta1": 0.9,
                "beta2": 0.95,
            },
            "data": {"token_dtype": "uint32", "seed": 0},
            "checkpoint": {"interval_minutes": 0, "keep_last": 1, "shutdown_deadline_seconds": 60},
            "hardware": {
                "instance_type": instance,
                "gpus_per_node": 1,
                "peak_bf16_flops": peak,
                "hbm_bytes": hbm_bytes,
            },
            "probe": {"steps": steps},
        }
    )


def prediction(cfg: RunConfig) -> dict:
    """The planner's peak for this run (one micro-batch per step, one GPU)."""
    memory = estimate(
        cfg.model,
        precision=cfg.precision.precision,
        checkpointing=cfg.precision.activation_checkpointing,
        sequence_length=cfg.batch.sequence_length,
        micro_batch=cfg.batch.micro_batch_size,
        shard_group=1,
        hbm_bytes=cfg.hardware.hbm_bytes,
        loss_chunk_tokens=cfg.precision.loss_chunk_tokens,
        grad_accum_steps=cfg.batch.grad_accum_steps,
    )
    return {
        "parameters": cfg.model.parameters,
        "flops_per_token": cfg.model.flops_per_token(cfg.batch.sequence_length),
        "predicted_allocated_gib": round(memory.allocated / GIB, 2),
        "predicted_reserved_gib": round(memory.reserved / GIB, 2),
        "predicted_peak_at": memory.peak_at,
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

    cuda = torch.cuda.is_available()
    paths = Paths(data_dir=root / "data", checkpoint_dir=root / "ckpt", model_dir=root / "model")
    stats: list = []
    reserved: list[int] = []

    def hook(step) -> None:
        stats.append(step)
        # The trainer resets the peak statistics at the start of every step.
        reserved.append(torch.cuda.max_memory_reserved() if cuda else 0)

    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    run(cfg, paths, hooks=[hook], max_steps=steps, resume=False, save_checkpoints=False, export=False)
    wall = time.perf_counter() - started
    warm = max(1, min(5, len(stats) // 3))  # leave out warm-up (and compile) steps
    steady = stats[warm:] or stats
    seconds = sum(s.step_time_s for s in steady)
    tps = sum(s.tokens for s in steady) / seconds / (steady[0].world_size or 1)
    # Steady state: from the second step on, the optimiser's states exist.
    allocated = max((s.peak_memory_bytes or 0) for s in stats[1:] or stats) if cuda else None
    peak_reserved = max(reserved[1:] or reserved) if cuda else None
    return {
        "status": "ok",
        "steps": len(stats),
        "warmup_steps": len(stats) - len(steady),
        "wall_s": round(wall, 1),
        "first_step_s": round(stats[0].step_time_s, 2),
        "tokens_per_second": round(tps, 1),
        "mfu_percent": round(100.0 * cfg.mfu(tps), 2),
        "measured_allocated_gib": round(allocated / GIB, 3) if cuda else None,
        "measured_reserved_gib": round(peak_reserved / GIB, 3) if cuda else None,
        "final_loss": round(stats[-1].loss, 4),
    }


def calibration_row(case: Case, cfg: RunConfig, run: dict, env: dict) -> dict:
    """One row of ``bench/gpu/*.json`` in the calibration format."""
    precision, recipe = PRECISIONS[case.precision]
    model = MODELS.get(case.model) or {k: v for k, v in cfg.model.model_dump().items() if k != "name"}
    row = {
        "id": f"gpu-check-{env['gpu_slug']}-{env['stamp']}-{case.name}",
        "source": f"training/tools/gpu_check.py on {env['gpu']} ({env['date']})",
        "date": env["date"],
        "hardware": env["instance"],
        "gpu": env["gpu"],
        "gpus": 1,
        "framework": "tiered-training",
        "model": model,
        "sequence_length": case.sequence_length,
        "micro_batch_size": case.micro_batch,
        "grad_accum_steps": cfg.batch.grad_accum_steps,
        "precision": precision,
        "fp8_recipe": recipe,
        "activation_checkpointing": case.checkpointing,
        "sharding": "full",
        "shard_group_size": 1,
        "context_parallel": 1,
        "compile": case.compile,
        "tokens_per_second_per_gpu": run["tokens_per_second"],
        "peak_memory_gib_allocated": run["measured_allocated_gib"],
        "peak_memory_gib_reserved": run["measured_reserved_gib"],
        "notes": (
            f"MFU {run['mfu_percent']}% (BF16-equivalent); {run['steps']} steps, {run['warmup_steps']} of "
            f"warm-up left out; random weights and tokens; one GPU (FSDP2 over 1 rank); torch {env['torch']}, "
            f"torchao {env['torchao']}; loss chunk {LOSS_CHUNK_TOKENS} tokens"
            + ("; CPU smoke run, not a measurement" if env["cpu_smoke"] else "")
        ),
    }
    assert tuple(row) == ROW_KEYS
    return row


def context_parallel_case(out_dir: Path, timeout_s: float) -> dict:
    """Context parallelism 2 (ring attention on the CUDA SDPA kernels, then the trainer against
    context parallelism 1): ``training.tools.context_parallel_check`` under torchrun with 2 ranks."""
    out = out_dir / "context_parallel_check.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "training.tools.context_parallel_check",
        "--out",
        str(out),
    ]
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


def packing_case(cpu_smoke: bool) -> dict:
    """Packed SFT sequences on this device's SDPA kernels (``training.tools.packing_check``): each
    example's logits in the pack against alone, the kernels that ran, and the document mask's cost."""
    import torch

    from training.tools.packing_check import CPU_LENGTHS, CPU_MODEL, GPU_LENGTHS, GPU_MODEL, check

    started = time.monotonic()
    try:
        if cpu_smoke:
            result = check(torch.device("cpu"), torch.float32, CPU_MODEL, CPU_LENGTHS, 32)
        else:
            result = check(torch.device("cuda", 0), torch.bfloat16, GPU_MODEL, GPU_LENGTHS, 4096)
        status = "ok" if result["passed"] else "failed"
    except Exception as error:  # noqa: BLE001 - record and carry on
        result, status = {"error": f"{type(error).__name__}: {error}"[:500]}, "error"
        traceback.print_exc()
    _release()
    return {"status": status, "seconds": round(time.monotonic() - started, 1), **result}


def _release() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001
        pass


def environment(cpu_smoke: bool, instance_arg: str | None) -> dict:
    """What runs where: the GPU, the instance it stands for, and where each package comes from."""
    import torch

    now = datetime.now(UTC)
    gpu = "cpu" if cpu_smoke else torch.cuda.get_device_name(0)
    instance = instance_arg or (
        "cpu" if cpu_smoke else next((inst for key, inst in GPU_INSTANCES.items() if key in gpu), "ml.p5en.48xlarge")
    )
    env = {
        "gpu": gpu,
        "gpu_slug": "".join(c if c.isalnum() else "-" for c in gpu.lower()).strip("-"),
        "instance": instance,
        "cpu_smoke": cpu_smoke,
        "date": now.date().isoformat(),
        "stamp": now.strftime("%Y%m%dT%H%M%S"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if instance in instances():
        env["peak_bf16_tflops"] = instances()[instance].peak_bf16_tflops
    if not cpu_smoke:
        env["hbm_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
    packages = {}
    for name in ("torch", "transformers", "pydantic", "pydantic_core", "torchao", "torchdata", "typing_extensions"):
        try:
            module = __import__(name)
            packages[name] = {"version": getattr(module, "__version__", "?"), "from": str(Path(module.__file__).parent)}
        except ImportError as error:
            packages[name] = {"missing": str(error)}
    env["packages"] = packages
    env["torchao"] = packages["torchao"].get("version", "missing")
    carried = os.environ.get("TT_APPEND_SYSPATH")
    if carried:
        # The carried packages are appended after site-packages: the image's torch must win.
        torch_dir = packages["torch"]["from"]
        if any(torch_dir.startswith(str(Path(p).resolve())) for p in carried.split(os.pathsep) if p):
            raise SystemExit(f"gpu_check: torch was imported from the carried packages ({torch_dir}), not the image's")
        env["sys_path_tail"] = sys.path[-3:]
    return env


def _table(runs: list[dict]) -> str:
    head = (
        f"{'run':<26} {'status':<7} {'tok/s':>9} {'MFU%':>6} {'alloc GiB':>10} {'plan':>7} {'err%':>6}"
        f" {'resv GiB':>9} {'plan':>7} {'err%':>6}"
    )
    lines = [head, "-" * len(head)]

    def err(measured, predicted):
        return f"{100 * (predicted - measured) / measured:+.1f}" if measured else "-"

    for run in runs:
        alloc, resv = run.get("measured_allocated_gib"), run.get("measured_reserved_gib")
        lines.append(
            f"{run['run']:<26} {run['status']:<7} {run.get('tokens_per_second', '-'):>9} "
            f"{run.get('mfu_percent', '-'):>6} "
            f"{alloc if alloc is not None else '-':>10} {run['predicted_allocated_gib']:>7} "
            f"{err(alloc, run['predicted_allocated_gib']):>6} {resv if resv is not None else '-':>9} "
            f"{run['predicted_reserved_gib']:>7} {err(resv, run['predicted_reserved_gib']):>6}"
        )
    return "\n".join(lines)


def health_case(cpu: bool, cfg: RunConfig) -> dict:
    """The probe's health-check matmul on this device, against the catalogue's figure (GPU only), and what NVML
    says about each GPU (none without NVML or a GPU: nothing is made up)."""
    import torch

    from training.components.gpu_health import GpuHealth
    from training.health_check import Expected, matmul_tflops

    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    found: dict = {"matmul_tflops": round(matmul_tflops(device, 256 if cpu else 8192, 5 if cpu else 20), 3)}
    if not cpu:
        found["expected_matmul_tflops"] = Expected.from_catalogue(cfg.hardware).matmul_tflops
        found["instance"] = cfg.hardware.instance_type
    health = GpuHealth()
    found["nvml"] = [{spec.name: value for spec, value in gpu} for gpu in health.read()] if health.available else "none"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.tools.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the runs and the planner's predictions, run nothing")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run the same code on the CPU with a tiny model (bf16 and emulated fp8, no compile)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default: bench/gpu/gpu-check-<gpu>-<time>.json; a copy goes to $OUT if set)",
    )
    parser.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS), help="comma list of 1b,3b")
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=None)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 30; 4 with --cpu-smoke)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 4096; 128 with --cpu-smoke)")
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--ac", default="selective", choices=["none", "selective", "full"])
    parser.add_argument(
        "--compile",
        default="both",
        choices=["both", "off", "on"],
        help="eager runs, compiled runs, or both (eager first; default both)",
    )
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip the remaining runs after this many seconds")
    parser.add_argument(
        "--instance", default=None, help="catalogue instance for the BF16 peak (default: from the GPU name)"
    )
    parser.add_argument(
        "--cp-timeout-s",
        type=float,
        default=180.0,
        help="the context-parallel case (first, 2 ranks under torchrun); 0 skips it",
    )
    args = parser.parse_args(argv)
    if args.precisions is None:
        args.precisions = ["bf16", "fp8-tensorwise"] if args.cpu_smoke else list(PRECISIONS)
    args.steps = args.steps or (4 if args.cpu_smoke else 30)
    args.seq = args.seq or (128 if args.cpu_smoke else 4096)
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
            print(
                f"  {case.name:<28} params {pred['parameters'] / 1e9:5.2f}B  flops/token {pred['flops_per_token']:.3e}"
                f"  predicted peak {pred['predicted_allocated_gib']:7.2f} GiB allocated,"
                f" {pred['predicted_reserved_gib']:7.2f} GiB reserved"
            )
        return 0

    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --list for a dry run or --cpu-smoke for the CPU", file=sys.stderr)
        return 2
    os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    env = environment(args.cpu_smoke, args.instance)
    hbm = 2**34 if args.cpu_smoke else torch.cuda.get_device_properties(0).total_memory
    out_path = args.out or ROOT / "bench" / "gpu" / f"gpu-check-{env['gpu_slug']}-{env['stamp']}.json"
    print("gpu_check:", json.dumps({k: v for k, v in env.items() if k != "packages"}), flush=True)
    print("gpu_check: packages:", json.dumps(env["packages"]), flush=True)

    started = time.monotonic()
    document: dict = {"rows": [], "environment": env, "runs": []}
    document["health"] = health_case(
        args.cpu_smoke, run_config(cases(args)[0], steps=1, instance=env["instance"], hbm_bytes=hbm)
    )
    print("gpu_check: health: " + json.dumps(document["health"]), flush=True)
    document["packing"] = packing_case(args.cpu_smoke)
    print(
        "gpu_check: packing: "
        + json.dumps(
            {
                k: document["packing"].get(k)
                for k in ("status", "kernels", "relative_error", "tolerance", "leak", "packed_ms", "causal_ms", "error")
            }
        ),
        flush=True,
    )
    if args.cp_timeout_s > 0 and not args.cpu_smoke:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        document["context_parallel"] = context_parallel_case(out_path.parent, args.cp_timeout_s)
        print(
            "gpu_check: context parallel: "
            + json.dumps(
                {
                    k: document["context_parallel"].get(k)
                    for k in ("status", "reason", "seconds", "attention", "trainer")
                }
            ),
            flush=True,
        )
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = Path(tmp)
        vocab = max(model_dimensions(case)["vocab_size"] for case in cases(args))
        _write_tokens(root / "data", vocab, max(200_000, 2 * args.steps * args.micro_batch * (args.seq + 1)))
        for case in cases(args):
            cfg = run_config(case, steps=args.steps, instance=env["instance"], hbm_bytes=hbm)
            run = {"run": case.name, **asdict(case), **prediction(cfg)}
            if time.monotonic() - started > args.budget_s:
                run["status"] = "skipped"
                run["error"] = f"time budget of {args.budget_s:.0f} s spent"
            else:
                try:
                    run.update(_measure(cfg, root, args.steps))
                except torch.OutOfMemoryError as error:
                    run.update(status="oom", error=str(error).splitlines()[0])
                except Exception as error:  # noqa: BLE001 - record and carry on
                    run.update(status="error", error=f"{type(error).__name__}: {error}"[:500])
                    traceback.print_exc()
                _release()
            document["runs"].append(run)
            if run["status"] == "ok":
                document["rows"].append(calibration_row(case, cfg, run, env))
            print(
                f"gpu_check: {case.name}: "
                + json.dumps(
                    {
                        k: run.get(k)
                        for k in (
                            "status",
                            "tokens_per_second",
                            "mfu_percent",
                            "measured_allocated_gib",
                            "predicted_allocated_gib",
                            "measured_reserved_gib",
                            "predicted_reserved_gib",
                            "error",
                        )
                    }
                ),
                flush=True,
            )
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(document, indent=2))  # partial results survive a kill
    if os.environ.get("OUT") and Path(os.environ["OUT"]).resolve() != out_path.parent.resolve():
        shutil.copy(out_path, Path(os.environ["OUT"]) / out_path.name)  # what comes back from a device machine
    print(_table(document["runs"]))
    print(
        f"gpu_check: wrote {out_path} ({len(document['rows'])} calibration rows) in {time.monotonic() - started:.0f} s"
    )
    return 0 if document["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
