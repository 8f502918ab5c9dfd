"""One execution per run, in one rehearsal of the llama3-1b-bf16 template on 2 simulated hosts (one moto server):

1. a new run trained to step 4;
2. and 3. two resumes of that run started at the same moment (MaxSteps 6 and 8): the first launcher to take the run's
   lease trains, the other execution is refused before torchrun starts, its FailureReason naming the holder;
4. the run resumed again once the winner has ended: its lease was released, so it starts at once and continues from
   the winner's last step;
5. and 6. split brain refused: a resume whose lease writes S3 answers with 503 (TIERED_TRAINING_LEASE_FAULT, from its
   commit of step FAULT_AFTER on) stops at its deadline, its last save not committed; a second resume, started once
   that lease is stale, takes the run over and ends it with one history (every checkpoint left names its job). Both
   run with the lease's timings shortened in their Environment (renew 1 s, deadline 3 s, stale after 15 s > 3 s + a
   10 s save + 0 s skew: one machine, one clock).

About 4 minutes on 2 busy CPUs: six training jobs of 2 hosts each, two of them at once.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moto")

from tiered_training.contract import lease as protocol  # noqa: E402
from tiered_training.rehearse.run import STORE, Options, Then, rehearse  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
INTERVAL = 2  # a checkpoint every 2 steps
SAVE_SECONDS = 10  # checkpointing.shutdown_deadline_seconds: the longest save, in the lease's rule
FAST = {
    "TIERED_TRAINING_LEASE_RENEW_SECONDS": "1",
    "TIERED_TRAINING_LEASE_DEADLINE_SECONDS": "3",
    "TIERED_TRAINING_LEASE_STALE_SECONDS": "15",
    "TIERED_TRAINING_LEASE_SKEW_SECONDS": "0",
}
FAULT_AFTER = 12  # once it has committed step 12, the faulty resume's lease writes answer 503
LONG = 40  # MaxSteps of the last two resumes: the faulty one is still training at its deadline


def _recipe(root: Path) -> Path:
    from tiered_training.planning.planner import plan_file

    text = (REPO / "recipes/llama3-1b-bf16.yaml").read_text()
    assert "interval_minutes: 30" in text
    path = root / "llama3-1b-bf16.yaml"
    path.write_text(text)
    step_seconds = plan_file(path).estimates.step_time_seconds
    text = text.replace("interval_minutes: 30", f"interval_minutes: {INTERVAL * step_seconds / 60:.4f}")
    path.write_text(text.replace("checkpointing:\n", f"checkpointing:\n  shutdown_deadline_seconds: {SAVE_SECONDS}\n"))
    assert plan_file(path).segments == 1
    return path


def _stale(client) -> bool:
    """The run's lease is there and stale (the faulty resume stopped renewing it)."""
    bucket = STORE[len("s3://") :]
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    leases = [o["Key"] for page in pages for o in page.get("Contents", []) if o["Key"].endswith("/lease.json")]
    found = protocol.read(client, f"s3://{bucket}/{leases[0]}") if leases else None
    return found is not None and not found.live(time.time())


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
                Then(
                    {"MaxSteps": str(LONG)},
                    resume=True,
                    environment={**FAST, "TIERED_TRAINING_LEASE_FAULT": f"step-{FAULT_AFTER}"},
                ),
                Then({"MaxSteps": str(LONG)}, resume=True, alongside=True, environment=FAST, start_when=_stale),
            ],
        ),
        out,
    )
    (root / "rehearsal.log").write_text(out.getvalue())
    return result, out.getvalue()


def test_two_resumes_at_once_one_trains_and_the_other_is_refused_naming_the_holder(leased):
    result, log = leased
    first, six, eight, _after = result.executions[:4]
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
    _first, six, eight, after = result.executions[:4]
    winner = six if six.status == "Succeeded" else eight
    end = 6 if winner is six else 8
    assert after.status == "Succeeded", log[-4000:]
    (attempt,) = after.jobs["Resume"]
    assert attempt.detail["resumed_from"] == end
    assert sorted(attempt.detail["losses"]) == list(range(end + 1, 11))
    lines = [line for _, _, line in attempt.log]
    assert any(line.startswith("launcher: lease of run ") and "taken at s3://" in line for line in lines)
    assert any(line == f"launcher: lease of run {result.execution.execution_id} released" for line in lines)


def _committed(attempt) -> set[int]:
    """The steps whose COMMITTED marker a job's hosts uploaded to the run's prefix."""
    keys = {key for keys in attempt.detail["uploads"].values() for key in keys}
    return {int(key.split("/")[0][5:]) for key in keys if key.startswith("step-") and key.endswith("/COMMITTED")}


def test_a_holder_whose_renewals_fail_stops_at_its_deadline_and_a_second_execution_ends_the_run_alone(leased):
    result, log = leased
    run = result.execution.execution_id
    faulty, taker = result.executions[4:]
    assert faulty.status == "Failed" and taker.status == "Succeeded", log[-6000:]
    (stopped,) = faulty.jobs["Resume"]
    (resumed,) = taker.jobs["Resume"]
    lines = [line for _, _, line in stopped.log]
    assert any("cannot renew the lease" in line and "ServiceUnavailable" in line for line in lines), lines[-40:]
    reason = stopped.failure_reason
    assert reason.startswith(f"launcher: the lease of run {run} at {STORE}/"), reason
    assert "/lease.json was not renewed within its deadline: last renewed at " in reason, reason
    assert "(3 s); this execution stopped committing and training" in reason, reason

    # It trained on past FAULT_AFTER, and its last save was written but refused by the fence: never committed.
    last = max(stopped.detail["losses"])
    mine, theirs = _committed(stopped), _committed(resumed)
    assert last > FAULT_AFTER and max(mine) >= FAULT_AFTER, (last, mine)
    refused = [line for line in lines if "NOT committed: the lease " in line]
    assert refused, lines[-40:]
    fenced = {int(line.split("checkpoint step-")[1].split()[0]) for line in refused if "checkpoint step-" in line}
    assert fenced and not fenced & mine, (fenced, mine)

    # The second execution took the stale lease over, saying from whom, and resumed from the last commit.
    said = [line for _, _, line in resumed.log]
    assert any(
        line.startswith(f"launcher: lease of run {run} taken over from execution arn:aws:sagemaker:")
        and f"/execution/{faulty.execution_id} (training job " in line
        and ", last renewed at " in line
        for line in said
    ), said[:20]
    start = resumed.detail["resumed_from"]
    assert start == max(mine) and sorted(resumed.detail["losses"]) == list(range(start + 1, LONG + 1))

    # One history: every checkpoint the prefix ends with was committed by the second execution's job.
    job = f"pipelines-{taker.execution_id}-01-Resume"
    assert result.checkpoints_at_end and set(result.writers_at_end.values()) == {job}, result.writers_at_end
    assert {int(step[5:]) for step in result.checkpoints_at_end} <= theirs
