"""Probe mode: measure real throughput and memory at each micro-batch candidate.

The pipeline's Probe step runs the container with ``TIERED_TRAINING_MODE=probe``
(see :mod:`training.launcher`); every worker then runs ``python -m training --probe``,
which calls :func:`run_probe`. For each ``cfg.probe.micro_batch_candidates`` value,
smallest first, it runs the real trainer (:func:`training.trainer.run`) for
``cfg.probe.steps`` optimiser steps:

- one micro-batch per optimiser step (``grad_accum_steps=1``, no batch ramp), so a
  candidate costs ``steps`` forward/backward passes whatever the plan's global batch;
  the optimiser step's share of the time is therefore slightly larger than in the
  full run, which makes the probe's tokens/s a little conservative;
- the plan's LR schedule (the probe runs its first ``probe.steps`` steps);
- no resume, no checkpoint, no export: ``/opt/ml/checkpoints`` and the model
  directory are left alone;
- tokens/s is **per GPU** (the global tokens/s over the world size: the unit of the plan's
  ``tokens_per_second_per_gpu``, which the pipeline's gate compares it with), measured over
  the steps after the first (warm-up, compile);
  peak memory is the largest ``torch.cuda.max_memory_allocated`` on any rank,
  as a fraction of ``cfg.hardware.hbm_bytes``.

A candidate that runs out of GPU memory (``torch.OutOfMemoryError``) is recorded as
``oom`` and ends the sweep: a larger one cannot fit. The ranks agree on the outcome
through a gloo all-reduce after every candidate. (An OOM on only some ranks while
the others wait inside an NCCL collective is not recoverable here; the NCCL timeout
then fails the job, and the pipeline's gate treats a failed probe as a failed gate.)

Output (rank 0), one readable line per candidate and then exactly one line per
metric in the formats of ``tiered_training.contract.metrics.PROBE_METRICS``, which the Probe
step's MetricDefinitions parse::

    probe candidate: micro_batch=2 status=ok tokens/s/gpu=1234.5 peak_memory=0.4123 steps=5
    PROBE tokens_per_second=1234.50
    PROBE peak_memory_fraction=0.4123
    PROBE best_micro_batch=2

The best micro-batch is the fitting candidate with the highest tokens/s. Every value the
pipeline's Gate reads is always printed:

- **Nothing fits** (every candidate ran out of memory): ``best_micro_batch=0``,
  ``tokens_per_second=0.00`` and ``peak_memory_fraction=1.0000`` (each candidate needed at
  least all of the memory), so the Gate fails on memory, and its FailMemory step says that
  no micro-batch fits.
- **No GPU** (a CPU rehearsal or test): peak memory is the workers' peak resident set
  (``getrusage``'s ``ru_maxrss``, the largest on any rank), as a fraction of
  ``hardware.hbm_bytes``; the candidate line says so (``(resident set, CPU)``).
"""

from __future__ import annotations

import gc
import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from tiered_training.contract.metrics import PROBE_METRICS
from tiered_training.contract.runconfig import RunConfig

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

OK, OOM = "ok", "oom"


@dataclass(frozen=True)
class CandidateResult:
    micro_batch_size: int
    status: str  # "ok" or "oom"
    tokens_per_second: float | None = None  # per GPU (the plan's unit, which the gate compares), steady state
    peak_memory_bytes: int | None = None  # max over ranks; None without a GPU
    steps: int = 0
    error: str | None = None
    gpu_memory: bool = True  # peak_memory_bytes is the GPU allocator's peak (else the CPU's resident set)

    def fraction(self, hbm_bytes: int) -> float | None:
        return None if self.peak_memory_bytes is None else self.peak_memory_bytes / hbm_bytes


@dataclass
class ProbeReport:
    candidates: list[CandidateResult] = field(default_factory=list)
    hbm_bytes: int = 0

    @property
    def best(self) -> CandidateResult | None:
        fitting = [c for c in self.candidates if c.status == OK and c.tokens_per_second is not None]
        return max(fitting, key=lambda c: c.tokens_per_second or 0.0, default=None)  # (never None here)

    def probe_lines(self) -> list[str]:
        """The lines the pipeline's MetricDefinitions parse, in PROBE_METRICS' exact formats: all of them, always."""
        best = self.best
        lines = [PROBE_METRICS["probe:tokens_per_second"][0].format(best.tokens_per_second if best else 0.0)]
        # Nothing fits: every candidate needed at least all of the memory.
        fraction = best.fraction(self.hbm_bytes) if best else 1.0
        if fraction is not None:  # None only for a stand-in trainer that reports no memory
            lines.append(PROBE_METRICS["probe:peak_memory_fraction"][0].format(fraction))
        lines.append(PROBE_METRICS["probe:best_micro_batch"][0].format(best.micro_batch_size if best else 0))
        return lines


