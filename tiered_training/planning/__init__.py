"""Planning: from a Recipe to a Plan (the planner, its memory and performance models, calibration,
segments, quotas and alarm thresholds)."""
