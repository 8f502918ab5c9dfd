"""Probe mode: measure one of the planner's top candidates with the real trainer.

The pipeline's Probe step runs the container with ``TIERED_TRAINING_MODE=probe``. The launcher
(:mod:`training.launcher`) then starts, for each candidate n = 1..``probe.count`` in order, its own
``torchrun ... --module training --probe --candidate n`` (a new process tree, so the allocator starts
clean), and every worker calls :func:`run_probe`. Candidate 1 is the RunConfig's own configuration;
candidate n is ``probe.alternatives[n-2]`` (``RunConfig.with_candidate``). A candidate runs the real trainer
(:func:`training.trainer.run`) for ``probe.steps`` optimiser steps:

- at its own micro-batch, one micro-batch per optimiser step (``grad_accum_steps=1``, no batch ramp), so a
  candidate costs ``steps`` forward/backward passes whatever the plan's global batch; the optimiser step's
  share of the time is slightly larger than in the full run, which makes tokens/s a little conservative;
- the plan's LR schedule; no resume, no checkpoint, no export;
- tokens/s is **per GPU** (the unit of the plan's ``tokens_per_second_per_gpu``), over the steps after
  warm-up: the first step is left out, and the second too when compile is on and there are 4 steps or more;
- peak memory: ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved``, the largest on any rank.
  Without a GPU (a CPU rehearsal or test) both are the workers' peak resident set (``ru_maxrss``), and the
  line says so.

A candidate that runs out of GPU memory is a result (status ``oom``), agreed over the ranks through a gloo
all-reduce. Any other error fails the launch; the launcher records the candidate as failed and goes on.

Rank 0 prints one readable line and, when ``TIERED_TRAINING_PROBE_DIR`` is set (the launcher sets it on every
host; the directory is host 0's), writes the result to ``candidate-N.json`` there. After the last candidate,
the host-0 launcher reads them all and prints :func:`summary_lines`: each candidate's PROBE lines
(``probe_candidate_metrics``), the summary (``PROBE_METRICS``) and one line that says why.

``TIERED_TRAINING_SLOW_CANDIDATE="N:SECONDS"`` (rehearsals only) makes each of candidate N's steps SECONDS
longer, inside the timed step, so its measured tokens/s drops and the choice can be tested.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from tiered_training.contract.metrics import (
    PROBE_BEST_CANDIDATE,
    PROBE_MEMORY,
    PROBE_METRICS,
    PROBE_TOKENS,
    probe_candidate_metrics,
)
from tiered_training.contract.runconfig import RunConfig

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

OK, OOM, FAILED = "ok", "oom", "failed"
PROBE_DIR_VARIABLE = "TIERED_TRAINING_PROBE_DIR"
SLOW_VARIABLE = "TIERED_TRAINING_SLOW_CANDIDATE"


@dataclass(frozen=True)
class CandidateResult:
    candidate: int
    status: str  # ok, oom or failed
    tokens_per_second: float | None = None  # per GPU, after warm-up
    peak_allocated_bytes: int | None = None  # max over ranks
    peak_reserved_bytes: int | None = None
    steps: int = 0
    error: str | None = None
    gpu_memory: bool = True  # the peaks are the GPU allocator's (else the CPU's resident set)
    slowed_s: float = 0.0  # seconds added to each step on purpose (TIERED_TRAINING_SLOW_CANDIDATE)
    pid: int = 0  # rank 0's process: each candidate runs in its own launch

    def allocated_fraction(self, hbm_bytes: int) -> float | None:
        return None if self.peak_allocated_bytes is None else self.peak_allocated_bytes / hbm_bytes

    def reserved_fraction(self, hbm_bytes: int) -> float | None:
        return None if self.peak_reserved_bytes is None else self.peak_reserved_bytes / hbm_bytes

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CandidateResult:
        return cls(**json.loads(text))


def result_file(directory: Path, candidate: int) -> Path:
    return directory / f"candidate-{candidate}.json"


def slow_seconds(environ: Mapping[str, str], candidate: int) -> float:
    """Seconds ``TIERED_TRAINING_SLOW_CANDIDATE="N:SECONDS"`` adds to each of candidate N's steps (0 otherwise)."""
    raw = (environ.get(SLOW_VARIABLE) or "").strip()
    if not raw:
        return 0.0
    number, sep, seconds = raw.partition(":")
    try:
        value = float(seconds)
        if not sep or int(number) < 1 or value < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f'{SLOW_VARIABLE}={raw!r}: expected "CANDIDATE:SECONDS", for example "1:0.5"') from None
    return value if int(number) == candidate else 0.0


