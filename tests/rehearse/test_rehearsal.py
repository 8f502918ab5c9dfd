"""A two-host rehearsal of the hybrid-sharded qwen2.5-32b recipe, with one host killed during a checkpoint
save, then a second execution on one host that resumes the final checkpoint: one run, many assertions."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moto")

from tiered_training.rehearse.run import Options, rehearse  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
STEPS = 7
INTERVAL = 3  # a checkpoint every 3 steps; the second save (step 6) is interrupted
KEEP_LAST = 1
SLOW_FACTOR = 0.5  # --slow-host 2:0.5: algo-2's forward/backward at half speed in the training jobs


def _test_recipe(root: Path) -> Path:
    """The qwen2.5-32b recipe (hybrid sharding pinned) with keep_last 1, a checkpoint every INTERVAL steps at
    the plan's step time, and shard groups of 2 nodes: this test is of a hybrid-sharded recipe whose shard
    groups span hosts."""
    from tiered_training.planning.planner import plan_file

    text = (REPO / "recipes/qwen2.5-32b-hybrid.yaml").read_text().replace("keep_last: 4", f"keep_last: {KEEP_LAST}")
    assert "\ntuning:\n  sharding: hybrid\n" in text
    text = text.replace("\ntuning:\n", "\ntuning:\n  shard_group_size: 16\n")
    # One probe candidate, the plan's own: Train runs it (the choice among several is test_every_template.py's PROBED).
    text = text.replace("\ntuning:\n", "\ntuning:\n  probe_candidates: 1\n")
    # One training job: the account's runtime limit raised to 28 days (segments are tests/rehearse/test_runs_rehearsal.py's).
    text = text.replace("  instance_count: 4\n", "  instance_count: 4\n  quotas:\n    training-job-max-runtime: 2419200\n")
    recipe = root / "qwen2.5-32b-hybrid.yaml"
    recipe.write_text(text)
    assert plan_file(recipe).segments == 1 and len(plan_file(recipe).candidates) == 1
    step_seconds = plan_file(recipe).estimates.step_time_seconds
    recipe.write_text(text.replace("interval_minutes: 20", f"interval_minutes: {INTERVAL * step_seconds / 60:.4f}"))
    return recipe


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The plan's shard groups span 2 hosts (the export must gather across hosts). A restart on 1 host
    cannot keep them, so the second execution must be refused before any compute; resuming on another
    host count is tested in tests/trainer/test_multiprocess.py."""
    root = tmp_path_factory.mktemp("rehearsal")
    out = io.StringIO()
    result = rehearse(Options(_test_recipe(root), hosts=2, workers=2, steps=STEPS, interrupt="kill-host@save",
                              workdir=root / "work", slow_host=f"2:{SLOW_FACTOR}",
                              then={"InstanceCount": "1", "SkipProbe": "true", "MaxSteps": str(STEPS + 1)}), out)
    (root / "rehearsal.log").write_text(out.getvalue())
    return result, out.getvalue(), root


def _events(execution, kind):
    return [e.text for e in execution.trace if e.kind == kind]


def test_the_pipeline_succeeds_through_probe_gate_and_train(rehearsal):
    result, log, _ = rehearsal
    assert result.execution.status == "Succeeded", log[-6000:]
    steps = [e.step for e in result.execution.trace if e.kind == "job" and "completed" in e.text]
    assert steps == ["Probe", "Train"]
    gate = [e for e in result.execution.trace if e.kind == "condition" and e.step == "Gate"][0]
    assert gate.data["outcome"] is True
    assert any(check.startswith("probe:peak_memory_fraction") and "<= 0.85" in check for check in gate.data["checks"])
    assert "scaled down (plan -> rehearsal):" in log and "kept as planned:" in log
    assert "parallel.shard_group_size: 16 -> 4  (2 host(s) per shard group, as planned)" in log
    assert "precision.precision fp8" in log
    assert f"checkpoint.interval_steps: 0 -> {INTERVAL}" in log
    assert f"interrupt kill-host@save: SIGKILL of algo-2 during the save of step-{2 * INTERVAL}" in log


def test_the_validation_loss_and_each_hosts_emf_lines_are_shown(rehearsal):
    result, log, _ = rehearsal
    validation = result.validation_losses()
    assert validation and all(0 < value < 10 for value in validation.values())
    assert "validation loss (held-out windows): " in log
    first = result.train_attempts()[0]
    assert set(first.detail["emf"]) == {"algo-1", "algo-2"}
    assert "Train attempt 1 algo-1: " in log and "Train attempt 1 algo-2: none" in log
    job = [json.loads(line) for line in first.detail["emf"]["algo-1"] if '"Loss"' in line]
    assert [record["Step"] for record in job][:3] == [1, 2, 3]  # one event per step