def candidate_config(cfg: RunConfig, micro_batch_size: int, world_size: int = 1) -> RunConfig:
    """The RunConfig of one probe candidate: this micro-batch, one micro-batch per optimiser step
    on each of ``world_size`` ranks.

    ``total_steps`` (and so the LR schedule) is the plan's; :func:`run_probe` stops after
    ``probe.steps`` steps with ``max_steps``.
    """
    batch = cfg.batch.model_copy(
        update={
            "micro_batch_size": micro_batch_size,
            "grad_accum_steps": 1,
            "ramp_start_accum_steps": None,
            "ramp_steps": 0,
            "global_batch_tokens": micro_batch_size * cfg.batch.sequence_length * world_size,
        }
    )
    checkpoint = cfg.checkpoint.model_copy(update={"interval_minutes": 0.0, "interval_steps": 0})
    return cfg.model_copy(update={"batch": batch, "checkpoint": checkpoint})


def _is_oom(error: BaseException) -> bool:
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    # Some kernels report allocation failures as RuntimeError text (cuBLAS workspaces, NCCL buffers).
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _steady_tokens_per_second(stats: list) -> float | None:
    """Tokens per second per GPU after the first step (which warms up the allocator and compiles)."""
    timed = stats[1:] if len(stats) > 1 else stats
    seconds = sum(s.step_time_s for s in timed)
    if not timed or seconds <= 0:
        return None
    return sum(s.tokens for s in timed) / seconds / max(1, timed[-1].world_size)


_agree_group: ProcessGroup | None = None  # _agree's gloo group, made at its first collective call


def _agree(oom: bool, peak: int | None) -> tuple[bool, int | None]:
    """All ranks: an OOM anywhere is an OOM everywhere; peak memory is the largest on any rank."""
    global _agree_group
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return oom, peak
    group = _agree_group = _agree_group or dist.new_group(backend="gloo")
    flags = torch.tensor([1 if oom else 0, -1 if peak is None else peak], dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return bool(flags[0]), None if flags[1] < 0 else int(flags[1])


def _resident_peak() -> int:
    """This process's peak resident set in bytes (Linux reports kilobytes): the CPU's peak memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _release_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    except Exception:  # noqa: BLE001 - best effort between candidates
        pass


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:  # noqa: BLE001
        pass
    import os

    return int(os.environ.get("RANK", "0"))


def run_probe(cfg: RunConfig, paths, *, run_fn: Callable | None = None, stream: IO[str] | None = None) -> ProbeReport:
    """Sweep ``cfg.probe.micro_batch_candidates`` with the real trainer; print the PROBE lines on rank 0.

    ``run_fn`` replaces :func:`training.trainer.run` in tests (same signature).
    """
    run_fn_is_real = run_fn is None
    if run_fn is None:
        from training.trainer import run

        run_fn = run
    out = stream or sys.stdout
    report = ProbeReport(hbm_bytes=cfg.hardware.hbm_bytes)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    for micro_batch in sorted(set(cfg.probe.micro_batch_candidates)):
        collected: list = []
        oom, error = False, None
        try:
            run_fn(
                candidate_config(cfg, micro_batch, world_size),
                paths,
                hooks=[collected.append],
                max_steps=cfg.probe.steps,
                resume=False,
                save_checkpoints=False,
                export=False,
            )
        except Exception as exc:  # noqa: BLE001 - only OOM is a result; anything else is re-raised
            if not _is_oom(exc):
                raise
            oom, error = True, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        peaks = [s.peak_memory_bytes for s in collected if s.peak_memory_bytes is not None]
        cpu = bool(collected) and not peaks and run_fn_is_real
        oom, peak = _agree(oom, max(peaks) if peaks else (_resident_peak() if cpu else None))
        if oom:
            result = CandidateResult(
                micro_batch, OOM, steps=len(collected), error=error or "out of memory on another rank"
            )
        else:
            result = CandidateResult(
                micro_batch,
                OK,
                _steady_tokens_per_second(collected),
                peak,
                steps=len(collected),
                gpu_memory=bool(peaks),
            )
        report.candidates.append(result)
        if _rank() == 0:
            _print_candidate(result, report.hbm_bytes, out)
        collected.clear()
        _release_memory()
        if oom:
            break  # a larger micro-batch cannot fit either
    if _rank() == 0:
        for line in report.probe_lines():
            out.write(line + "\n")
        out.flush()
    return report


def _print_candidate(result: CandidateResult, hbm_bytes: int, out: IO[str]) -> None:
    # Deliberately not in the PROBE format, so the MetricDefinitions see only the final summary.
    parts = [f"probe candidate: micro_batch={result.micro_batch_size}", f"status={result.status}"]
    if result.tokens_per_second is not None:
        parts.append(f"tokens/s/gpu={result.tokens_per_second:.1f}")
    fraction = result.fraction(hbm_bytes)
    if fraction is not None:
        parts.append(f"peak_memory={fraction:.4f}" + ("" if result.gpu_memory else " (resident set, CPU)"))
    parts.append(f"steps={result.steps}")
    if result.error:
        parts.append(f"error={result.error}")
    out.write(" ".join(parts) + "\n")
    out.flush()
