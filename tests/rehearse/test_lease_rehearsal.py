"""One execution per run, in one rehearsal of the llama3-1b-bf16 template on 2 simulated hosts (one moto server):

1. a new run trained to step 4;
2. and 3. two resumes of that run started at the same moment (MaxSteps 6 and 8): the first launcher to take the run's
   lease trains, the other execution is refused before torchrun starts, its FailureReason naming the holder;
4. the run resumed again once the winner has ended: its lease was released, so it starts at once and continues from
   the winner's last step.

About 3 minutes on 2 busy CPUs: four training jobs of 2 hosts each, two of them at once.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moto")

from tiered_training.rehearse.run import Options, Then, rehearse  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
INTERVAL = 2  # a checkpoint every 2 steps


def _recipe(root: Path) -> Path:
    from tiered_training.planning.planner import plan_file

    text = (REPO / "recipes/llama3-1b-bf16.yaml").read_text()
    assert "interval_minutes: 30" in text
    path = root / "llama3-1b-bf16.yaml"
    path.write_text(text)
    step_seconds = plan_file(path).estimates.step_time_seconds
    path.write_text(text.replace("interval_minutes: 30", f"interval_minutes: {INTERVAL * step_seconds / 60:.4f}"))
    assert plan_file(path).segments == 1
    return path


@pytest.fixture(scope="module")
def leased(tmp_path_factory):
    root = tmp_path_factory.mktemp("lease")
    out = io.StringIO()
    result = rehearse(
        Options(
            _recipe(root),
            hosts=2,
            workers=1,
            steps=STEPS,
            params={"SkipProbe": "true"},
            workdir=root / "work",
            then=[
                Then({"MaxSteps": "6"}, resume=True),
                Then({"MaxSteps": "8"}, resume=True, alongside=True),
                Then({"MaxSteps": "10"}, resume=True),
            ],
        ),
        out,
    )
    (root / "rehearsal.log").write_text(out.getvalue())
    return result, out.getvalue()


def test_two_resumes_at_once_one_trains_and_the_other_is_refused_naming_the_holder(leased):
    result, log = leased
    first, six, eight, _after = result.executions
    assert first.status == "Succeeded", log[-4000:]
    assert sorted([six.status, eight.status]) == ["Failed", "Succeeded"], log[-6000:]
    winner, loser = (six, eight) if six.status == "Succeeded" else (eight, six)
    (trained,) = winner.jobs["Resume"]
    assert trained.detail["resumed_from"] == STEPS
    end = 6 if winner is six else 8
    assert sorted(trained.detail["losses"]) == list(range(STEPS + 1, end + 1))

    (refused,) = loser.jobs["Resume"]
    reason = refused.failure_reason
    run = first.execution_id
    assert reason.startswith(f"launcher: run {run} is held by execution arn:aws:sagemaker:"), reason
    assert f"/execution/{winner.execution_id} (training job pipelines-{winner.execution_id}-" in reason
    assert "this job (execution arn:aws:sagemaker:local:000000000000:pipeline/" in reason
    assert f"/execution/{loser.execution_id}" in reason
    # Refused before compute: no torchrun, no step, nothing written to the run's prefix.
    assert not refused.detail["losses"] and not any("[rank" in line for _, _, line in refused.log)
    assert not any(refused.detail["uploads"].values())
    assert set(refused.detail["exit_codes"].values()) == {3}


def test_the_run_ends_with_one_line_of_checkpoints_and_the_lease_released(leased):
    """The winner's checkpoints are the run's; the next resume starts at once (the lease was released, not left to
    go stale) and continues from the winner's last step."""
    result, log = leased
    _first, six, eight, after = result.executions
    winner = six if six.status == "Succeeded" else eight
    end = 6 if winner is six else 8
    assert after.status == "Succeeded", log[-4000:]
    (attempt,) = after.jobs["Resume"]
    assert attempt.detail["resumed_from"] == end
    assert sorted(attempt.detail["losses"]) == list(range(end + 1, 11))
    lines = [line for _, _, line in attempt.log]
    assert any(line.startswith("launcher: lease of run ") and "taken at s3://" in line for line in lines)
    assert any(line == f"launcher: lease of run {result.execution.execution_id} released" for line in lines)
