"""How far a prediction may be off: the leave-one-source-out errors of ``make calibrate`` by kind of run.

``make calibrate`` predicts each source's rows with the model refitted without that source, and groups the
held-out errors (``predicted / measured - 1``) by kind of run: the GPU generation, the precision, compiled or
eager, the sequence length and the adapter. ``performance.yaml`` stores, for each group, its rows, the median
and worst absolute error and the range of signed errors (``low``, ``high``: the lowest and highest, or the 10th
and 90th percentiles where the group has at least ``PERCENTILE_ROWS`` rows).

A plan's kind of run matches one group per dimension; its range is the widest of those groups' ranges (the
model is as unsure as its least sure kind). A dimension with no group for the plan's value (LoRA: no published
adapter run is in the calibration) adds nothing, and the range says so. Measured throughput lies within
``predicted / (1 + high)`` and ``predicted / (1 + low)``.
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


def range_for(kind: Mapping[str, str], table: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Range | None:
    """The widest range of the groups ``kind`` belongs to (``table``: performance.yaml's ``loso_by_kind``);
    None where the table is empty."""
    low = high = 0.0
    used: list[str] = []
    missing: list[str] = []
    widest_low = widest_high = ""
    for dimension in DIMENSIONS:
        group = table.get(dimension, {}).get(kind[dimension])
        if group is None:
            missing.append(f"{dimension} {kind[dimension]}")
            continue
        used.append(f"{kind[dimension]} ({group['rows']} runs)")
        if group["low"] < low:
            low, widest_low = group["low"], kind[dimension]
        if group["high"] > high:
            high, widest_high = group["high"], kind[dimension]
    if not used:
        return None
    basis = f"held-out errors of {', '.join(used)}: the widest, {low:+.0%} (of {widest_low or '-'}) to "
    basis += f"{high:+.0%} (of {widest_high or '-'})"
    if missing:
        basis += f"; no calibration runs of {', '.join(missing)}"
    return Range(low=low, high=high, basis=basis)
