"""Recipe fidelity: what a recipe asks for arrives in the container unchanged.

Each non-default value travels recipe -> Plan.run_config() -> the Train step's HyperParameters
(rendered by the pipeline interpreter, as SageMaker passes them) -> RunConfig.from_hyperparameters
(what the container reads). Defaults are pinned by their documented values.
"""

from __future__ import annotations

import math

import pytest
from support import recipe_dict, write_yaml

from tiered_training.contract.runconfig import RunConfig
from tiered_training.pipeline import definition as d
from tiered_training.planning.planner import plan_file
from tiered_training.rehearse.interpreter import Interpreter, JobAttempt

EXECUTION_ID = "fidelity0001"  # the interpreter's PipelineExecutionId: a new run's id

RESOURCES = d.PipelineResources("arn:aws:iam::000000000000:role/r", "image", "s3://b/ck/", "s3://b/out")

# Every value differs from its default (recipe.py), so a default or a swapped field shows.
ASKED = {
    "optimizer.lr": 1.7e-4,
    "optimizer.min_lr_ratio": 0.05,
    "optimizer.schedule": "linear",
    "optimizer.beta1": 0.85,
    "optimizer.beta2": 0.975,
    "optimizer.weight_decay": 0.033,
    "optimizer.grad_clip": 0.7,
    "optimizer.warmup_tokens": 50_000_000,
    "checkpointing.interval_minutes": 17.5,
    "checkpointing.keep_last": 5,
    "checkpointing.shutdown_deadline_seconds": 240,
    "data.seed": 4242,
    "data.token_dtype": "uint16",
    "probe.steps": 7,
    "validation.interval_minutes": 12.0,
    "validation.batches": 3,
    "tuning.batch_ramp": False,
}
# recipe field -> RunConfig field, where they are carried one to one.
CARRIED = {
    "optimizer.lr": "optimizer.lr",
    "optimizer.min_lr_ratio": "optimizer.min_lr_ratio",
    "optimizer.schedule": "optimizer.schedule",
    "optimizer.beta1": "optimizer.beta1",
    "optimizer.beta2": "optimizer.beta2",
    "optimizer.weight_decay": "optimizer.weight_decay",
    "optimizer.grad_clip": "optimizer.grad_clip",
    "checkpointing.interval_minutes": "checkpoint.interval_minutes",
    "checkpointing.keep_last": "checkpoint.keep_last",
    "checkpointing.shutdown_deadline_seconds": "checkpoint.shutdown_deadline_seconds",
    "data.seed": "data.seed",
    "data.token_dtype": "data.token_dtype",
    "probe.steps": "probe.steps",
    "validation.interval_minutes": "validation.interval_minutes",
    "validation.batches": "validation.batches",
}


def leaf(config: RunConfig, dotted: str):
    value = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def train_hyperparameters(plan, parameters=None) -> dict:
    """The Train step's HyperParameters as SageMaker hands them to the container."""
    seen = {}

    def jobs(step, job_name, args, attempt, *, warm_from):
        seen[step] = args
        final = [(0.0, "algo-1", f"FINAL {name}=1.5") for name in d.final_metrics(plan)]  # what the Register step reads
        return JobAttempt("Completed", log=final)

    execution = Interpreter(d.build_definition(plan, RESOURCES), jobs, execution_id=EXECUTION_ID).run({"SkipProbe": "true", **(parameters or {})})
    assert execution.status == "Succeeded", execution.failure
    return seen[d.S_TRAIN_WITHOUT_PROBE]["HyperParameters"]


# Per test (not per module): mutation testing sees which tests reach the planner.
@pytest.fixture
def plan(tmp_path):
    return plan_file(write_yaml(tmp_path / "asked.yaml", recipe_dict(**ASKED)))


@pytest.fixture
def default_plan(tmp_path):
    return plan_file(write_yaml(tmp_path / "defaults.yaml", recipe_dict(**{"tuning.batch_ramp": False})))


def test_run_config_carries_every_value_unchanged(plan):
    config = plan.run_config()
    for asked, carried in CARRIED.items():
        assert leaf(config, carried) == ASKED[asked], asked
    assert config.recipe_name == "unit-test"
    assert config.batch.sequence_length == 4096
    assert config.batch.global_batch_tokens == 4096 * 256


def test_the_train_step_hands_the_container_the_same_values(plan):
    hyperparameters = train_hyperparameters(plan)
    assert all(isinstance(v, str) for v in hyperparameters.values())  # SageMaker passes strings
    arrived = RunConfig.from_hyperparameters(hyperparameters)
    for asked, carried in CARRIED.items():
        assert leaf(arrived, carried) == ASKED[asked], asked
    # The step adds the run's identity (a new run named after the execution, on the DataUri given);
    # everything else is the plan's RunConfig unchanged.
    planned = plan.run_config()
    assert arrived.run == planned.run.model_copy(update={"id": EXECUTION_ID, "data_uri": "s3://bucket-for-tests/tokens/"})
    assert arrived == planned.model_copy(update={"run": arrived.run})


def test_max_steps_parameter_reaches_the_container(plan):
    arrived = RunConfig.from_hyperparameters(train_hyperparameters(plan, {"MaxSteps": 123}))
    assert arrived.batch.total_steps == 123
    assert plan.run_config().batch.total_steps == plan.estimates.total_steps != 123


def test_warmup_tokens_become_steps_of_the_global_batch(plan):
    # No batch ramp: every step trains on global_batch_tokens.
    assert plan.warmup_steps == math.ceil(50_000_000 / (4096 * 256)) == 48
    assert plan.run_config().optimizer.warmup_steps == 48


def test_defaults_are_the_documented_ones(default_plan):
    config = default_plan.run_config()
    # optimizer.warmup_tokens: "default: 1% of the budget" (10e9 tokens -> 1e8 tokens).
    assert default_plan.warmup_steps == math.ceil(10_000_000_000 // 100 / (4096 * 256)) == 96
    decision = next(x for x in default_plan.decisions if x.field == "optimizer.warmup_steps")
    assert "100,000,000 warmup tokens" in decision.reason
    o = config.optimizer
    assert (o.lr, o.min_lr_ratio, o.schedule, o.weight_decay, o.grad_clip, o.beta1, o.beta2) == (
        3e-4, 0.1, "cosine", 0.1, 1.0, 0.9, 0.95)
    c = config.checkpoint
    assert (c.interval_minutes, c.keep_last, c.shutdown_deadline_seconds, c.interval_steps) == (30.0, 3, 110, 0)
    assert (config.data.seed, config.data.token_dtype) == (1234, "uint32")
    assert config.probe.steps == 20
    # data.validation_fraction 0.001: every 1000th window is held out.
    assert (config.validation.source, config.validation.holdout_every) == ("holdout", 1000)
    assert config.metrics.plan_tokens_per_second_per_gpu == round(default_plan.estimates.tokens_per_second_per_gpu, 2)
    assert config.tracking.experiment_name == "unit-test"


def test_warmup_never_exceeds_the_run(tmp_path):
    data = recipe_dict(**{"tuning.batch_ramp": False, "optimizer.warmup_tokens": 10**15, "budget.total_tokens": 10**9})
    plan = plan_file(write_yaml(tmp_path / "long-warmup.yaml", data))
    assert plan.warmup_steps == plan.estimates.total_steps == math.ceil(10**9 / (4096 * 256))
