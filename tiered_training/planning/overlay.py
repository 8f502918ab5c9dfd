"""An account's own calibration: a few efficiency factors on top of the shipped performance model.

The shipped model (``catalog/performance.yaml``, fitted by ``make calibrate`` on published runs) predicts
tokens/s per GPU for any configuration. An account's own runs (the probes' and full runs' steady-state
measurements) say how far that model is from this account's machines: per instance type and precision, the
factor is the geometric mean of measured over predicted tokens/s. Plans then multiply their throughput
by it and say "calibrated with N runs of this account".

An overlay is refused, with the reason, when a factor is outside ``BOUNDS`` (a measurement that far from the
model is a broken run or a wrong configuration, not an efficiency), or when leaving each run out and
predicting it from the others is not better than the shipped model alone (the factors would not generalise).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Measured over predicted tokens/s that a factor may take: outside, a run is broken, not slow or fast.
BOUNDS = (0.5, 1.5)
VERSION = 1


@dataclass(frozen=True)
class Measurement:
    """One run's steady-state throughput against the shipped model's prediction for its configuration."""

    run: str  # a run id or training job name
    instance_type: str
    precision: str
    measured: float  # tokens/s per GPU
    predicted: float  # tokens/s per GPU, the shipped model
    kind: str = "run"  # "probe" or "run"

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted


def _key(instance_type: str, precision: str) -> str:
    return f"{instance_type}/{precision}"


def _factors(measurements: Sequence[Measurement]) -> dict[str, float]:
    """Per instance type and precision: the geometric mean of measured over predicted."""
    import statistics  # only when measurements are folded in, not on every plan

    groups: dict[str, list[float]] = {}
    for m in measurements:
        groups.setdefault(_key(m.instance_type, m.precision), []).append(math.log(m.ratio))
    return {key: math.exp(statistics.fmean(logs)) for key, logs in groups.items()}


@dataclass(frozen=True)
class Overlay:
    """The fitted factors (``instance/precision`` -> measured over predicted) and what they rest on."""

    factors: dict[str, float]
    runs: dict[str, int]  # measurements behind each factor
    leave_one_out: dict[str, float | None] = field(default_factory=dict)  # median and worst error, with and without
    version: int = VERSION

    @property
    def count(self) -> int:
        return sum(self.runs.values())

    def factor(self, instance_type: str, precision: str) -> tuple[float, int]:
        """The factor for a plan on ``instance_type`` in ``precision``, and how many runs it rests on (0: none)."""
        key = _key(instance_type, precision)
        return self.factors.get(key, 1.0), self.runs.get(key, 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Overlay:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a calibration overlay of version {VERSION}")
        factors = {str(k): float(v) for k, v in data["factors"].items()}
        bad = [k for k, v in factors.items() if not BOUNDS[0] <= v <= BOUNDS[1]]
        if bad:
            raise ValueError(f"overlay factors outside {BOUNDS[0]}-{BOUNDS[1]}: {', '.join(bad)}")
        return cls(factors, {str(k): int(v) for k, v in data["runs"].items()}, dict(data.get("leave_one_out", {})))


class OverlayRefused(ValueError):
    """An overlay that the measurements do not support; the message says why."""


def _errors(measurements: Sequence[Measurement]) -> tuple[list[float], list[float]]:
    """Leave each run out: its error with the factor fitted on the others of its group (the shipped model where
    it is the only one), and with the shipped model alone."""
    overlay, shipped = [], []
    for i, held in enumerate(measurements):
        others = [m for j, m in enumerate(measurements) if j != i]
        factor = _factors(others).get(_key(held.instance_type, held.precision), 1.0)
        overlay.append(abs(held.predicted * factor / held.measured - 1))
        shipped.append(abs(held.predicted / held.measured - 1))
    return overlay, shipped


def fit(measurements: Sequence[Measurement]) -> Overlay:
    """The overlay of these measurements, or :class:`OverlayRefused` with the reason."""
    if not measurements:
        raise OverlayRefused("no measured runs: nothing to calibrate")
    factors = _factors(measurements)
    out = sorted(f"{k} {v:.2f}" for k, v in factors.items() if not BOUNDS[0] <= v <= BOUNDS[1])
    if out:
        raise OverlayRefused(
            f"measured over predicted tokens/s outside {BOUNDS[0]}-{BOUNDS[1]} ({', '.join(out)}): "
            "a run that far from the model is broken or misconfigured; check its logs"
        )
    import statistics

    with_overlay, shipped = _errors(measurements)
    errors = {
        "median": statistics.median(with_overlay),
        "worst": max(with_overlay),
        "shipped_median": statistics.median(shipped),
        "shipped_worst": max(shipped),
    }
    if len(measurements) > 1 and errors["median"] > errors["shipped_median"]:
        raise OverlayRefused(
            f"leaving each run out, the overlay predicts them worse than the shipped model (median error "
            f"{errors['median']:.1%} against {errors['shipped_median']:.1%}): the runs disagree with each other"
        )
    runs: dict[str, int] = {}
    for m in measurements:
        runs[_key(m.instance_type, m.precision)] = runs.get(_key(m.instance_type, m.precision), 0) + 1
    return Overlay({k: round(v, 4) for k, v in factors.items()}, runs, {k: round(v, 4) for k, v in errors.items()})


def report(overlay: Overlay) -> str:
    """The overlay's factors and its leave-one-run-out error, against the shipped model's."""
    lines = [f"calibrated with {overlay.count} runs of this account"]
    for key in sorted(overlay.factors):
        lines.append(f"  {key:<34} x{overlay.factors[key]:.3f}  ({overlay.runs[key]} runs)")
    e = overlay.leave_one_out
    if e:
        lines.append(
            f"  leave-one-run-out error: median {e['median']:.1%}, worst {e['worst']:.1%} "
            f"(shipped model: median {e['shipped_median']:.1%}, worst {e['shipped_worst']:.1%})"
        )
    return "\n".join(lines)


LEGACY_STORE_KEY = "calibration/overlay.json"  # one overlay for the account, before 0.x: no longer read


def store_key(recipe: str) -> str:
    """The recipe's overlay in its checkpoint store: ``calibration/<recipe>/overlay.json`` (only the recipe's
    operators may write it: CheckpointStore.grant_runs_read)."""
    return f"calibration/{recipe}/overlay.json"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiered-training"


def cache_path(recipe: str) -> Path:
    """The local copy of the recipe's overlay: ``$XDG_CACHE_HOME/tiered-training/calibration/<recipe>/overlay.json``."""
    return _cache_root() / "calibration" / recipe / "overlay.json"


def cached(recipe: str, path: Path | None = None) -> Overlay | None:
    """The recipe's cached overlay, or None when there is none (or it is unreadable: plans then use the shipped
    model)."""
    path = path or cache_path(recipe)
    try:
        return Overlay.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def legacy_notice(recipes: Sequence[str]) -> str | None:
    """What to do when the account-wide overlay of earlier versions is cached and some recipe has no overlay of
    its own: that file is no longer read."""
    legacy = _cache_root() / "overlay.json"
    missing = [r for r in recipes if not cache_path(r).exists()]
    if not legacy.exists() or not missing:
        return None
    return (
        f"{legacy} (one overlay for every recipe) is no longer read: each recipe has its own overlay, "
        f"s3://<store>/calibration/<recipe>/overlay.json. Run `tiered-training calibrate {' '.join(missing)} "
        "--from-runs` to write theirs, then delete the old file."
    )
