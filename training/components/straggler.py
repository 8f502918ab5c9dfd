"""Per-rank step-phase times and straggler scores: which host and GPU slows the run, and in which phase.

Every rank times the phases of its steps (:class:`training.step_stats.StepStats`: waiting for data, forward and
backward up to the step's one wait for the device, the optimiser step, the blocking part of a checkpoint save).
The step's own time is their sum: the wait in the all-reduce that ends each step, where fast ranks wait for the
slowest, is left out, so a slow rank's time is longer than the others'.

Every ``every`` steps (:data:`GATHER_EVERY_STEPS`) one all-gather of a small tensor (the window's summed phase
times, 5 floats a rank) on a CPU group brings them to every rank. The **score** of a rank is the fastest rank's
time over its own, per phase and for the step: NVIDIA Resiliency Extension's relative performance score
(https://nvidia.github.io/nvidia-resiliency-ext/straggler_det/usage_guide.html). 1 is the fastest rank; 0.8
takes 1.25 times as long. The phase that makes a rank slow is the one where its time exceeds the fastest rank's
the most.

Global rank 0 publishes, at the metrics cadence (``cfg.metrics.interval_seconds``) and over the steps of that
interval, EMF events with the catalogue's names (:data:`tiered_training.contract.metrics.STRAGGLER`): the slowest
rank's score (dimension Recipe; its host, GPU and phase as properties), each host's lowest score (Recipe, Node) and
each rank's (Recipe, Node, Gpu), and one readable line::

    straggler: algo-3 GPU 5: 0.81 of the fastest rank in forward/backward for 12 minutes (step 0.86) | ...

Limits: on a GPU the phases are timed on the host, so forward/backward ends at the step's one copy of the loss to
the host; under FSDP its collectives let a slow GPU's lag reach the ranks that wait for it inside that phase, which
lowers the contrast of the forward/backward score there (the Resiliency Extension times CUDA kernels with CUPTI
for that; this module does not). The optimiser step is timed as launched.

``TIERED_TRAINING_SLOW_HOST="algo-N:FACTOR"`` (rehearsals only, ``rehearse --slow-host``) makes the named host's
forward/backward take 1/FACTOR as long (:func:`slowdown`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from tiered_training.contract import metrics as catalogue
from training.components.metrics import emit_emf, node_name

PHASES = ("data", "forward_backward", "optimizer", "checkpoint")
PHASE_NAMES = {
    "data": "data wait",
    "forward_backward": "forward/backward",
    "optimizer": "optimiser",
    "checkpoint": "checkpoint",
}
GATHER_EVERY_STEPS = catalogue.STRAGGLER_GATHER_EVERY_STEPS
SLOW_SCORE = 0.95  # below it, the line names the rank as a straggler
SLOW_HOST_VARIABLE = "TIERED_TRAINING_SLOW_HOST"
TINY_SECONDS = 1e-6  # a phase this short on a rank scores 1 (nothing to compare)


def phase_times(stats: Any) -> list[float]:
    """A step's phase times, in :data:`PHASES` order, from its StepStats."""
    return [
        float(stats.data_wait_s),
        float(getattr(stats, "forward_backward_s", 0.0)),
        float(getattr(stats, "optimizer_s", 0.0)),
        float(stats.checkpoint_save_s or 0.0),
    ]


def relative_scores(times: Sequence[Sequence[float]]) -> list[list[float]]:
    """For each rank (row) and column: the fastest rank's time over this rank's (1 where this rank's is ~0)."""
    if not times:
        return []
    columns = len(times[0])
    fastest = [min(row[c] for row in times) for c in range(columns)]
    return [[1.0 if row[c] <= TINY_SECONDS else max(0.0, fastest[c]) / row[c] for c in range(columns)] for row in times]


@dataclass(frozen=True)
class RankScore:
    rank: int
    host: str
    gpu: int  # local rank
    step: float  # the score of the step's own time
    phases: dict[str, float]
    slow_phase: str  # where its time exceeds the fastest rank's the most


