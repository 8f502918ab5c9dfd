"""The rehearsal's per-step losses, read from the trainer's step lines: a skipped attempt does not replace its step's loss."""

from __future__ import annotations

from tiered_training.rehearse.hosts import _losses
from training.step_stats import StepStats


def _line(step: int, loss: float, *, skipped: bool = False) -> tuple[float, str]:
    stats = StepStats(
        step=step,
        loss=loss,
        grad_norm=1.0,
        lr=1e-3,
        tokens=64,
        step_time_s=0.1,
        data_wait_s=0.0,
        tokens_per_second=640.0,
        micro_batch_size=1,
        grad_accum_steps=1,
        skipped=skipped,
    )
    return 0.0, f"2026-12-03 05:00:00,000 training INFO: {stats.log_line()}"


def test_a_skipped_attempt_keeps_the_step_s_real_loss():
    # step 2 trained, then two attempts were skipped (non-finite on some rank), then step 3 trained
    lines = [
        _line(1, 3.25),
        _line(2, 3.125),
        _line(2, float("nan"), skipped=True),
        _line(2, float("inf"), skipped=True),
        _line(3, 3.0),
    ]
    assert _losses(lines) == {1: 3.25, 2: 3.125, 3: 3.0}
