"""The run's world size against the plan's: see :mod:`tiered_training.world` (the planner, the
launcher and the trainer share one set of rules)."""

from tiered_training.world import (  # noqa: F401
    WorldSizeError,
    accumulation,
    planned_world,
    resume_accumulation,
    supported_instance_counts,
)