def probe_config(cfg: RunConfig, candidate: int, world_size: int = 1) -> RunConfig:
    """The RunConfig that measures ``candidate``: its layout, precision and micro-batch, one micro-batch per
    optimiser step on each of ``world_size`` ranks, no checkpoints. ``total_steps`` (the LR schedule) is the
    plan's; :func:`run_probe` stops after ``probe.steps`` steps."""
    cfg = cfg.with_candidate(candidate)
    micro_batch = cfg.batch.micro_batch_size
    batch = cfg.batch.model_copy(
        update={
            "grad_accum_steps": 1,
            "ramp_start_accum_steps": None,
            "ramp_steps": 0,
            "global_batch_tokens": micro_batch * cfg.batch.sequence_length * world_size,
        }
    )
    checkpoint = cfg.checkpoint.model_copy(update={"interval_minutes": 0.0, "interval_steps": 0})
    return cfg.model_copy(update={"batch": batch, "checkpoint": checkpoint})


def warmup_steps(cfg: RunConfig) -> int:
    """Steps left out of tokens/s: the first, and the second too when compile is on and there are 4 or more."""
    return 2 if cfg.precision.compile and cfg.probe.steps >= 4 else 1


def _is_oom(error: BaseException) -> bool:
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    # Some kernels report allocation failures as RuntimeError text (cuBLAS workspaces, NCCL buffers).
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def steady_tokens_per_second(stats: list, warmup: int) -> float | None:
    """Tokens per second per GPU over the steps after ``warmup`` (all of them when there are no more)."""
    timed = stats[warmup:] if len(stats) > warmup else stats
    seconds = sum(s.step_time_s for s in timed)
    if not timed or seconds <= 0:
        return None
    return sum(s.tokens for s in timed) / seconds / max(1, timed[-1].world_size)


def _agree(oom: bool, peaks: Sequence[int | None]) -> tuple[bool, list[int | None]]:
    """All ranks: an OOM anywhere is an OOM everywhere; each peak is the largest on any rank."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return oom, list(peaks)
    group: ProcessGroup = dist.new_group(backend="gloo")
    flags = torch.tensor([1 if oom else 0, *(-1 if p is None else p for p in peaks)], dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    dist.destroy_process_group(group)
    return bool(flags[0]), [None if value < 0 else int(value) for value in flags[1:].tolist()]


def _resident_peak() -> int:
    """This process's peak resident set in bytes (Linux reports kilobytes): the CPU's peak memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:  # noqa: BLE001
        pass
    return int(os.environ.get("RANK", "0"))


