"""The pipeline definition, without CDK: shape, names, botocore validation, container contract."""

from __future__ import annotations

import copy
import json
import re

import pytest

from support import RECIPES, recipe_dict, write_yaml
from tiered_training import definition as d
from tiered_training import metrics
from tiered_training.planner import plan_file

RESOURCES = d.PipelineResources(
    role_arn="arn:aws:iam::123456789012:role/exec",
    image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/tiered-training:1",
    checkpoint_s3_uri="s3://store/r/checkpoints/",
    output_s3_uri="s3://store/r/output/",
    kms_key_id="arn:aws:kms:us-east-1:123456789012:key/abc",
)


@pytest.fixture(scope="module")
def plans():
    return {path.stem: plan_file(path) for path in RECIPES}


@pytest.fixture
def definitions(plans):  # built per test, so mutation testing sees which tests reach build_definition
    return {name: (plan, d.build_definition(plan, RESOURCES)) for name, plan in plans.items()}


def test_every_template_recipe_is_valid_and_small(definitions):
    assert definitions
    for name, (_plan, definition) in definitions.items():
        assert d.validate_definition(definition) == [], name
        assert len(d.to_json(definition)) < d.MAX_BODY_CHARS / 20


def test_step_and_parameter_names(definitions):
    _plan, definition = next(iter(definitions.values()))
    names = [s["Name"] for s in d.iter_steps(definition["Steps"])]
    assert names == ["ProbeOrSkip", "TrainWithoutProbe", "Probe", "Gate", "Train", "GateReason", "FailThroughput", "FailMemory"]
    for name in names:
        assert re.fullmatch(d.STEP_NAME_PATTERN, name)
    assert [p["Name"] for p in definition["Parameters"]] == ["InstanceCount", "MaxSteps", "DataUri", "SkipProbe"]


def test_probe_uses_the_container_contract_and_metric_catalogue(definitions):
    from training.launcher import MODE_VARIABLE

    plan, definition = definitions["llama3-8b-fp8"]
    probe = d.find_step(definition, d.S_PROBE)["Arguments"]
    assert probe["Environment"][MODE_VARIABLE] == "probe"
    assert "CheckpointConfig" not in probe
    regexes = {m["Name"]: m["Regex"] for m in probe["AlgorithmSpecification"]["MetricDefinitions"]}
    assert regexes == {name: regex for name, (_fmt, regex) in metrics.PROBE_METRICS.items()}
    # The regexes parse what the container prints.
    for name, (fmt, regex) in metrics.PROBE_METRICS.items():
        line = fmt.format(3 if "micro_batch" in name else 1234.5)
        assert re.search(regex, line), name
    train = d.find_step(definition, d.S_TRAIN)["Arguments"]
    assert train["Environment"][MODE_VARIABLE] == "train"
    assert train["Environment"]["FI_PROVIDER"] == "efa"
    assert "NCCL_SOCKET_IFNAME" not in train["Environment"]  # the launcher derives it per host
    assert train["CheckpointConfig"] == {"S3Uri": "s3://store/r/checkpoints/", "LocalPath": "/opt/ml/checkpoints"}
    assert train["RetryStrategy"]["MaximumRetryAttempts"] >= 1
    step = d.find_step(definition, d.S_TRAIN)
    assert any("SageMaker.CAPACITY_ERROR" in p["ExceptionType"] for p in step["RetryPolicies"])
    channels = {c["ChannelName"]: c for c in train["InputDataConfig"]}
    assert channels["train"]["DataSource"]["S3DataSource"]["S3Uri"] == {"Get": "Parameters.DataUri"}
    assert channels["model"]["DataSource"]["S3DataSource"]["S3Uri"] == plan.recipe.model.init_checkpoint
    assert train["ResourceConfig"]["InstanceCount"] == {"Get": "Parameters.InstanceCount"}


def test_hyperparameters_are_the_run_config(definitions):
    from tiered_training.runconfig import RunConfig

    plan, definition = definitions["llama3-1b-bf16"]
    hp = copy.deepcopy(d.find_step(definition, d.S_TRAIN)["Arguments"]["HyperParameters"])
    assert hp["batch.total_steps"] == {"Std:Join": {"On": "", "Values": [{"Get": "Parameters.MaxSteps"}]}}
    hp["batch.total_steps"] = "123"  # what SageMaker substitutes
    config = RunConfig.from_hyperparameters(hp)
    assert config.batch.total_steps == 123
    assert config.model_dump(exclude={"batch"}) == plan.run_config().model_dump(exclude={"batch"})