def test_the_slowed_host_is_named_by_the_straggler_score(rehearsal):
    """Every Train attempt names algo-2 (slowed by --slow-host) within SLOW_HOST_NAMED_WITHIN_STEPS steps: its
    rank 0's EMF, the readable line, the summary and its JSON."""
    from tiered_training.rehearse.run import SLOW_HOST_NAMED_WITHIN_STEPS, stragglers

    result, log, _ = rehearsal
    assert "slowed: algo-2's forward/backward runs at 0.5 of its speed in the training jobs" in log
    named = dict(stragglers(result.execution))
    assert set(named) == {"Train attempt 1", "Train attempt 2"}, log[-4000:]
    for name, straggler in named.items():
        assert straggler.host == "algo-2" and straggler.phase == "forward/backward", (name, straggler)
        assert straggler.phase_score < 0.75 and straggler.score < 0.95
        assert f"straggler: {name}: algo-2 GPU " in log
    first = result.train_attempts()[0]
    events = [json.loads(line) for line in first.detail["emf"]["algo-1"] if '"StragglerScore"' in line]
    assert events[0]["Step"] <= SLOW_HOST_NAMED_WITHIN_STEPS and events[0]["StragglerHost"] == "algo-2"
    hosts = {json.loads(line)["Node"]: json.loads(line)["HostStragglerScore"]
             for line in first.detail["emf"]["algo-1"] if '"HostStragglerScore"' in line}
    assert hosts["algo-1"] > 0.9 > hosts["algo-2"]
    probe = [line for lines in result.execution.jobs["Probe"][0].detail["emf"].values() for line in lines]
    assert not any('"StragglerScore"' in line for line in probe)  # the Probe runs no straggler hook
    assert result.to_dict()["executions"][0]["stragglers"]["Train attempt 1"]["host"] == "algo-2"


def test_the_straggler_alarm_fires_on_the_rehearsals_metrics(rehearsal):
    """The plan's fitted Straggler alarm (its metric, statistic, period and threshold as the construct builds it),
    evaluated minute by minute as CloudWatch would on the EMF lines rank 0 printed: it fires."""
    from cloudwatch_alarms import Alarm, MetricStore

    from tiered_training.contract import metrics as catalogue
    from tiered_training.planning import alarms as fitting
    from tiered_training.planning.planner import plan_file

    result, log, root = rehearsal
    plan = plan_file(root / "qwen2.5-32b-hybrid.yaml")
    fit = fitting.fit_alarms(plan)[fitting.STRAGGLER]
    alarm = Alarm({
        "Namespace": catalogue.NAMESPACE, "MetricName": catalogue.STRAGGLER_SCORE.name, "Statistic": "Maximum",
        "Dimensions": [{"Name": "Recipe", "Value": plan.name}], "Period": fit.period_seconds,
        "Threshold": fit.threshold, "ComparisonOperator": fit.comparison, "EvaluationPeriods": fit.evaluation_periods,
        "DatapointsToAlarm": fit.datapoints_to_alarm, "TreatMissingData": fit.treat_missing_data,
    }, name=fitting.STRAGGLER)
    store = MetricStore()
    lines = [line for attempt in result.train_attempts() for line in attempt.detail["emf"]["algo-1"]]
    assert store.add_emf_lines("\n".join(lines))
    times = [json.loads(line)["_aws"]["Timestamp"] / 1000 for line in lines if '"StragglerScore"' in line]
    at = alarm.first_alarm(store, min(times), max(times) + fit.fires_within_seconds)
    assert at is not None and at - min(times) <= fit.fires_within_seconds


def test_the_work_directory_keeps_the_trace_the_summary_and_the_export(rehearsal):
    result, log, root = rehearsal
    work = root / "work"
    assert (work / "trace.txt").read_text() == log
    assert json.loads((work / "summary.json").read_text()) == json.loads(json.dumps(result.to_dict()))
    exported = Path(result.exported["dir"])
    assert exported.is_relative_to(work) and any(exported.glob("*.safetensors"))
    assert f"exported model: {exported}\n" in log


def test_the_summary_names_each_attempt_as_the_trace_does(rehearsal):
    _, log, _ = rehearsal
    summary = re.findall(r"^  (\S+ attempt \d+): (?:Completed|Failed|Interrupted)", log, re.MULTILINE)
    assert summary == ["Train attempt 1", "Train attempt 2"]
    for name in summary:
        assert f"  {name}: 2 host(s) x 2 CPU worker(s)" in log  # the runner's line in the trace


def test_train_reuses_the_probes_warm_pool(rehearsal):
    result, _, _ = rehearsal
    assert any("Train: reuses the warm pool of Probe" in text for text in _events(result.execution, "warm-pool"))


