"""How far a prediction may be off: the leave-one-source-out errors of ``make calibrate`` by kind of run.

``make calibrate`` predicts each source's rows with the model refitted without that source, and groups the
held-out errors (``predicted / measured - 1``) by kind of run: the GPU generation, the precision, compiled or
eager, the sequence length and the adapter. ``performance.yaml`` stores, for each group, its rows, the median
and worst absolute error and the range of signed errors (``low``, ``high``: the lowest and highest, or the 10th
and 90th percentiles where the group has at least ``PERCENTILE_ROWS`` rows).

A plan's range is the band of the held-out runs of its kind: those that match it on every dimension, or, where
fewer than ``MIN_RUNS`` do, on fewer dimensions (the adapter first: no adapter run is in the calibration, and the
range says so). Measured throughput lies within ``predicted / (1 + high)`` and ``predicted / (1 + low)``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The dimensions of a kind of run, in the order they are reported.
DIMENSIONS = ("generation", "precision", "compile", "sequence", "adapter")
# A group of at least this many rows gives its 10th and 90th percentiles as its range; a smaller one its extremes.
PERCENTILE_ROWS = 10
# Sequence-length bands (tokens): up to 8K, up to 32K, longer.
SEQUENCE_BANDS = ((8192, "up to 8K"), (32768, "8K-32K"))
LONG_SEQUENCES = "over 32K"


def generation(gpu: str) -> str:
    """The GPU generation of a catalogue GPU name (``A100-40GB``, ``H100``, ``H200``, ``B200``, ...)."""
    if gpu.startswith("A100"):
        return "Ampere"
    if gpu.startswith(("H100", "H200", "GH200")):
        return "Hopper"
    if gpu.startswith(("B200", "B300", "GB200", "GB300")):
        return "Blackwell"
    return gpu


def sequence_band(sequence_length: int) -> str:
    for limit, name in SEQUENCE_BANDS:
        if sequence_length <= limit:
            return name
    return LONG_SEQUENCES


def kind_of_run(gpu: str, precision: str, compile: bool, sequence_length: int, adapter: str = "none") -> dict[str, str]:
    """The groups a run belongs to, one per dimension."""
    return {
        "generation": generation(gpu),
        "precision": precision,
        "compile": "compiled" if compile else "eager",
        "sequence": sequence_band(sequence_length),
        "adapter": adapter,
    }


@dataclass(frozen=True)
class Band:
    """The held-out errors of one group of rows."""

    rows: int
    median: float  # absolute
    worst: float  # absolute
    low: float  # signed: the most the model under-predicts (negative)
    high: float  # signed: the most it over-predicts

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "median": self.median, "worst": self.worst, "low": self.low, "high": self.high}


def band(errors: Iterable[float]) -> Band | None:
    """A group's band from its signed errors; None for no rows."""
    values = sorted(errors)
    if not values:
        return None
    absolute = [abs(e) for e in values]
    if len(values) >= PERCENTILE_ROWS:
        low, high = _percentile(values, 0.1), _percentile(values, 0.9)
    else:
        low, high = values[0], values[-1]
    return Band(
        rows=len(values),
        median=round(statistics.median(absolute), 4),
        worst=round(max(absolute), 4),
        low=round(min(low, 0.0), 4),
        high=round(max(high, 0.0), 4),
    )


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks of sorted ``values``."""
    position = q * (len(values) - 1)
    below = int(position)
    above = min(below + 1, len(values) - 1)
    return values[below] + (values[above] - values[below]) * (position - below)


def bands_by_kind(runs: Iterable[tuple[Mapping[str, str], float]]) -> dict[str, dict[str, Band]]:
    """``{dimension: {value: Band}}`` of ``(kind of run, signed error)`` pairs."""
    grouped: dict[str, dict[str, list[float]]] = {d: {} for d in DIMENSIONS}
    for kind, error in runs:
        for dimension in DIMENSIONS:
            grouped[dimension].setdefault(kind[dimension], []).append(error)
    out: dict[str, dict[str, Band]] = {}
    for dimension, groups in grouped.items():
        out[dimension] = {}
        for value, errors in sorted(groups.items()):
            found = band(errors)
            if found is not None:
                out[dimension][value] = found
    return out


@dataclass(frozen=True)
class Range:
    """A prediction's range of held-out errors, and the groups it comes from."""

    low: float  # signed error, <= 0
    high: float  # signed error, >= 0
    basis: str  # which kinds of run set it, and which the calibration has no runs of

    def measured(self, predicted: float) -> tuple[float, float]:
        """Where the measured value of a ``predicted`` throughput may lie: ``predicted / (1 + error)``."""
        return predicted / (1 + self.high), predicted / (1 + self.low)

    def contains(self, predicted: float, measured: float) -> bool:
        lo, hi = self.measured(predicted)
        return lo <= measured <= hi


# A range needs at least this many held-out runs of the plan's kind; with fewer, the least telling dimension
# is dropped (in this order) until enough runs match.
MIN_RUNS = 5
DROP_ORDER = ("adapter", "sequence", "compile", "precision", "generation")


def range_for(kind: Mapping[str, str], runs: Iterable[Mapping[str, Any]]) -> Range | None:
    """The band of the held-out runs (``performance.yaml``'s ``loso_runs``: each a kind of run and its ``error``)
    of ``kind``: those that match it on every dimension, or, with fewer than ``MIN_RUNS``, on every dimension but
    the first ones of ``DROP_ORDER``. None where the calibration has no runs. Remembered per kind for the same
    runs (a search asks it for hundreds of settings of a few kinds)."""
    key = tuple(sorted(kind.items()))
    cached = _RANGES.get(key)
    if cached is not None and cached[0] is runs:
        return cached[1]
    found = _range_for(kind, list(runs))
    _RANGES[key] = (runs, found)
    return found


_RANGES: dict[tuple[tuple[str, str], ...], tuple[object, Range | None]] = {}


def _range_for(kind: Mapping[str, str], runs: list[Mapping[str, Any]]) -> Range | None:
    kept = list(DIMENSIONS)
    dropped: list[str] = []
    while True:
        matching = [r["error"] for r in runs if all(r.get(d) == kind[d] for d in kept)]
        if len(matching) >= MIN_RUNS or not kept:
            break
        name = next(d for d in DROP_ORDER if d in kept)
        kept.remove(name)
        dropped.append(name)
    found = band(matching)
    if found is None:
        return None
    described = ", ".join(kind[d] for d in kept) or "every kind"
    basis = f"held-out errors of {found.rows} calibration runs ({described}): {found.low:+.0%} to {found.high:+.0%}"
    unmatched = [f"{d} {kind[d]}" for d in dropped if not any(r.get(d) == kind[d] for r in runs)]
    if unmatched:
        basis += f"; none of {', '.join(unmatched)}"
    widened = [f"{d} {kind[d]}" for d in dropped if any(r.get(d) == kind[d] for r in runs)]
    if widened:
        basis += f"; too few that also match {', '.join(widened)}"
    return Range(low=found.low, high=found.high, basis=basis)