def test_gate_thresholds_and_fail_messages(definitions):
    plan, definition = definitions["llama3-8b-fp8"]
    gate = d.find_step(definition, d.S_GATE)["Arguments"]
    throughput, memory = gate["Conditions"]
    assert throughput["RightValue"] == pytest.approx(plan.recipe.probe.min_throughput_fraction * plan.estimates.tokens_per_second_per_gpu, abs=0.01)
    assert memory["RightValue"] == plan.tier.memory_headroom
    assert [s["Name"] for s in gate["IfSteps"]] == ["Train"]
    for name, word in ((d.S_FAIL_THROUGHPUT, "throughput"), (d.S_FAIL_MEMORY, "memory")):
        message = d.find_step(definition, name)["Arguments"]["ErrorMessage"]["Std:Join"]["Values"]
        text = "".join(v if isinstance(v, str) else "<value>" for v in message)
        assert f"probe {word} check failed" in text and "<value>" in text


def test_spot_and_training_plan(tmp_path):
    path = write_yaml(tmp_path / "s.yaml", recipe_dict(**{
        "compute.spot": True, "compute.max_runtime_hours": 10, "compute.max_wait_hours": 20,
        "compute.training_plan_arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/x",
    }))
    definition = d.build_definition(plan_file(path), RESOURCES)
    train = d.find_step(definition, d.S_TRAIN)["Arguments"]
    assert train["EnableManagedSpotTraining"] is True
    assert train["StoppingCondition"] == {"MaxRuntimeInSeconds": 36000, "MaxWaitTimeInSeconds": 72000}
    assert train["ResourceConfig"]["TrainingPlanArn"].endswith("training-plan/x")
    assert d.validate_definition(definition) == []


def test_botocore_catches_a_misspelt_field_and_a_wrong_type(definitions):
    _plan, definition = definitions["llama3-1b-bf16"]
    broken = copy.deepcopy(definition)
    args = d.find_step(broken, d.S_TRAIN)["Arguments"]
    args["ResourceConfig"]["InstanceTyp"] = args["ResourceConfig"].pop("InstanceType")
    args["StoppingCondition"]["MaxRuntimeInSeconds"] = "one day"
    problems = d.validate_definition(broken)
    assert any("InstanceTyp" in p and "step Train" in p for p in problems)
    assert any("MaxRuntimeInSeconds" in p for p in problems)


def test_other_checks(definitions):
    _plan, definition = definitions["llama3-1b-bf16"]
    broken = copy.deepcopy(definition)
    broken["Parameters"][0]["Name"] = "Instance Count"
    d.find_step(broken, d.S_PROBE)["Name"] = "Probe!"
    args = d.find_step(broken, d.S_TRAIN)["Arguments"]
    args["HyperParameters"]["x"] = "y" * 2501
    args["Environment"]["BAD-NAME"] = "1"
    problems = "\n".join(d.validate_definition(broken, body="x" * (d.MAX_BODY_CHARS + 1)))
    for needle in ("'Instance Count'", "'Probe!'", "HyperParameters.x", "BAD-NAME", "unknown parameter 'InstanceCount'",
                   "unknown step 'Probe'", "definition body"):
        assert needle in problems, needle


def test_placeholders_are_typed():
    args = d.placeholder_arguments({"ResourceConfig": {"InstanceCount": {"Get": "Parameters.X"}, "InstanceType": "${Token[T.1]}"}})
    assert args["ResourceConfig"]["InstanceCount"] == 1
    assert isinstance(args["ResourceConfig"]["InstanceType"], str)


def test_definition_is_json_and_deterministic(definitions):
    plan, definition = definitions["qwen2.5-14b-fp8"]
    assert d.to_json(d.build_definition(plan, RESOURCES)) == d.to_json(definition)
    json.loads(d.to_json(definition))


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, tiered_training.definition, tiered_training.start; print('aws_cdk' in sys.modules, 'boto3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    assert out == "False False"
