"""A segment that runs out of time before its share of the steps: it hands over, or in the last segment fails
saying how to resume the run."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from support import RECIPES  # noqa: E402

from tiered_training.planning.planner import plan_file  # noqa: E402
from training.trainer import _segment_out_of_time, _tokens_seen  # noqa: E402


def _cfg(segment, segments):
    cfg = plan_file(RECIPES[0]).run_config()
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={
        "id": "run-7", "segment": segment, "segments": segments, "segment_seconds": 3600.0})})


def test_an_early_segment_hands_over_and_the_last_one_fails_with_the_run_to_resume():
    assert _segment_out_of_time(_cfg(1, 2), 40, 40) is None
    with pytest.raises(RuntimeError) as raised:
        _segment_out_of_time(_cfg(2, 2), 90, 90)
    message = str(raised.value)
    assert "segment 2 of 2 of run 'run-7' reached its time limit of 3600 s at step 90" in message
    assert "resume it with RunId=run-7" in message and "--resume run-7" in message


def test_tokens_seen_counts_the_global_batch_and_the_ramp():
    cfg = _cfg(1, 1)
    batch = cfg.batch
    expected = sum(batch.accum_steps_at(s) for s in range(50)) * batch.global_batch_tokens // batch.grad_accum_steps
    assert _tokens_seen(cfg, 50) == expected
    assert _tokens_seen(cfg, 0) == 0
