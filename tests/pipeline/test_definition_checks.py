"""validate_definition: each rule SageMaker applies, with the exact problem a user reads at synth."""

from __future__ import annotations

import copy

import pytest
from support import recipe_dict, write_yaml

from tiered_training.pipeline import definition as d
from tiered_training.pipeline import validation
from tiered_training.planning.planner import plan_file

RESOURCES = d.PipelineResources("arn:aws:iam::123456789012:role/exec", "image", "s3://b/c/", "s3://b/o/")


@pytest.fixture
def body(tmp_path):
    return d.build_definition(plan_file(write_yaml(tmp_path / "r.yaml", recipe_dict())), RESOURCES)


def train_args(body):
    return d.find_step(body, d.S_TRAIN)["Arguments"]


def test_a_valid_definition_has_no_problems(body):
    assert validation.validate_definition(body) == []
    assert validation.validate_training_arguments(train_args(body), "Train") == []


def test_version_parameters_and_step_names(body):
    broken = copy.deepcopy(body)
    broken["Version"] = "2019-01-01"
    broken["Parameters"].append({"Name": "DataUri", "Type": "String"})
    broken["Parameters"].append({"Name": "Bad Name", "Type": "Text"})
    d.find_step(broken, d.S_FAIL_MEMORY)["Name"] = d.S_FAIL_THROUGHPUT
    d.find_step(broken, d.S_GATE_REASON)["Name"] = "x" * 65
    problems = validation.validate_definition(broken)
    assert "Version: '2019-01-01', expected '2020-12-01'" in problems
    assert f"parameter 'Bad Name': does not match {d.PARAMETER_NAME_PATTERN}" in problems
    assert "parameter Bad Name: unknown type 'Text'" in problems
    assert "parameters: duplicate names in ['InstanceCount', 'MaxSteps', 'DataUri', 'SkipProbe', 'RunId', 'DataUri', 'Bad Name']" in problems
    duplicate = [p for p in problems if p.startswith("steps: duplicate names in [")]
    assert len(duplicate) == 1 and duplicate[0].count("'FailThroughput'") == 2
    assert f"step '{'x' * 65}': does not match {d.STEP_NAME_PATTERN}" in problems
    for kind in ("String", "Integer", "Boolean", "Float"):
        ok = copy.deepcopy(body)
        ok["Parameters"].append({"Name": "Extra", "Type": kind})
        assert validation.validate_definition(ok) == [], kind


def test_references_must_resolve(body):
    broken = copy.deepcopy(body)
    args = train_args(broken)
    args["ResourceConfig"]["InstanceCount"] = d.param("Nodes")
    args["Environment"]["X"] = d.as_string(d.get("Steps.Missing.FinalMetricDataList['m'].Value"))
    problems = validation.validate_definition(broken)
    # Each Training step has arguments of its own (TrainWithoutProbe and Resume are untouched), and
    # a Condition's arguments hold its branches: Train is inside Gate, ProbeOrSkip and NewRunOrResume.
    # Steps.Probe, the real parameters and Execution.PipelineExecutionId resolve.
    assert problems == [
        f"step {step}: references unknown {kind}"
        for step in ("NewRunOrResume", "ProbeOrSkip", "Gate", "Train")
        for kind in ("parameter 'Nodes'", "step 'Missing'")
    ]


def test_body_size(body):
    big = {**body, "Metadata": {"Pad": "x" * d.MAX_BODY_CHARS}}
    size = len(d.to_json(big))
    assert validation.validate_definition(big) == [f"definition body: {size} characters; the limit is {d.MAX_BODY_CHARS}"]
    assert validation.validate_definition(body, body="x" * d.MAX_BODY_CHARS) == []
    assert validation.validate_definition(body, body="x" * (d.MAX_BODY_CHARS + 1)) == [
        f"definition body: {d.MAX_BODY_CHARS + 1} characters; the limit is {d.MAX_BODY_CHARS}"]


