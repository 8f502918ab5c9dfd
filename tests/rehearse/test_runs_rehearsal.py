"""A run's life across executions, in one rehearsal (one moto server, one store, five executions) of the
llama3-1b-bf16 template, on 1 simulated host of 2 CPU workers (2 ranks; what a run is across
executions does not depend on hosts, which test_rehearsal.py and test_every_template.py cover):

1. a run trained to its end (4 steps);
2. the pipeline redeployed with the account's runtime limit lowered so that the plan needs 2 segments, then started
   again: a new run, from step 0, in 2 Training jobs, equal bit for bit to the first;
3. a new DataUri: a new run, from step 0, on the other data;
4. the first run resumed by name with that other DataUri: refused before any compute, naming the data;
5. the first run resumed by name after a stale copy of its step 2 was put under a higher name (step-99): it resumes
   from its newest checkpoint (step 4), not from the copy (checkpoints are identified by their manifests).

1 host, not 2: each of the six training jobs starts one torchrun agent instead of two.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moto")

from tiered_training.rehearse.run import Options, Then, rehearse  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
INTERVAL = 2  # a checkpoint every 2 steps
SEGMENT_QUOTA = 100_000  # seconds: the 1B plan's 32 h then takes 2 jobs
OTHER_DATA = "s3://example-training-data/other-tokens/"


def _recipes(root: Path) -> tuple[Path, Path]:
    """The template with a checkpoint every INTERVAL steps, keep_last 2, another data prefix allowed and no
    max_runtime_hours (each job may run the account's limit); and the same with that limit lowered."""
    from tiered_training.planning.planner import plan_file

    text = (REPO / "recipes/llama3-1b-bf16.yaml").read_text()
    assert "  max_runtime_hours: 96\n" in text and "  keep_last: 3\n" in text
    text = text.replace("  max_runtime_hours: 96\n", "").replace("  keep_last: 3\n", "  keep_last: 2\n")
    text = text.replace("  token_dtype: uint32\n", "  token_dtype: uint32\n  allowed_uris: [s3://example-training-data/]\n")
    plain = root / "plain" / "llama3-1b-bf16.yaml"
    plain.parent.mkdir()
    plain.write_text(text)
    step_seconds = plan_file(plain).estimates.step_time_seconds
    text = text.replace("interval_minutes: 30", f"interval_minutes: {INTERVAL * step_seconds / 60:.4f}")
    plain.write_text(text)
    segmented = root / "segmented" / "llama3-1b-bf16.yaml"
    segmented.parent.mkdir()
    segmented.write_text(text.replace("  instance_count: 1\n", f"  instance_count: 1\n  quotas:\n"
                                                               f"    training-job-max-runtime: {SEGMENT_QUOTA}\n"))
    assert plan_file(plain).segments == 1 and plan_file(segmented).segments == 2
    return plain, segmented


def _stale_copy(client, rehearsal) -> None:
    """Copy the first run's committed step 2 (if pruned, its newest version) to step-99, marker included."""
    bucket, _, prefix = rehearsal.checkpoint_uri[len("s3://"):].partition("/")
    versions = client.list_object_versions(Bucket=bucket, Prefix=prefix + "step-2/").get("Versions", [])
    newest = {}
    for version in versions:
        if version["Key"] not in newest or version["IsLatest"]:
            newest[version["Key"]] = version
    assert any(key.endswith("/COMMITTED") for key in newest), sorted(newest)
    for key, version in newest.items():
        target = key.replace("/step-2/", "/step-99/")
        client.copy_object(Bucket=bucket, Key=target,
                           CopySource={"Bucket": bucket, "Key": key, "VersionId": version["VersionId"]})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    plain, segmented = _recipes(root)
    out = io.StringIO()
    started = time.monotonic()
    result = rehearse(Options(plain, hosts=1, workers=2, steps=STEPS, params={"SkipProbe": "true"}, workdir=root / "work",
                              then=[Then({}, recipe=segmented),
                                    Then({"DataUri": OTHER_DATA, "MaxSteps": "2"}),
                                    Then({"DataUri": OTHER_DATA}, resume=True),
                                    Then({"MaxSteps": str(STEPS + 2)}, resume=True, before=_stale_copy)]), out)
    seconds = time.monotonic() - started
    (root / "rehearsal.log").write_text(out.getvalue())
    print(f"the runs rehearsal took {seconds:.0f} s")
    return result, out.getvalue()


def _digest(model_dir: str) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(model_dir).glob("*")) if p.is_file()}