def run_probe(
    cfg: RunConfig,
    paths,
    *,
    candidate: int = 1,
    run_fn: Callable | None = None,
    stream: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> CandidateResult:
    """Measure ``candidate`` with the real trainer; rank 0 prints its line and writes its result file.

    ``run_fn`` replaces :func:`training.trainer.run` in tests (same signature).
    """
    environ = os.environ if environ is None else environ
    run_fn_is_real = run_fn is None
    if run_fn is None:
        from training.trainer import run

        run_fn = run
    out = stream or sys.stdout
    slowed = slow_seconds(environ, candidate)
    measured = probe_config(cfg, candidate, int(environ.get("WORLD_SIZE", "1")))
    collected: list = []
    oom, error = False, None
    try:
        run_fn(
            measured,
            paths,
            hooks=[collected.append],
            max_steps=cfg.probe.steps,
            resume=False,
            save_checkpoints=False,
            export=False,
            step_delay_s=slowed,
        )
    except Exception as exc:  # noqa: BLE001 - only OOM is a result; anything else fails the launch
        if not _is_oom(exc):
            raise
        oom, error = True, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    allocated = [s.peak_memory_bytes for s in collected if s.peak_memory_bytes is not None]
    reserved = [s.peak_reserved_bytes for s in collected if s.peak_reserved_bytes is not None]
    cpu = bool(collected) and not allocated and run_fn_is_real
    if cpu:
        allocated = reserved = [_resident_peak()]
    oom, (peak_allocated, peak_reserved) = _agree(
        oom, [max(allocated) if allocated else None, max(reserved) if reserved else None]
    )
    if oom:
        result = CandidateResult(
            candidate, OOM, steps=len(collected), error=error or "out of memory on another rank", pid=os.getpid()
        )
    else:
        result = CandidateResult(
            candidate,
            OK,
            steady_tokens_per_second(collected, warmup_steps(measured)),
            peak_allocated,
            peak_reserved,
            steps=len(collected),
            gpu_memory=not cpu,
            slowed_s=slowed,
            pid=os.getpid(),
        )
    if _rank() == 0:
        out.write(candidate_line(result, cfg) + "\n")
        out.flush()
        where = environ.get(PROBE_DIR_VARIABLE)
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            path = result_file(Path(where), candidate)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(result.to_json())
            os.replace(tmp, path)
    return result


# -- the choice and the lines the pipeline reads -----------------------------------------------------------------


def candidate_line(result: CandidateResult, cfg: RunConfig) -> str:
    """The readable line of one candidate (not in the PROBE formats, so MetricDefinitions skip it)."""
    hbm = cfg.hardware.hbm_bytes
    parts = [f"probe candidate {result.candidate} ({cfg.candidate_config(result.candidate).describe()}):"]
    parts.append(f"status={result.status}")
    if result.tokens_per_second is not None:
        parts.append(f"tokens/s/gpu={result.tokens_per_second:.1f}")
    allocated, reserved = result.allocated_fraction(hbm), result.reserved_fraction(hbm)
    if allocated is not None and reserved is not None:
        parts.append(f"peak_allocated={allocated:.4f} peak_reserved={reserved:.4f}")
        if not result.gpu_memory:
            parts.append("(resident set, CPU)")
    parts.append(f"steps={result.steps}")
    if result.slowed_s:
        parts.append(f"(slowed on purpose by {SLOW_VARIABLE}: +{result.slowed_s:g} s a step)")
    if result.error:
        parts.append(f"error={result.error}")
    return " ".join(parts)


@dataclass(frozen=True)
class Choice:
    best: CandidateResult | None
    reasons: dict[int, str]  # why each candidate not chosen was not


def choose(results: Sequence[CandidateResult], memory_limit: float, hbm_bytes: int) -> Choice:
    """The fastest measured candidate whose peak reserved memory is at most ``memory_limit`` of the HBM."""
    reasons: dict[int, str] = {}
    fitting = []
    for r in results:
        reserved = r.reserved_fraction(hbm_bytes)
        if r.status == OOM:
            reasons[r.candidate] = "ran out of memory"
        elif r.status != OK:
            reasons[r.candidate] = f"failed: {r.error or 'no result'}"
        elif r.tokens_per_second is None:
            reasons[r.candidate] = "measured no steady step"
        elif reserved is not None and reserved > memory_limit:
            reasons[r.candidate] = f"over the memory limit: reserved {reserved:.0%} > {memory_limit:.0%}"
        else:
            fitting.append(r)
    best = max(fitting, key=lambda r: r.tokens_per_second or 0.0, default=None)
    for r in fitting:
        if r is not best:
            reasons[r.candidate] = "slower"
    return Choice(best, reasons)


def summary_lines(results: Sequence[CandidateResult], cfg: RunConfig) -> list[str]:
    """Each candidate's PROBE lines, the summary PROBE lines (every value the gate reads, always) and the line
    that says why."""
    hbm, limit = cfg.hardware.hbm_bytes, cfg.probe.memory_limit
    lines: list[str] = []
    for r in sorted(results, key=lambda r: r.candidate):
        if r.status == FAILED:
            continue
        formats = {name.rsplit(":", 1)[1]: fmt for name, (fmt, _) in probe_candidate_metrics(r.candidate).items()}
        values: dict[str, float | None]
        if r.status == OOM:
            values = {"tokens_per_second": 0.0, "peak_allocated_fraction": 1.0, "peak_reserved_fraction": 1.0}
        else:
            values = {
                "tokens_per_second": r.tokens_per_second or 0.0,
                "peak_allocated_fraction": r.allocated_fraction(hbm),
                "peak_reserved_fraction": r.reserved_fraction(hbm),
            }
        lines += [formats[field].format(value) for field, value in values.items() if value is not None]
    choice = choose(results, limit, hbm)
    best = choice.best
    if best is not None:
        tokens, fraction, number = best.tokens_per_second or 0.0, best.reserved_fraction(hbm), best.candidate
    else:
        measured = [f for r in results if r.status == OK and (f := r.reserved_fraction(hbm)) is not None]
        tokens, fraction, number = 0.0, min(measured, default=1.0), 0
    lines.append(PROBE_METRICS[PROBE_TOKENS][0].format(tokens))
    if fraction is not None:  # None only for a stand-in trainer that reports no memory
        lines.append(PROBE_METRICS[PROBE_MEMORY][0].format(fraction))
    lines.append(PROBE_METRICS[PROBE_BEST_CANDIDATE][0].format(number))
    lines.append(reason_line(results, choice, cfg))
    return lines


def reason_line(results: Sequence[CandidateResult], choice: Choice, cfg: RunConfig) -> str:
    """``probe: chose candidate 2 (...): 9,870 tokens/s per GPU measured; candidate 1 (predicted 10,634):
    7,020, slower; reserved 61% <= 85%``, or why none was chosen."""
    hbm, limit = cfg.hardware.hbm_bytes, cfg.probe.memory_limit

    ranges = cfg.probe.predicted

    def predicted(number: int, measured: float | None = None) -> str:
        """`` (predicted 10,634)``, or with the model's range: `` (predicted 10,634, range 8,900-12,100:
        surprising)`` when the measurement lies outside it."""
        if number <= len(ranges):
            value, low, high = ranges[number - 1]
            if measured is None:
                return f" (predicted {value:,.0f}, range {low:,.0f}-{high:,.0f})"
            verdict = "within the model's error" if low <= measured <= high else "surprising"
            return f" (predicted {value:,.0f}, range {low:,.0f}-{high:,.0f}: {verdict})"
        value = cfg.metrics.plan_tokens_per_second_per_gpu if number == 1 else 0.0
        return f" (predicted {value:,.0f})" if value > 0 else ""

    def slowed(r: CandidateResult) -> str:
        return f" (slowed on purpose by {SLOW_VARIABLE})" if r.slowed_s else ""

    others = []
    for r in sorted(results, key=lambda r: r.candidate):
        if choice.best is not None and r.candidate == choice.best.candidate:
            continue
        ok = r.status == OK and r.tokens_per_second is not None
        measured = f": {r.tokens_per_second:,.0f}" if ok else ""
        reason = choice.reasons[r.candidate]
        said = predicted(r.candidate, r.tokens_per_second if ok else None)
        others.append(f"candidate {r.candidate}{said}{measured}{slowed(r)}, {reason}")
    best = choice.best
    if best is None:
        return "probe: no candidate fits: " + "; ".join(others)
    reserved = best.reserved_fraction(hbm)
    memory = "" if reserved is None else f"; reserved {reserved:.0%} <= {limit:.0%}"
    head = (
        f"probe: chose candidate {best.candidate} ({cfg.candidate_config(best.candidate).describe()}): "
        f"{best.tokens_per_second or 0.0:,.0f} tokens/s per GPU measured"
        f"{predicted(best.candidate, best.tokens_per_second)}{slowed(best)}"
    )
    return head + memory + "".join(f"; {o}" for o in others)


def read_results(directory: Path, count: int, failed: Mapping[int, str]) -> list[CandidateResult]:
    """Every candidate's result: its file, else failed with the launch's reason."""
    results = []
    for number in range(1, count + 1):
        path = result_file(directory, number)
        try:
            found: CandidateResult | None = CandidateResult.from_json(path.read_text())
        except (OSError, ValueError, TypeError):
            found = None
        if found is None or number in failed:
            reason = failed.get(number) or "the launch wrote no result"
            found = CandidateResult(number, FAILED, error=reason)
        results.append(found)
    return results
