"""Each Training step's CreateTrainingJob arguments, field by field, for the Probe and the full run."""

from __future__ import annotations

import dataclasses
import math

import pytest
from support import recipe_dict, write_yaml

from tiered_training.catalog import environment
from tiered_training.pipeline import definition as d
from tiered_training.planning import probe
from tiered_training.planning.planner import plan_file

RESOURCES = d.PipelineResources(
    role_arn="arn:aws:iam::123456789012:role/exec",
    image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
    checkpoint_s3_uri="s3://store/r/checkpoints/",
    output_s3_uri="s3://store/r/output/",
    subnets=("subnet-1", "subnet-2"),
    security_group_ids=("sg-1",),
    extra_tags={"cost-centre": "ml", "team": "platform"},
)
ASKED = {
    "model.init_checkpoint": "s3://models/llama/hf/",
    "data.validation_uri": "s3://bucket-for-tests/validation/",
    "data.input_mode": "File",
    "tags": {"team": "research", "project": "tt"},
}


def plan_of(tmp_path, **overrides):
    return plan_file(write_yaml(tmp_path / "r.yaml", recipe_dict(**{**ASKED, **overrides})))


def channels(args):
    return {c["ChannelName"]: (c["DataSource"]["S3DataSource"]["S3Uri"], c["InputMode"]) for c in args["InputDataConfig"]}