def test_every_new_execution_is_a_new_run_under_its_own_prefix(runs):
    result, log = runs
    first, segmented, other_data, _refused, _resumed = result.executions
    assert [e.status for e in (first, segmented, other_data)] == ["Succeeded"] * 3, log[-4000:]
    ids = [e.execution_id for e in result.executions]
    assert len(set(ids)) == 5
    for execution in (first, segmented, other_data):
        attempts = result.train_attempts(execution)
        assert attempts[0].detail["resumed_from"] is None  # from step 0, not "resumed at step 4"
        assert min(result.losses(execution=execution)) == 1
        assert {a.detail["checkpoint_uri"] for a in attempts} == {result.run_prefix(execution.execution_id)}
        assert any(a.detail["uploads"] for a in attempts)
    assert sorted(result.losses(execution=other_data)) == [1, 2]
    # The other data trains a different run: its first loss is not the first run's.
    assert result.losses(execution=other_data)[1] != result.losses(execution=first)[1]


def test_a_segmented_run_equals_an_unsegmented_one_bit_for_bit(runs):
    """The redeployed pipeline chains TrainWithoutProbe segments; segment 1 trains half the steps and saves, segment 2
    resumes from it on the warm pool, and the losses and exported weights equal the one-job run's exactly."""
    result, log = runs
    first, segmented = result.executions[:2]
    assert list(first.jobs) == ["TrainWithoutProbe"]
    assert list(segmented.jobs) == ["TrainWithoutProbe", "TrainWithoutProbe-2"]
    one, two = segmented.jobs["TrainWithoutProbe"][-1], segmented.jobs["TrainWithoutProbe-2"][-1]
    half = STEPS // 2
    assert sorted(one.detail["losses"]) == list(range(1, half + 1)) and two.detail["resumed_from"] == half
    assert sorted(two.detail["losses"]) == list(range(half + 1, STEPS + 1))
    assert any("reuses the warm pool of TrainWithoutProbe" in e.text for e in segmented.trace if e.kind == "warm-pool")
    assert result.losses(execution=segmented) == result.losses(execution=first)
    assert any(len(repr(v)) > 8 for v in result.losses(execution=first).values())  # every digit, not the log line's 4
    unsegmented_export = result.train_attempts(first)[-1].detail["model_dir"]
    assert not any(Path(one.detail["model_dir"]).glob("*.safetensors"))  # segment 1 hands over; it exports nothing
    weights = {k: v for k, v in _digest(two.detail["model_dir"]).items() if k != "evaluation.json"}
    assert weights == {k: v for k, v in _digest(unsegmented_export).items() if k != "evaluation.json"}
    assert any(name.endswith(".safetensors") for name in weights)
    # each run's evaluation (its own run id) scores the same weights the same, with the same final training loss
    reports = [json.loads((Path(d) / "evaluation.json").read_text()) for d in (two.detail["model_dir"], unsegmented_export)]
    assert reports[0]["run_id"] != reports[1]["run_id"] and reports[0]["held_out"] == reports[1]["held_out"]
    assert reports[0]["training"]["train:loss"] == reports[1]["training"]["train:loss"]


def test_resuming_a_run_with_other_data_is_refused_before_any_compute(runs):
    result, _ = runs
    refused = result.executions[3]
    assert refused.status == "Failed"
    (attempt,) = refused.jobs["Resume"]
    reason = attempt.detail["failure_files"]["algo-1"]
    first = result.execution.execution_id
    assert reason.startswith(f"launcher: cannot resume run '{first}': the data changed")
    assert "resume with DataUri=s3://example-training-data/fineweb-edu/llama3-tokens/" in reason
    assert not attempt.detail["losses"] and not any("[rank" in line for _, _, line in attempt.log)


def test_a_run_resumed_by_name_continues_from_its_newest_checkpoint_not_a_stale_higher_named_copy(runs):
    result, log = runs
    resumed = result.executions[4]
    assert resumed.status == "Succeeded", log[-3000:]
    (attempt,) = resumed.jobs["Resume"]
    assert attempt.detail["resumed_from"] == STEPS
    assert sorted(attempt.detail["losses"]) == [STEPS + 1, STEPS + 2]


def test_a_run_resumed_by_name_trains_in_its_own_prefix(runs):
    """Whatever the resume point, the resume runs in the first run's prefix and not in a new one."""
    result, log = runs
    resumed = result.executions[4]
    (attempt,) = resumed.jobs["Resume"]
    assert attempt.detail["resumed_from"] is not None, log[-3000:]
    assert attempt.detail["checkpoint_uri"] == result.run_prefix(result.execution.execution_id)