def score_ranks(times: Sequence[Sequence[float]], hosts: Sequence[str], gpus: Sequence[int]) -> list[RankScore]:
    """Each rank's scores, from its summed phase times (rows in :data:`PHASES` order)."""
    with_step = [list(row) + [sum(row)] for row in times]
    scores = relative_scores(with_step)
    fastest = [min(row[c] for row in times) for c in range(len(PHASES))]
    out = []
    for rank, (row, score) in enumerate(zip(times, scores, strict=True)):
        excess = [row[c] - fastest[c] for c in range(len(PHASES))]
        slow = PHASES[max(range(len(PHASES)), key=lambda c: excess[c])]
        out.append(
            RankScore(rank, hosts[rank], gpus[rank], score[-1], dict(zip(PHASES, score[:-1], strict=True)), slow)
        )
    return out


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} minutes"


def slowdown(environ: Mapping[str, str], host: str) -> float:
    """The speed ``TIERED_TRAINING_SLOW_HOST="algo-N:FACTOR"`` gives this host (1: not slowed)."""
    text = environ.get(SLOW_HOST_VARIABLE, "")
    if not text:
        return 1.0
    name, sep, factor = text.partition(":")
    try:
        value = float(factor) if sep else 0.5
    except ValueError:
        value = -1.0
    if not name or not 0 < value <= 1:
        raise ValueError(f"{SLOW_HOST_VARIABLE}={text!r}: expected HOST[:FACTOR], a factor from more than 0 to 1")
    return value if name == host else 1.0


class TorchGather:
    """All-gathers on a CPU (gloo) group made at the first call, which every rank makes at the same step."""

    def __init__(self) -> None:
        self._group: Any = None

    def _ready(self):
        import torch.distributed as dist

        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return dist

    def floats(self, values: list[float]) -> list[list[float]]:
        import torch

        dist = self._ready()
        local = torch.tensor(values, dtype=torch.float64)
        found = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(found, local, group=self._group)
        return [t.tolist() for t in found]

    def objects(self, value: Any) -> list[Any]:
        dist = self._ready()
        found: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(found, value, group=self._group)
        return found