def test_probe_and_train_differ_where_they_must(tmp_path):
    plan = plan_of(tmp_path)
    probe = d.training_arguments(plan, RESOURCES, probe=True)
    train = d.training_arguments(plan, RESOURCES, probe=False)
    assert probe["Environment"][d.MODE_VARIABLE] == "probe" and train["Environment"][d.MODE_VARIABLE] == "train"
    # The data channel follows the DataUri parameter; the checkpoint is read whole (File); the
    # validation shards only in the full run.
    data = ({"Get": "Parameters.DataUri"}, "File")
    assert channels(probe) == {"train": data, "model": ("s3://models/llama/hf/", "File")}
    assert channels(train) == {"train": data, "model": ("s3://models/llama/hf/", "File"),
                               "validation": ("s3://bucket-for-tests/validation/", "File")}
    for channel in train["InputDataConfig"]:
        assert channel["DataSource"]["S3DataSource"]["S3DataType"] == "S3Prefix"
        assert channel["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "FullyReplicated"
    assert probe["OutputDataConfig"] == {"S3OutputPath": "s3://store/r/output/probe"}
    assert train["OutputDataConfig"] == {"S3OutputPath": "s3://store/r/output/model"}
    # Only the full run keeps checkpoints, retries in-job and uploads TensorBoard files.
    assert "CheckpointConfig" not in probe and "RetryStrategy" not in probe and "TensorBoardOutputConfig" not in probe
    # A new run's checkpoints live under a prefix named after the execution (docs/runs.md).
    assert train["CheckpointConfig"] == {
        "S3Uri": {"Std:Join": {"On": "", "Values": [
            "s3://store/r/checkpoints/runs/", {"Get": "Execution.PipelineExecutionId"}, "/"]}},
        "LocalPath": "/opt/ml/checkpoints"}
    assert train["RetryStrategy"] == {"MaximumRetryAttempts": d.JOB_RETRY_ATTEMPTS}
    assert train["TensorBoardOutputConfig"] == {"S3OutputPath": "s3://store/r/output/tensorboard",
                                                "LocalPath": "/opt/ml/output/tensorboard"}
    # Only the probe reports metrics to the gate and keeps its instances warm for the full run.
    assert [m["Name"] for m in probe["AlgorithmSpecification"]["MetricDefinitions"]][:3] == [
        "probe:tokens_per_second", "probe:peak_memory_fraction", "probe:best_candidate"]
    # the run's last segment: its final metrics, for the Register step
    assert [m["Name"] for m in train["AlgorithmSpecification"]["MetricDefinitions"]][0] == "train:loss"
    assert probe["ResourceConfig"]["KeepAlivePeriodInSeconds"] == d.WARM_POOL_SECONDS
    assert "KeepAlivePeriodInSeconds" not in train["ResourceConfig"]  # a run that no job precedes (no probe)
    # Train after the Probe takes the probe's pool: AWS matches it only if it asks for a warm pool of its own;
    # nothing follows it, so its own pool idles for a minute at most.
    after_probe = d.Segment(d.EXECUTION_ID, False, 1, 1, after_probe=True)
    assert d.training_arguments(plan, RESOURCES, segment=after_probe)["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 60
    for args in (probe, train):
        assert args["AlgorithmSpecification"]["TrainingImage"] == RESOURCES.image_uri
        assert args["AlgorithmSpecification"]["TrainingInputMode"] == "File"
        assert args["RoleArn"] == RESOURCES.role_arn
        assert args["ResourceConfig"]["InstanceType"] == "ml.p6-b200.48xlarge"
        assert args["ResourceConfig"]["VolumeSizeInGB"] == d.VOLUME_SIZE_GB
        assert args["VpcConfig"] == {"Subnets": ["subnet-1", "subnet-2"], "SecurityGroupIds": ["sg-1"]}
        assert "EnableManagedSpotTraining" not in args


def test_tags_are_the_recipes_then_the_resources_then_the_recipe_name(tmp_path):
    plan = plan_of(tmp_path)
    args = d.training_arguments(plan, RESOURCES, probe=False)
    assert args["Tags"] == [
        {"Key": "team", "Value": "platform"},  # the resources' value wins over the recipe's
        {"Key": "project", "Value": "tt"},
        {"Key": "cost-centre", "Value": "ml"},
        {"Key": "tiered-training:recipe", "Value": "unit-test"},
    ]
    assert d.tags_for(plan) == {"team": "research", "project": "tt", "tiered-training:recipe": "unit-test"}


def test_the_family_environment_leaves_out_what_each_host_works_out(tmp_path):
    plan = plan_of(tmp_path)
    env = d.family_environment(plan)
    full = environment.family_environment("ml.p6-b200.48xlarge")
    assert env == {k: v for k, v in full.items() if k != "NCCL_SOCKET_IFNAME"}
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_DEBUG"] == "WARN"
    assert list(env) == sorted(env)
    run_env = {d.RUN_URI_VARIABLE: d.run_checkpoint_uri(RESOURCES, d.EXECUTION_ID),
               d.EXECUTION_VARIABLE: {"Get": "Execution.PipelineExecutionArn"}}
    assert d.training_arguments(plan, RESOURCES, probe=False)["Environment"] == {**env, d.MODE_VARIABLE: "train", **run_env}
    assert d.training_arguments(plan, RESOURCES, probe=True)["Environment"] == {**env, d.MODE_VARIABLE: "probe"}


def test_spot_has_no_warm_pool_and_waits_at_least_its_runtime(tmp_path):
    plan = plan_of(tmp_path, **{"compute.spot": True, "compute.max_runtime_hours": 3})
    probe = d.training_arguments(plan, RESOURCES, probe=True)
    train = d.training_arguments(plan, RESOURCES, probe=False)
    assert "KeepAlivePeriodInSeconds" not in probe["ResourceConfig"]
    assert probe["EnableManagedSpotTraining"] is True and train["EnableManagedSpotTraining"] is True
    # SageMaker rejects a spot job whose MaxWait is below its MaxRuntime.
    assert train["StoppingCondition"]["MaxRuntimeInSeconds"] == 3 * 3600 <= train["StoppingCondition"]["MaxWaitTimeInSeconds"]
    assert probe["StoppingCondition"]["MaxRuntimeInSeconds"] == 2 * 3600 <= probe["StoppingCondition"]["MaxWaitTimeInSeconds"]


def test_without_vpc_kms_or_tensorboard(tmp_path):
    plain = d.PipelineResources("arn:aws:iam::123456789012:role/exec", "image", "s3://b/c/", "s3://b/o",
                                kms_key_id="arn:aws:kms:us-east-1:123456789012:key/k")
    plan = plan_of(tmp_path, **{"tracking.tensorboard": False})
    train = d.training_arguments(plan, plain, probe=False)
    assert "VpcConfig" not in train and "TensorBoardOutputConfig" not in train
    assert train["OutputDataConfig"] == {"S3OutputPath": "s3://b/o/model", "KmsKeyId": plain.kms_key_id}


def test_steps_carry_their_retry_policies_and_descriptions(tmp_path):
    plan = plan_of(tmp_path, **{"probe.steps": 9})
    body = d.build_definition(plan, RESOURCES)
    probe, train = d.find_step(body, d.S_PROBE), d.find_step(body, d.S_TRAIN)
    assert probe["Description"] == (
        "Short run of 3 candidate configuration(s), 9 steps each in its own launch: measures tokens/s and peak memory, "
        "names the fastest under the memory limit")
    assert train["Description"] == (
        f"Full run: {plan.estimates.total_steps} steps, a new run, of the candidate the Probe chose")
    assert d.find_step(body, d.S_TRAIN_WITHOUT_PROBE)["Description"] == "Full run without a probe (SkipProbe=true), a new run"
    assert d.find_step(body, d.S_RESUME)["Description"] == "Resumes the run named by RunId from its checkpoints"
    for step in (probe, train):
        assert step["Type"] == "Training"
        assert step["RetryPolicies"] == [d.CAPACITY_RETRY, d.RESOURCE_LIMIT_RETRY, d.SERVICE_RETRY]
    assert body["Version"] == "2020-12-01"
    assert body["Metadata"] == {"GeneratedBy": "tiered-training", "Recipe": "unit-test"}
    assert body["Parameters"] == [
        {"Name": "InstanceCount", "Type": "Integer", "DefaultValue": 1},
        {"Name": "MaxSteps", "Type": "Integer", "DefaultValue": plan.estimates.total_steps},
        {"Name": "DataUri", "Type": "String", "DefaultValue": "s3://bucket-for-tests/tokens/"},
        {"Name": "SkipProbe", "Type": "Boolean", "DefaultValue": False},
        {"Name": "RunId", "Type": "String", "DefaultValue": "new"},
    ]
    assert d.to_json(body) == d.to_json(d.build_definition(plan, RESOURCES)) and ", " not in d.to_json(body)[:200]


def test_probe_seconds_cover_every_launch(tmp_path):
    plan = plan_of(tmp_path, **{"probe.steps": 9})
    # each candidate's launch: its start-up allowance, then 9 steps at its own predicted speed
    launches = probe.plan_launches(plan)
    assert [launch.number for launch in launches] == [1, 2, 3] and all(launch.steps == 9 for launch in launches)
    assert len({launch.step_seconds for launch in launches}) > 1
    # and the health check before the candidates
    assert probe.probe_seconds(plan) == pytest.approx(
        probe.HEALTH_CHECK_SECONDS + sum(launch.seconds for launch in launches), rel=1e-12
    )
    # a probe that takes longer than the probe's limit still gets the time, within the job runtime
    slow = plan_of(tmp_path, **{"probe.steps": 9, "compute.max_runtime_hours": 12.0})
    long_plan = dataclasses.replace(slow, candidates=tuple(
        dataclasses.replace(c, tokens_per_second_per_gpu=c.tokens_per_second_per_gpu / 1000) for c in slow.candidates))
    needed = probe.probe_seconds(long_plan)
    assert 2 * 3600 < needed < 12 * 3600
    assert d.training_arguments(long_plan, RESOURCES, probe=True)["StoppingCondition"]["MaxRuntimeInSeconds"] == (
        math.ceil(needed))
    assert d.training_arguments(slow, RESOURCES, probe=True)["StoppingCondition"]["MaxRuntimeInSeconds"] == 2 * 3600


def test_join_uri_has_one_slash():
    assert d._join_uri("s3://b/o/", "model") == "s3://b/o/model" == d._join_uri("s3://b/o", "model")
