"""The pipeline definition, without CDK: shape, names, botocore validation, container contract."""

from __future__ import annotations

import copy
import json
import re

import pytest
from support import RECIPES, recipe_dict, write_yaml

from tiered_training.contract import metrics
from tiered_training.pipeline import definition as d
from tiered_training.pipeline import validation
from tiered_training.planning.planner import plan_file

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
        assert validation.validate_definition(definition) == [], name
        assert len(d.to_json(definition)) < d.MAX_BODY_CHARS / 20


def test_step_and_parameter_names(definitions):
    _plan, definition = next(iter(definitions.values()))
    names = [s["Name"] for s in d.iter_steps(definition["Steps"])]
    assert names == ["NewRunOrResume", "ProbeOrSkip", "TrainWithoutProbe", "RegisterWithoutProbe", "Probe", "Gate",
                     "Train", "Register", "GateReason", "FailThroughput", "FailMemory", "Resume", "RegisterResume"]
    for name in names:
        assert re.fullmatch(d.STEP_NAME_PATTERN, name)
    assert [p["Name"] for p in definition["Parameters"]] == ["InstanceCount", "MaxSteps", "DataUri", "SkipProbe", "RunId"]


def test_probe_uses_the_container_contract_and_metric_catalogue(definitions):
    from training.launcher import MODE_VARIABLE

    plan, definition = definitions["llama3-8b-fp8"]
    probe = d.find_step(definition, d.S_PROBE)["Arguments"]
    assert probe["Environment"][MODE_VARIABLE] == "probe"
    assert "CheckpointConfig" not in probe
    regexes = {m["Name"]: m["Regex"] for m in probe["AlgorithmSpecification"]["MetricDefinitions"]}
    # The summary, then each of the plan's candidates' figures (3 of them: tuning auto).
    assert len(plan.candidates) == 3
    assert regexes == {name: regex for name, (_fmt, regex) in metrics.probe_metric_definitions(3).items()}
    assert len(regexes) == 3 + 3 * 3 and "probe:candidate3:peak_reserved_fraction" in regexes
    # The regexes parse what the container prints, each only its own candidate's line.
    for name, (fmt, _regex) in metrics.probe_metric_definitions(3).items():
        line = fmt.format(3 if "best_candidate" in name else 1234.5)
        assert [other for other, pattern in regexes.items() if re.search(pattern, line)] == [name]
    train = d.find_step(definition, d.S_TRAIN)["Arguments"]
    assert train["Environment"][MODE_VARIABLE] == "train"
    assert train["Environment"]["FI_PROVIDER"] == "efa"
    assert "NCCL_SOCKET_IFNAME" not in train["Environment"]  # the launcher derives it per host
    assert train["CheckpointConfig"] == {"LocalPath": "/opt/ml/checkpoints", "S3Uri": {"Std:Join": {"On": "", "Values": [
        "s3://store/r/checkpoints/runs/", {"Get": "Execution.PipelineExecutionId"}, "/"]}}}
    assert train["RetryStrategy"]["MaximumRetryAttempts"] >= 1
    step = d.find_step(definition, d.S_TRAIN)
    assert any("SageMaker.CAPACITY_ERROR" in p["ExceptionType"] for p in step["RetryPolicies"])
    channels = {c["ChannelName"]: c for c in train["InputDataConfig"]}
    assert channels["train"]["DataSource"]["S3DataSource"]["S3Uri"] == {"Get": "Parameters.DataUri"}
    assert channels["model"]["DataSource"]["S3DataSource"]["S3Uri"] == plan.recipe.model.init_checkpoint
    assert train["ResourceConfig"]["InstanceCount"] == {"Get": "Parameters.InstanceCount"}