class StragglerHook:
    """Trainer hook (every rank, after every step): times gathered every ``every`` steps, scores published by global
    rank 0 at the metrics cadence. ``gather``: all-gathers (default :class:`TorchGather`); ``clock``: seconds since
    the epoch; ``stream``: where the EMF and the readable line go (stdout)."""

    def __init__(
        self,
        cfg,
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        node: str | None = None,
        every: int = GATHER_EVERY_STEPS,
        gather: Any = None,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
        self.node = node or node_name()
        self.every = max(1, every)
        self.gather = gather or TorchGather()
        self.stream = stream
        self.clock = clock
        self.interval = float(cfg.metrics.interval_seconds)
        self._calls = 0
        self._window = [0.0] * len(PHASES)
        self._window_steps = 0
        self._who: tuple[list[str], list[int]] | None = None
        self._sums: list[list[float]] | None = None  # rank 0: per rank, the interval's phase times
        self._interval_start = self._last_emit = clock()
        self._slow_since: tuple[int, float] | None = None  # rank 0: (the slow rank, since when)
        self.last: list[RankScore] = []  # rank 0: the last published scores
        self._warned = False

    def __call__(self, stats: Any) -> None:
        self._calls += 1
        if self._calls > 1:  # the process's first step (start-up, compilation) is left out, as in tokens/s
            for index, seconds in enumerate(phase_times(stats)):
                self._window[index] += seconds
            self._window_steps += 1
        final = stats.step >= self.cfg.batch.total_steps and not getattr(stats, "skipped", False)
        if self._calls % self.every and not final:
            return
        if self._who is None:
            who = self.gather.objects((self.node, self.local_rank))
            self._who = ([str(h) for h, _ in who], [int(g) for _, g in who])
        rows = self.gather.floats(self._window + [float(self._window_steps)])
        self._window = [0.0] * len(PHASES)
        self._window_steps = 0
        if self.rank != 0:
            return
        if self._sums is None:
            self._sums = [[0.0] * (len(PHASES) + 1) for _ in rows]
        for total, row in zip(self._sums, rows, strict=True):
            for index, value in enumerate(row):
                total[index] += value
        now = self.clock()
        if final or now - self._last_emit >= self.interval:
            try:
                self._publish(now, int(stats.step))
            except Exception as error:  # metrics never stop a training run
                if not self._warned:
                    print(f"straggler: warning: emission failed, carrying on: {error!r}", file=sys.stderr, flush=True)
                    self._warned = True

    def _publish(self, now: float, step: int) -> None:
        assert self._sums is not None and self._who is not None
        sums, self._sums = self._sums, None
        start, self._interval_start = self._interval_start, now
        self._last_emit = now
        if min(row[-1] for row in sums) <= 0:  # some rank has no timed step in the interval yet
            return
        hosts, gpus = self._who
        ranks = score_ranks([row[:-1] for row in sums], hosts, gpus)
        self.last = ranks
        slowest = min(ranks, key=lambda r: r.step)
        if slowest.step < SLOW_SCORE:
            if self._slow_since is None or self._slow_since[0] != slowest.rank:
                self._slow_since = (slowest.rank, start)
        else:
            self._slow_since = None
        recipe = self.cfg.recipe_name
        namespace = self.cfg.metrics.namespace
        properties = {
            "Step": step,
            "StragglerHost": slowest.host,
            "StragglerGpu": slowest.gpu,
            "StragglerPhase": PHASE_NAMES[slowest.slow_phase],
            "StragglerPhaseScore": round(slowest.phases[slowest.slow_phase], 4),
        }
        emit_emf(
            namespace,
            {"Recipe": recipe},
            [(catalogue.STRAGGLER_SCORE, slowest.step)],
            properties,
            self.stream,
            timestamp=now,
        )
        by_host: dict[str, float] = {}
        for r in ranks:
            by_host[r.host] = min(by_host.get(r.host, 1.0), r.step)
        for host, score in by_host.items():
            emit_emf(
                namespace,
                {"Recipe": recipe, "Node": host},
                [(catalogue.HOST_STRAGGLER_SCORE, score)],
                {"Step": step},
                self.stream,
                timestamp=now,
            )
        for r in ranks:
            phases = {f"{name}Score": round(value, 4) for name, value in r.phases.items()}
            emit_emf(
                namespace,
                {"Recipe": recipe, "Node": r.host, "Gpu": str(r.gpu)},
                [(catalogue.GPU_STRAGGLER_SCORE, r.step)],
                {"Step": step, **phases},
                self.stream,
                timestamp=now,
            )
        out = self.stream or sys.stdout
        out.write(self.describe(now) + "\n")
        out.flush()

    def describe(self, now: float | None = None) -> str:
        """The readable line of the last published scores (rank 0)."""
        if not self.last:
            return "straggler: no scores yet"
        slowest = min(self.last, key=lambda r: r.step)
        hosts: dict[str, float] = {}
        for r in self.last:
            hosts[r.host] = min(hosts.get(r.host, 1.0), r.step)
        per_host = ", ".join(f"{h} {s:.2f}" for h, s in sorted(hosts.items()))
        if slowest.step >= SLOW_SCORE or self._slow_since is None:
            where = f"{slowest.host} GPU {slowest.gpu}"
            return f"straggler: none (slowest {where} at {slowest.step:.2f}; hosts: {per_host})"
        since = (now if now is not None else self.clock()) - self._slow_since[1]
        phase = slowest.slow_phase
        return (
            f"straggler: {slowest.host} GPU {slowest.gpu}: {slowest.phases[phase]:.2f} of the fastest rank in "
            f"{PHASE_NAMES[phase]} for {duration(since)} (step {slowest.step:.2f}; hosts: {per_host})"
        )