def test_a_host_killed_during_a_save_restarts_from_the_newest_complete_checkpoint(rehearsal):
    result, log, _ = rehearsal
    first, second = result.train_attempts()
    assert first.status == "Failed" and first.internal and "SIGKILL while writing checkpoint step-6" in first.failure_reason
    assert second.status == "Completed" and second.detail["resumed_from"] == 3
    assert "skipping checkpoint step-6: not committed" in log
    # The first attempt is an uninterrupted run up to the kill, with the same settings: the steps redone
    # after the restart equal its losses, bit for bit (the EMF JSON keeps every digit).
    # bench/rehearse_bench.py compares whole runs, interrupted and not.
    redone = {s: v for s, v in second.detail["losses"].items() if s in first.detail["losses"]}
    assert {4, 5} <= set(redone)  # step 6 too when its line was out before the kill
    assert redone == {s: first.detail["losses"][s] for s in redone}
    assert any(len(repr(value)) > 8 for value in redone.values())  # full precision, not the 4-decimal log line
    assert sorted(second.detail["losses"]) == list(range(4, STEPS + 1))


def test_the_surviving_host_writes_a_one_line_failure_reason(rehearsal):
    result, _, _ = rehearsal
    first = result.train_attempts()[0]
    reason = first.detail["failure_files"]["algo-1"]
    assert reason.startswith("algo-1 rank-") and "\n" not in reason
    assert "algo-2" not in first.detail["failure_files"]  # killed: it wrote nothing


def test_checkpoints_commit_on_two_hosts_and_both_upload(rehearsal):
    result, log, _ = rehearsal
    assert "checkpoint step-3 committed" in log and f"checkpoint step-{STEPS} committed" in log
    second = result.train_attempts()[1]
    uploads = second.detail["uploads"]
    assert any(key.endswith("COMMITTED") for key in uploads["algo-1"])
    assert any(key.startswith(f"step-{STEPS}/__2_") for key in uploads["algo-2"])  # rank 2 lives on algo-2
    assert not any(key.startswith(f"step-{STEPS}/__2_") for key in uploads["algo-1"])


def test_s3_holds_at_most_keep_last_plus_two_checkpoints(rehearsal):
    # keep_last + 1 on every host; one more while a host's sync lags behind a pruning (test_local_s3.py)
    result, _, _ = rehearsal
    assert 1 <= result.max_checkpoints <= KEEP_LAST + 2
    assert result.checkpoints_at_end == [f"step-{STEPS}"]


def test_a_restart_on_a_host_count_that_breaks_the_shard_groups_is_refused_before_any_compute(rehearsal):
    result, log, _ = rehearsal
    assert result.then is not None and result.then.status == "Failed" and not result.ok
    (attempt,) = result.then.jobs["Resume"]
    reason = attempt.detail["failure_files"]["algo-1"]
    assert reason.startswith("launcher: ") and "cannot resume the checkpoint of a run on 4 GPUs on 2 GPUs" in reason
    assert "hybrid sharding needs a multiple of the shard group of 4 GPUs" in reason
    assert not attempt.detail["losses"] and not any("torchrun" in line or "[rank" in line for _, _, line in attempt.log)
    assert result.checkpoints_at_end == [f"step-{STEPS}"]  # nothing was written


def test_export_on_two_hosts_equals_a_single_host_export(rehearsal, tmp_path):
    """Shapes, bf16, several safetensors files with an index, and from_pretrained logits equal to those of
    the same final checkpoint exported by one process."""
    result, _, root = rehearsal
    exported = result.exported
    assert exported["tensors"]["model.embed_tokens.weight"] == {
        **exported["tensors"]["model.embed_tokens.weight"], "dtype": "BF16", "shape": [256, 64]}
    assert "model.safetensors.index.json" in exported["files"]
    assert sum(name.endswith(".safetensors") for name in exported["files"]) > 1
    hosts = Path(result.train_attempts()[1].detail["model_dir"]).parents[3]  # attempt-2/<host>/opt/ml/model
    checkpoint = ",".join(str(hosts / h / "opt/ml/checkpoints" / f"step-{STEPS}") for h in ("algo-1", "algo-2"))
    script = REPO / "tests/rehearse/single_host_export.py"
    proc = subprocess.run([sys.executable, str(script), checkpoint, exported["dir"], str(tmp_path / "single")],
                          cwd=REPO, capture_output=True, text=True, timeout=180, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOGITS EQUAL" in proc.stdout, proc.stdout[-2000:]


def test_the_summary_for_format_json_is_strict_json(rehearsal):
    from tiered_training.report.render import dumps

    result, _, _ = rehearsal
    data = json.loads(dumps(result.to_dict()))
    assert data["ok"] is result.ok and data["interrupt"] == "kill-host@save" and data["interrupted"]
    assert [e["status"] for e in data["executions"]] == [e.status for e in result.executions]
    assert data["losses"] and all(isinstance(v, float) for v in data["losses"].values())
    assert data["checkpoints_at_end"] == result.checkpoints_at_end
    # as rehearse --format json prints it: in the schema of docs/schemas/rehearse.schema.json
    import jsonschema

    from tiered_training.cli import output

    summary = {k: v for k, v in data.items() if k != "ok"}
    printed = output.data("rehearse", 0 if result.ok else 1, **summary)
    jsonschema.Draft202012Validator(json.loads(output.schema_texts()[output.SCHEMAS_DIR / "rehearse.schema.json"])).validate(printed)
    assert printed["schema_version"] == 3 and printed["losses"] == data["losses"]
