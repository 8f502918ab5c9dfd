"""A Processing job with InstanceCount N in the rehearsal: N simulated instances at once, each with its own
/opt/ml tree and resourceconfig.json; any instance failing fails the job, naming it; their outputs land in one
S3 prefix. The job's module here is a stand-in written by the test, not the Prepare engine."""

from __future__ import annotations

import json
import textwrap

import pytest

from tiered_training.rehearse.hosts import JobRunner
from tiered_training.rehearse.s3 import LocalS3, list_keys

STANDIN = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    root = pathlib.Path(os.environ["TIERED_TRAINING_OPT_ML"])
    config = json.loads((root / "config/resourceconfig.json").read_text())
    me, hosts = config["current_host"], config["hosts"]
    out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
    meeting = pathlib.Path(sys.argv[sys.argv.index("--meeting") + 1])
    (meeting / me).write_text("here")
    deadline = time.monotonic() + 20
    while not all((meeting / h).exists() for h in hosts):  # only instances that run at once all meet
        if time.monotonic() > deadline:
            sys.exit(f"error: {me} never met the others")
        time.sleep(0.05)
    if me == os.environ.get("FAIL_HOST"):
        print(f"error: {me} cannot read s3://raw/part-1.parquet"); sys.exit(3)
    (out / f"{me}.json").write_text(json.dumps({"me": me, "hosts": hosts, "root": str(root)}))
    same = os.environ.get("CLASH") != "1" or me == "algo-1"
    (out / "prepared.json").write_text(json.dumps({"key": "k" if same else me}))
    """
)


@pytest.fixture(scope="module")
def s3():
    with LocalS3() as server:
        yield server


def _args(tmp_path, count, **env):
    meeting = tmp_path / "meeting"
    meeting.mkdir(exist_ok=True)
    return {
        "ProcessingResources": {"ClusterConfig": {"InstanceCount": count, "InstanceType": "ml.c5.xlarge"}},
        "AppSpecification": {
            "ContainerEntrypoint": ["python", "-m", "standin_prepare"],
            "ContainerArguments": ["--out", "/opt/ml/processing/output/prepared", "--meeting", str(meeting)],
        },
        "ProcessingOutputConfig": {
            "Outputs": [
                {
                    "OutputName": "prepared",
                    "S3Output": {
                        "S3Uri": "s3://rehearsal-out/prepare/exec-1",
                        "LocalPath": "/opt/ml/processing/output/prepared",
                        "S3UploadMode": "EndOfJob",
                    },
                }
            ]
        },
        "Environment": env,
    }


def _runner(s3, tmp_path):
    (tmp_path / "standin_prepare.py").write_text(STANDIN)
    return JobRunner(s3, tmp_path / "work", workers=1, repo=tmp_path, hyperparameters=lambda _: {}, say=lambda _: None)


def test_n_instances_run_at_once_each_with_its_own_tree_and_host(s3, tmp_path):
    result = _runner(s3, tmp_path).process("Prepare", "job-1", _args(tmp_path, 3))
    assert result.status == "Completed", result.failure_reason
    seen = {}
    for name, host in result.detail["hosts"].items():
        data = json.loads(
            (tmp_path / "work/job-1" / name / "opt/ml/processing/output/prepared" / f"{name}.json").read_text()
        )
        assert data["me"] == name and data["hosts"] == ["algo-1", "algo-2", "algo-3"]
        seen[name] = data["root"]
        assert host["exit_code"] == 0
    assert len(set(seen.values())) == 3  # one /opt/ml tree each
    keys = set(list_keys(s3.client(), "s3://rehearsal-out/prepare/exec-1/"))
    assert {k.rsplit("/", 1)[-1] for k in keys} == {"algo-1.json", "algo-2.json", "algo-3.json", "prepared.json"}
    merged = result.detail["outputs"]["prepared"]  # the property file the interpreter reads: what S3 holds
    assert json.loads((tmp_path / "work/job-1" / "merged/prepared/prepared.json").read_text()) == {"key": "k"}
    assert merged.endswith("merged/prepared")


def test_one_failing_instance_fails_the_job_and_is_named(s3, tmp_path):
    result = _runner(s3, tmp_path).process("Prepare", "job-2", _args(tmp_path, 2, FAIL_HOST="algo-2"))
    assert result.status == "Failed"
    assert result.failure_reason.startswith("algo-2 failed: error: algo-2 cannot read s3://raw/part-1.parquet")
    assert result.detail["hosts"]["algo-1"]["exit_code"] == 0 and result.detail["hosts"]["algo-2"]["exit_code"] == 3


def test_two_instances_writing_one_file_differently_fail_the_job(s3, tmp_path):
    result = _runner(s3, tmp_path).process("Prepare", "job-3", _args(tmp_path, 2, CLASH="1"))
    assert result.status == "Failed"
    assert "algo-1 and algo-2 both wrote prepared.json with different bytes" in result.failure_reason


def test_one_instance_keeps_its_tree_where_it_was(s3, tmp_path):
    result = _runner(s3, tmp_path).process("Prepare", "job-4", _args(tmp_path, 1))
    assert result.status == "Completed", result.failure_reason
    assert (tmp_path / "work/job-4/opt/ml/processing/output/prepared/algo-1.json").exists()
    config = json.loads((tmp_path / "work/job-4/opt/ml/config/resourceconfig.json").read_text())
    assert config["current_host"] == "algo-1" and config["hosts"] == ["algo-1"]