def test_hyperparameters_are_the_run_config(definitions):
    from tiered_training.contract.runconfig import RunConfig

    plan, definition = definitions["llama3-1b-bf16"]
    hp = copy.deepcopy(d.find_step(definition, d.S_TRAIN)["Arguments"]["HyperParameters"])
    assert hp["batch.total_steps"] == {"Std:Join": {"On": "", "Values": [{"Get": "Parameters.MaxSteps"}]}}
    hp["batch.total_steps"] = "123"  # what SageMaker substitutes
    hp["run.id"], hp["run.data_uri"] = '"abc123"', '"s3://data/x/"'
    # The candidate the Probe chose: its FinalMetricDataList value (a float) as a string.
    assert hp["run.candidate"] == {"Std:Join": {"On": "", "Values": [
        {"Get": "Steps.Probe.FinalMetricDataList['probe:best_candidate'].Value"}]}}
    for rendered in ("2.0", "2"):  # a Float metric joined into a string: either form reads as candidate 2
        hp["run.candidate"] = rendered
        config = RunConfig.from_hyperparameters(hp)
        assert config.batch.total_steps == 123 and config.run.candidate == 2
    assert config.model_dump(exclude={"batch", "run"}) == plan.run_config().model_dump(exclude={"batch", "run"})


def test_gate_thresholds_and_fail_messages(definitions):
    plan, definition = definitions["llama3-8b-fp8"]
    gate = d.find_step(definition, d.S_GATE)["Arguments"]
    throughput, memory = gate["Conditions"]
    assert throughput["RightValue"] == pytest.approx(plan.recipe.probe.min_throughput_fraction * plan.estimates.tokens_per_second_per_gpu, abs=0.01)
    assert memory["RightValue"] == plan.tier.memory_headroom
    assert [s["Name"] for s in gate["IfSteps"]] == ["Train", "Register"]
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
    # The probe waits for spot capacity one hour at most beyond its runtime, not the run's wait.
    probe = d.find_step(definition, d.S_PROBE)["Arguments"]
    assert probe["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 7200 + 3600}
    assert validation.validate_definition(definition) == []


def test_botocore_catches_a_misspelt_field_and_a_wrong_type(definitions):
    _plan, definition = definitions["llama3-1b-bf16"]
    broken = copy.deepcopy(definition)
    args = d.find_step(broken, d.S_TRAIN)["Arguments"]
    args["ResourceConfig"]["InstanceTyp"] = args["ResourceConfig"].pop("InstanceType")
    args["StoppingCondition"]["MaxRuntimeInSeconds"] = "one day"
    problems = validation.validate_definition(broken)
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
    problems = "\n".join(validation.validate_definition(broken, body="x" * (d.MAX_BODY_CHARS + 1)))
    for needle in ("'Instance Count'", "'Probe!'", "HyperParameters.x", "BAD-NAME", "unknown parameter 'InstanceCount'",
                   "unknown step 'Probe'", "definition body"):
        assert needle in problems, needle


def test_placeholders_are_typed():
    args = validation.placeholder_arguments({"ResourceConfig": {"InstanceCount": {"Get": "Parameters.X"}, "InstanceType": "${Token[T.1]}"}})
    assert args["ResourceConfig"]["InstanceCount"] == 1
    assert isinstance(args["ResourceConfig"]["InstanceType"], str)


def test_definition_is_json_and_deterministic(definitions):
    plan, definition = definitions["qwen2.5-14b-fp8"]
    assert d.to_json(d.build_definition(plan, RESOURCES)) == d.to_json(definition)
    json.loads(d.to_json(definition))


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, tiered_training.pipeline.definition, tiered_training.aws.start; print('aws_cdk' in sys.modules, 'boto3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    assert out == "False False"


def test_a_new_execution_is_a_new_run_and_runid_resumes_a_named_one(definitions):
    """RunId 'new' (the default): the run is named after the execution, under runs/<execution id>/; any other
    RunId resumes that run from its own prefix, with no probe, and the launcher knows it is a resume."""
    _plan, definition = definitions["llama3-1b-bf16"]
    (runid,) = [p for p in definition["Parameters"] if p["Name"] == d.P_RUN_ID]
    assert runid == {"Name": "RunId", "Type": "String", "DefaultValue": "new"}
    root = definition["Steps"][0]
    assert root["Arguments"]["Conditions"] == [{"Type": "Equals", "LeftValue": {"Get": "Parameters.RunId"}, "RightValue": "new"}]
    for name, run_id, resume in (("Train", d.EXECUTION_ID, "false"), ("TrainWithoutProbe", d.EXECUTION_ID, "false"),
                                 ("Resume", {"Get": "Parameters.RunId"}, "true")):
        args = d.find_step(definition, name)["Arguments"]
        assert args["CheckpointConfig"]["S3Uri"]["Std:Join"]["Values"] == ["s3://store/r/checkpoints/runs/", run_id, "/"]
        assert args["HyperParameters"]["run.id"] == {"Std:Join": {"On": "", "Values": ['"', run_id, '"']}}
        assert args["HyperParameters"]["run.resume"] == resume
    assert [s["Name"] for s in root["Arguments"]["ElseSteps"]] == ["Resume", "RegisterResume"]


def test_a_run_longer_than_a_job_is_a_chain_of_segments(definitions):
    """qwen2.5-32b-hybrid plans about 184 h under AWS's default 5-day job limit: 2 segments in each chain, each after
    the one before, each its share of the run, each handing its instances to the next (a warm pool)."""
    plan, definition = definitions["qwen2.5-32b-hybrid"]
    assert plan.segments == 2
    for chain in d.TRAIN_CHAINS:
        names = d.chain_steps(definition, chain)
        assert names == [chain, f"{chain}-2"]
        steps = [d.find_step(definition, name) for name in names]
        assert [s.get("DependsOn") for s in steps] == [None, [chain]]
        assert [s["Arguments"]["HyperParameters"]["run.segment"] for s in steps] == ["1", "2"]
        assert {s["Arguments"]["HyperParameters"]["run.segments"] for s in steps} == {"2"}
        # the last takes the pool too, so it asks for one (AWS matches only such a job), for a minute
        keep = [s["Arguments"]["ResourceConfig"].get("KeepAlivePeriodInSeconds") for s in steps]
        assert keep == [d.WARM_POOL_SECONDS, d.LAST_WARM_POOL_SECONDS] == [600, 60]
        # every Training step retries a resource limit (another execution holds the instances) for a bounded time
        assert {"ExceptionType": ["SageMaker.RESOURCE_LIMIT"], "IntervalSeconds": 1800, "BackoffRate": 2.0,
                "MaxAttempts": 4} in steps[0]["RetryPolicies"]
        uris = {json.dumps(s["Arguments"]["CheckpointConfig"]["S3Uri"]) for s in steps}
        assert len(uris) == 1  # one run, one prefix


def test_no_training_step_asks_for_more_than_the_accounts_runtime_quota(definitions):
    """AWS's default quota for the longest training-job run time is 5 days; a template asks for more only where
    its recipe states the account's raised value (compute.quotas)."""
    from tiered_training.catalog import quotas

    default = quotas()["training-job-max-runtime"].default
    for name, (plan, definition) in definitions.items():
        limit = plan.recipe.compute.quota("training-job-max-runtime")
        for step in d.iter_steps(definition["Steps"]):
            if step["Type"] == "Training":
                runtime = step["Arguments"]["StoppingCondition"]["MaxRuntimeInSeconds"]
                assert runtime <= limit, (name, step["Name"])
                if "training-job-max-runtime" not in plan.recipe.compute.quotas:
                    assert runtime <= default, (name, step["Name"])


def test_depends_on_and_execution_variables_are_validated(definitions):
    _plan, definition = definitions["qwen2.5-32b-hybrid"]
    broken = copy.deepcopy(definition)
    d.find_step(broken, "Train-2")["DependsOn"] = ["Trian"]
    d.find_step(broken, "Train")["Arguments"]["CheckpointConfig"]["S3Uri"] = {"Get": "Execution.RunId"}
    problems = "\n".join(validation.validate_definition(broken))
    assert "DependsOn names no step 'Trian'" in problems and "unknown execution variable 'RunId'" in problems