def test_training_argument_limits(body):
    args = copy.deepcopy(train_args(body))
    assert validation.validate_training_arguments(args) == []
    args["HyperParameters"] = {f"k{i}": "v" for i in range(101)}
    args["HyperParameters"]["k0"] = "y" * 2501
    args["HyperParameters"]["k1"] = "y" * 2500
    args["Environment"] = {f"V{i}": "1" for i in range(101)}
    args["Environment"]["1BAD"] = "1"
    args["Environment"]["LONG"] = "z" * 513
    args["Environment"]["EDGE"] = "z" * 512
    args["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": f"m{i}", "Regex": "a=(1)"} for i in range(41)]
    args["AlgorithmSpecification"]["MetricDefinitions"][3]["Regex"] = "(unclosed"
    problems = validation.validate_training_arguments(args, "Probe")
    assert problems == [
        "step Probe: HyperParameters: 101 keys; SageMaker allows 100",
        "step Probe: HyperParameters.k0: 2501 characters; the limit is 2500",
        "step Probe: Environment: 104 entries; SageMaker allows 100",
        "step Probe: Environment.1BAD: not a valid variable name",
        "step Probe: Environment.LONG: 513 characters; the limit is 512",
        "step Probe: AlgorithmSpecification.MetricDefinitions: 41; the limit is 40",
        "step Probe: AlgorithmSpecification.MetricDefinitions[3].Regex: missing ), unterminated subpattern at position 0",
    ]
    at_limits = copy.deepcopy(train_args(body))
    at_limits["HyperParameters"] = {f"k{i}": "v" for i in range(100)}
    at_limits["Environment"] = {f"V{i}": "1" for i in range(100)}
    at_limits["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": f"m{i}", "Regex": "a=(1)"} for i in range(40)]
    assert validation.validate_training_arguments(at_limits) == []


def test_botocore_shape_errors_name_the_field(body):
    args = copy.deepcopy(train_args(body))
    args["ResourceConfig"]["VolumeSizeInGB"] = "big"
    args["RoleArn"] = 7
    problems = validation.validate_training_arguments(args, "Train")
    assert all(p.startswith("step Train: CreateTrainingJob ") for p in problems)
    text = "\n".join(problems)
    assert "ResourceConfig.VolumeSizeInGB" in text and "RoleArn" in text
    assert validation.validate_training_arguments(args)[0].startswith("CreateTrainingJob ")  # no step name given


def test_pipeline_expressions_and_tokens_become_typed_placeholders():
    args = {
        "RoleArn": "${Token[TOKEN.12]}",
        "ResourceConfig": {"InstanceCount": d.param("InstanceCount"), "InstanceType": "ml.p5.48xlarge", "VolumeSizeInGB": 200},
        "StoppingCondition": {"MaxRuntimeInSeconds": d.as_string(d.param("X"))},
        "HyperParameters": {"a": d.as_string(d.param("MaxSteps")), "b": "1"},
        "Environment": {"E": {"Std:JsonGet": {"Path": "x"}}},
        "InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": d.param("DataUri")}}}],
    }
    concrete = validation.placeholder_arguments(args)
    assert concrete["TrainingJobName"] == "pipelines-placeholder"
    assert concrete["RoleArn"] == "x" * 20  # the shape's minimum length
    assert concrete["ResourceConfig"] == {"InstanceCount": 1, "InstanceType": "ml.p5.48xlarge", "VolumeSizeInGB": 200}
    assert concrete["StoppingCondition"]["MaxRuntimeInSeconds"] == 1
    assert concrete["HyperParameters"] == {"a": "x", "b": "1"}
    assert concrete["Environment"] == {"E": "x"}
    assert concrete["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == "x"
    assert validation.placeholder_arguments({"RoleArn": "${Token[T.1]}"}, is_placeholder=lambda v: False)["RoleArn"] == "${Token[T.1]}"
    assert validation.cdk_token("arn:${Token[T.1]}") and not validation.cdk_token("arn:aws:iam::1:role/r") and not validation.cdk_token(7)


def test_walking_steps(body):
    names = [step["Name"] for step in d.iter_steps(body["Steps"])]
    assert names == ["NewRunOrResume", "ProbeOrSkip", "TrainWithoutProbe", "RegisterWithoutProbe", "Probe", "Gate",
                     "Train", "Register", "GateReason", "FailThroughput", "FailMemory", "Resume", "RegisterResume"]
    with pytest.raises(KeyError, match="Nope"):
        d.find_step(body, "Nope")
    assert d.find_step(body, "FailMemory")["Type"] == "Fail"


def test_the_body_is_compact_json_in_the_definitions_order(body):
    import json

    text = d.to_json(body)
    assert json.loads(text) == body
    assert text.startswith('{"Version":"2020-12-01","Metadata":{"GeneratedBy":"tiered-training","Recipe":"unit-test"},"Parameters":')
    assert d._join_uri("s3://b/X/", "model") == "s3://b/X/model"


def test_a_malformed_definition_is_reported_not_crashed_on():
    assert validation.validate_definition({}) == ["Version: None, expected '2020-12-01'"]
    broken = {"Version": "2020-12-01", "Parameters": [{"Type": "String"}],
              "Steps": [{"Type": "Training"}, {"Type": "Condition"}, {"Name": "C", "Type": "Condition", "Arguments": {}}]}
    assert validation.validate_definition(broken) == [
        f"parameter '': does not match {d.PARAMETER_NAME_PATTERN}",
        "steps: duplicate names in ['', '', 'C']",
        f"step '': does not match {d.STEP_NAME_PATTERN}",
        'CreateTrainingJob Missing required parameter in input: "RoleArn"',
        'CreateTrainingJob Missing required parameter in input: "OutputDataConfig"',
        f"step '': does not match {d.STEP_NAME_PATTERN}",
    ]


def test_argument_checks_that_pass(body):
    args = copy.deepcopy(train_args(body))
    args["Environment"]["lower_case_name"] = "1"
    assert validation.validate_training_arguments(args) == []
    args["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": "m"}]  # botocore's problem; nothing to compile
    assert validation.validate_training_arguments(args) == [
        'CreateTrainingJob Missing required parameter in AlgorithmSpecification.MetricDefinitions[0]: "Regex"']
    args["ResourceConfig"] = ["not", "a", "structure"]
    args["RoleArn"] = {"not": "a string"}
    problems = validation.validate_training_arguments(args, "Train")
    assert any("ResourceConfig" in p for p in problems) and any("RoleArn" in p for p in problems)


