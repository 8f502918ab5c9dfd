"""Which probe candidate a training job runs (``run.candidate``), without torch.

The probe measures the planner's top candidates (candidate 1: the RunConfig's own configuration, n:
``probe.alternatives[n-2]``) and the Train step sets ``run.candidate`` to the one it chose. A job with
``run.candidate`` 0 trains the candidate its run's newest committed checkpoint records (the trainer writes
``candidate`` into every manifest), else candidate 1. The launcher and the trainer both apply it once, before
anything reads the layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiered_training.contract.runconfig import RunConfig


def newest_manifest(cfg: RunConfig, checkpoint_dir: Path | None) -> dict[str, Any] | None:
    """The manifest of the checkpoint a resume would load (committed, of this run, files present), or None."""
    if checkpoint_dir is None or not checkpoint_dir.is_dir() or not any(checkpoint_dir.glob("step-*")):
        return None
    from training.components.checkpoint_files import find_resumable, read_manifest, step_dir
    from training.components.identity import same_run

    accept = same_run({"run_id": cfg.run.id}) if cfg.run.id else None
    step, _ = find_resumable(checkpoint_dir, checksums=False, metadata=False, accept=accept)
    if step is None:
        return None
    return read_manifest(step_dir(checkpoint_dir, step)) or {}


def recorded(manifest: dict[str, Any] | None) -> int | None:
    """The candidate a checkpoint manifest records, or None (none recorded: written before candidates)."""
    number = (manifest or {}).get("candidate")
    return number if isinstance(number, int) and not isinstance(number, bool) and number >= 1 else None


def apply(cfg: RunConfig, checkpoint_dir: Path | None) -> tuple[RunConfig, str]:
    """``cfg`` running its candidate, and the line that says which: ``run.candidate`` when set, else the one the
    newest checkpoint records, else 1. A checkpoint of a candidate beyond this RunConfig's count is an error."""
    saved = recorded(newest_manifest(cfg, checkpoint_dir))
    count = cfg.probe.count
    if cfg.run.candidate > 0:
        number, why = cfg.run.candidate, "run.candidate"
        if saved is not None and saved != number:
            why += f"; differs from candidate {saved} of the checkpoint it resumes (resharded)"
    elif saved is not None:
        if saved > count:
            raise ValueError(
                f"the checkpoint to resume records probe candidate {saved}, but this RunConfig has {count}; "
                "set run.candidate to the one to train"
            )
        number, why = saved, "recorded in the checkpoint it resumes"
    else:
        number, why = 1, "the plan's own configuration"
    line = f"training candidate {number} of {count} ({cfg.candidate_config(number).describe()}): {why}"
    return cfg.with_candidate(number), line
