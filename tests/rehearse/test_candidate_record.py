"""What a rehearsal records about the probe's candidates and the candidate each training job ran (no torch)."""

from __future__ import annotations

import pytest
from support import ROOT as REPO

from tiered_training.planning.planner import plan_file
from tiered_training.rehearse.interpreter import Execution, JobAttempt
from tiered_training.rehearse.run import SlowCandidate, candidate_record


@pytest.fixture(scope="module")
def plan():
    found = plan_file(REPO / "recipes/llama3-8b-fp8.yaml")  # its plan measures three candidates
    assert len(found.candidates) == 3
    return found


def probe_metrics(chosen: int, figures: dict[int, tuple[float, float, float]]) -> dict[str, float]:
    found = {}
    for n, (tokens, allocated, reserved) in figures.items():
        found.update(
            {
                f"probe:candidate{n}:tokens_per_second": tokens,
                f"probe:candidate{n}:peak_allocated_fraction": allocated,
                f"probe:candidate{n}:peak_reserved_fraction": reserved,
            }
        )
    best = figures.get(chosen, (0.0, 1.0, 1.0))
    return {
        **found,
        "probe:tokens_per_second": best[0],
        "probe:peak_memory_fraction": best[2],
        "probe:best_candidate": float(chosen),
    }


def test_the_record_says_why_train_runs_the_second_when_the_first_is_slowed(plan):
    execution = Execution(
        metrics={"Probe": probe_metrics(2, {1: (900.0, 0.2, 0.3), 2: (4100.0, 0.2, 0.3), 3: (5000.0, 0.5, 0.95)})}
    )
    execution.jobs = {
        "Probe": [JobAttempt("Completed")],
        "Train": [
            JobAttempt(
                "Completed",
                detail={
                    "run_candidate": 2,
                    "candidate_lines": ["training candidate 2 of 3 (bf16, selective AC, micro-batch 16)"],
                },
            )
        ],
    }
    record = candidate_record(execution, plan.candidates, 0.85, SlowCandidate(1))
    probe = record["probe"]
    assert probe["chosen"] == 2
    rows = {row["number"]: row for row in probe["candidates"]}
    # predicted from the plan beside measured, and why each other candidate lost
    assert [rows[n]["predicted_tokens_per_second_per_gpu"] for n in (1, 2, 3)] == [
        c.tokens_per_second_per_gpu for c in plan.candidates
    ]
    assert (rows[1]["status"], rows[1]["slowed"]) == ("slower", True)
    assert rows[2]["status"] == "chosen" and rows[2]["measured_tokens_per_second"] == 4100.0
    assert rows[3]["status"] == "over the memory limit (0.95 > 0.85)"
    (train,) = record["train"]
    assert (train["job"], train["candidate"]) == ("Train attempt 1", 2)
    assert train["why"].startswith(
        "the probe's choice: the fastest measured under the memory limit 0.85, "
        "4,100 tokens/s per worker against 900 for candidate 1 (slowed on purpose), "
        "5,000 for candidate 3 (over the memory limit (0.95 > 0.85))"
    )
    assert "candidate 1, was slowed on purpose by --slow-candidate" in train["why"]
    assert train["said"] == ["training candidate 2 of 3 (bf16, selective AC, micro-batch 16)"]


def test_without_a_probe_and_on_resume_the_run_keeps_its_recorded_candidate(plan):
    execution = Execution()
    execution.jobs = {
        "TrainWithoutProbe": [JobAttempt("Completed", detail={"run_candidate": 0})],
        "Resume": [JobAttempt("Completed", detail={"run_candidate": 0})],
    }
    record = candidate_record(execution, plan.candidates, 0.85, None)
    assert record["probe"] is None
    whys = {entry["job"]: entry["why"] for entry in record["train"]}
    assert "no probe (SkipProbe=true)" in whys["TrainWithoutProbe attempt 1"]
    assert "the candidate the run's checkpoints record" in whys["Resume attempt 1"]


def test_a_candidate_that_ran_out_of_memory_or_printed_nothing_is_named_so(plan):
    execution = Execution(metrics={"Probe": probe_metrics(0, {1: (0.0, 1.0, 1.0), 2: (0.0, 1.0, 1.0)})})
    rows = candidate_record(execution, plan.candidates, 0.85, None)["probe"]["candidates"]
    assert [row["status"] for row in rows] == ["out of memory", "out of memory", "no result (its launch failed)"]


@pytest.mark.parametrize("text, number, seconds", [("1", 1, 0.5), ("3:2", 3, 2.0), ("2:0.25", 2, 0.25)])
def test_slow_candidate_parses(text, number, seconds):
    slow = SlowCandidate.parse(text)
    assert (slow.number, slow.seconds) == (number, seconds)
    assert SlowCandidate.parse(slow.value) == slow


@pytest.mark.parametrize("text", ["0", "6", "x", "1:0", "1:-1", "1:abc", "1:1e9", "", ":1"])
def test_slow_candidate_refuses_what_it_cannot_do(text):
    with pytest.raises(ValueError, match="--slow-candidate"):
        SlowCandidate.parse(text)