def test_placeholders_follow_each_members_type():
    expression = d.param("X")
    concrete = validation.placeholder_arguments({
        "EnableManagedSpotTraining": expression,
        "VpcConfig": {"Subnets": expression, "SecurityGroupIds": ["sg-1"]},
        "InputDataConfig": [{"ChannelName": "train", "ShuffleConfig": {"Seed": expression}}],
        "CheckpointConfig": expression,
        "Environment": {"A": expression},
    })
    assert concrete["EnableManagedSpotTraining"] is True
    assert concrete["VpcConfig"] == {"Subnets": [], "SecurityGroupIds": ["sg-1"]}
    assert concrete["InputDataConfig"][0]["ShuffleConfig"]["Seed"] == 1  # a long
    assert concrete["CheckpointConfig"] == {}
    assert concrete["Environment"] == {"A": "x"}
    assert validation._placeholder(None) == "x"


@pytest.fixture
def raw_body(tmp_path):
    recipe = recipe_dict(**{"task": "sft", "model.init_checkpoint": "s3://models/base/", "data.prepare": {}})
    return d.build_definition(plan_file(write_yaml(tmp_path / "raw.yaml", recipe)), RESOURCES)


def test_raw_data_gets_a_prepare_step_whose_property_file_the_training_steps_read(raw_body):
    assert validation.validate_definition(raw_body) == []
    prepare, root = raw_body["Steps"]
    assert prepare["Name"] == d.S_PREPARE and prepare["Type"] == "Processing" and root["DependsOn"] == [d.S_PREPARE]
    arguments = prepare["Arguments"]["AppSpecification"]["ContainerArguments"]
    assert arguments[:6] == ["--input", d.param(d.P_DATA_URI), "--tokenizer", "s3://models/base/", "--prepared",
                             "s3://b/o/prepared/"]
    for name in (d.S_TRAIN, d.S_TRAIN_WITHOUT_PROBE, d.S_RESUME, d.S_PROBE):
        args = d.find_step(raw_body, name)["Arguments"]
        assert args["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == d.prepared_data_uri(), name


def test_property_files_and_processing_arguments_are_checked(raw_body):
    broken = copy.deepcopy(raw_body)
    broken["Steps"][0]["PropertyFiles"][0]["OutputName"] = "elsewhere"
    assert any("property file 'PreparedData' is on output 'elsewhere'" in p for p in validation.validate_definition(broken))
    broken = copy.deepcopy(raw_body)
    broken["Steps"][0]["PropertyFiles"][0]["PropertyFileName"] = "Other"
    assert any("Steps.Prepare.PropertyFiles.PreparedData names no property file of step Prepare" in p
               for p in validation.validate_definition(broken))
    broken = copy.deepcopy(raw_body)
    broken["Steps"][0]["Arguments"]["ProcessingResources"]["ClusterConfig"]["VolumeSizeInGb"] = 1
    assert any("CreateProcessingJob" in p and "VolumeSizeInGb" in p for p in validation.validate_definition(broken))


def test_a_metric_the_probe_does_not_define_never_resolves(body):
    # SageMaker lists only the metrics of a job's MetricDefinitions: Train's run.candidate and the Fail messages
    # read probe:best_candidate, so a Probe without it is refused at synth, not when the gate runs.
    broken = copy.deepcopy(body)
    definitions = d.find_step(broken, d.S_PROBE)["Arguments"]["AlgorithmSpecification"]["MetricDefinitions"]
    definitions[:] = [m for m in definitions if m["Name"] != "probe:best_candidate"]
    problems = validation.validate_definition(broken)
    ref = "Steps.Probe.FinalMetricDataList['probe:best_candidate'].Value"
    readers = {p.split(":")[0] for p in problems if f"{ref} names no metric of step Probe's MetricDefinitions" in p}
    assert {"step Train", "step FailThroughput", "step FailMemory"} <= readers
    assert all("probe:best_candidate" in p for p in problems)
