"""Invariants, checked on generated inputs (hypothesis).

- the memory model: more micro-batch or a longer sequence needs more memory; a larger shard
  group or more recomputation needs less;
- the planner: its choice fits under the tier's headroom, and is never slower by its own
  model than what the tier alone would choose (the same recipe with ``follow_tiers: strict``);
- the RunConfig: ``to_hyperparameters`` then ``from_hyperparameters`` gives back every valid
  RunConfig unchanged.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from support import recipe_dict

from tiered_training import catalog as catalogs
from tiered_training.contract.corpus import MixtureSource
from tiered_training.contract.runconfig import CandidateConfig, LoraConfig, RunConfig, SftConfig
from tiered_training.planning import memory
from tiered_training.planning.planner import plan_file, resolve
from tiered_training.recipe import Recipe

MODELS = sorted(catalogs.models())
GIB = 1024**3
AC_ORDER = ("none", "selective", "full")


def arch_of(model: str):
    return catalogs.models()[model].architecture


def estimate(model, **kw) -> memory.MemoryBreakdown:
    args = {"precision": "bf16", "checkpointing": "selective", "sequence_length": 4096, "micro_batch": 1,
            "shard_group": 8, "hbm_bytes": 80 * GIB} | kw
    return memory.estimate(arch_of(model), **args)


# Moments of a step when no layer's activations are alive (memory.PHASES): a peak there
# does not depend on the tokens of a micro-batch.
AFTER_BACKWARD = {"root reduce", "optimizer step"}


def grows(bigger: memory.MemoryBreakdown, base: memory.MemoryBreakdown) -> bool:
    """More memory at the peak; the same only when both peak after backward."""
    if base.peak_at in AFTER_BACKWARD and bigger.peak_at in AFTER_BACKWARD:
        return bigger.total >= base.total
    return bigger.total > base.total


memory_settings = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS),
    "precision": st.sampled_from(["bf16", "fp8", "fp32"]),
    "checkpointing": st.sampled_from(AC_ORDER),
    "sequence_length": st.sampled_from([512, 1024, 2048, 4096, 8192, 16384, 32768]),
    "micro_batch": st.integers(1, 16),
    "shard_group": st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256]),
    "grad_accum_steps": st.sampled_from([None, 1, 2, 8]),
})


@given(memory_settings)
def test_memory_grows_with_micro_batch_and_sequence_length(s):
    model = s.pop("model")
    base = estimate(model, **s)
    assert grows(estimate(model, **{**s, "micro_batch": s["micro_batch"] + 1}), base)
    assert grows(estimate(model, **{**s, "sequence_length": s["sequence_length"] * 2}), base)


@given(memory_settings)
def test_memory_falls_with_the_shard_group_and_more_recomputation(s):
    model = s.pop("model")
    base = estimate(model, **s)
    assert estimate(model, **{**s, "shard_group": s["shard_group"] * 2}).total < base.total
    more = AC_ORDER.index(s["checkpointing"]) + 1
    if more < len(AC_ORDER):
        assert grows(base, estimate(model, **{**s, "checkpointing": AC_ORDER[more]}))


recipes = st.fixed_dictionaries({
    "model.catalog": st.sampled_from(["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-7b", "qwen2.5-14b"]),
    "compute.instance_type": st.sampled_from(["ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.p6-b200.48xlarge"]),
    "compute.instance_count": st.sampled_from([1, 2, 4]),
    "sequence_length": st.sampled_from([2048, 4096, 8192]),
    "sequences": st.sampled_from([64, 128, 256, 512, 1024]),
})


@given(recipes)
def test_the_planners_choice_fits_and_is_never_slower_than_the_tiers(r):
    sequences = r.pop("sequences")
    data = recipe_dict(**r, **{"budget.global_batch_tokens": sequences * r["sequence_length"]})
    auto = resolve(Recipe.model_validate(data))
    assume(auto.ok)
    assert auto.memory.fraction <= auto.tier.memory_headroom
    assert auto.memory.total <= auto.tier.memory_headroom * auto.instance.hbm_bytes
    strict = resolve(Recipe.model_validate(recipe_dict(**r, **{
        "budget.global_batch_tokens": sequences * r["sequence_length"], "tuning.follow_tiers": "strict"})))
    assert strict.ok
    assert auto.estimates.tokens_per_second_per_gpu >= strict.estimates.tokens_per_second_per_gpu * (1 - 1e-9)
    for departure in auto.departures:
        assert departure.gain > 0


# -- RunConfig round trip ----------------------------------------------------------------------

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


def _leaf(annotation) -> st.SearchStrategy:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_leaf(a) for a in args))
    if origin is list:
        return st.lists(_leaf(args[0]), max_size=5)
    if origin is tuple:
        return st.tuples(*(_leaf(a) for a in args))
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.one_of(st.integers(-3, 3), st.integers(-(2**53), 2**53))
    if annotation is float:
        return st.one_of(finite, st.sampled_from([0.0, -0.0, 1e-308, 5e-324, 1.7976931348623157e308, 0.1, 1 / 3]))
    if annotation is str:
        return text
    if annotation is MixtureSource:  # required fields with a pattern: drawn as the contract allows
        return st.builds(
            MixtureSource, name=st.from_regex(r"[a-z0-9][a-z0-9_-]{0,12}", fullmatch=True), weight=st.floats(1e-6, 1e6)
        )
    if annotation is CandidateConfig:  # nested sections with required fields: the planner's own candidates
        return st.sampled_from(PLANNED_CANDIDATES)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):  # a nested section (sft, sft.lora)
        return _section(annotation)
    raise AssertionError(f"no strategy for {annotation!r}")


lora_configs = st.builds(
    LoraConfig, rank=st.integers(1, 1024), alpha=st.floats(1e-3, 4096), dropout=st.floats(0, 0.99),
    target_modules=st.lists(st.sampled_from(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
                            min_size=1, max_size=7),
)
sft_configs = st.one_of(st.none(), st.just(SftConfig(adapter="none")), lora_configs.map(lambda lora: SftConfig(adapter="lora", lora=lora)))


@st.composite
def _section(draw, model: type[BaseModel]) -> BaseModel:
    """A valid ``model``: every leaf drawn at once when that validates (rules across fields),
    else leaf by leaf from its defaults, each drawn value kept where the section accepts it."""
    drawn = {leaf: draw(_leaf(info.annotation)) for leaf, info in model.model_fields.items()}
    try:
        return model.model_validate(drawn)
    except ValidationError:
        pass
    base: dict = {}
    for leaf, value in drawn.items():
        try:
            model.model_validate({**base, leaf: value})
        except ValidationError:
            continue
        base[leaf] = value
    return model.model_validate(base)


@st.composite
def run_configs(draw) -> RunConfig:
    """A valid RunConfig whose leaves are drawn over their whole type: a drawn value that its
    section rejects (a bound, a cross-field rule) is left at the planned one."""
    base = RUN_CONFIG.model_dump()
    for name, info in RunConfig.model_fields.items():
        section = info.annotation
        if name == "sft":  # None (pretraining), full-parameter or LoRA fine-tuning, which needs a checkpoint
            base[name] = draw(sft_configs)
            if base[name] is not None:
                base["model"]["init_checkpoint"] = base["model"]["init_checkpoint"] or "s3://bucket/base/"
                base[name] = base[name].model_dump()
            continue
        if not (isinstance(section, type) and issubclass(section, BaseModel)):  # recipe_name
            if draw(st.booleans()):
                base[name] = draw(_leaf(section))
            continue
        for leaf, leaf_info in section.model_fields.items():
            if not draw(st.booleans()):
                continue
            candidate = {**base[name], leaf: draw(_leaf(leaf_info.annotation))}
            try:
                section.model_validate(candidate)
            except ValidationError:
                continue
            base[name] = candidate
    try:
        return RunConfig.model_validate(base)
    except ValidationError:  # sequence_length against context_parallel: rare
        assume(False)


def _a_plan_run_config() -> RunConfig:
    return resolve(Recipe.model_validate(recipe_dict())).run_config()


RUN_CONFIG = _a_plan_run_config()
REPO = Path(__file__).resolve().parents[2]
# The planner's candidates of three templates: alternatives the probe measures, for the round trip.
PLANNED_CANDIDATES = [
    c
    for name in ("llama3-8b-fp8", "llama3-8b-128k", "qwen2.5-32b-lora")
    for c in plan_file(REPO / "recipes" / f"{name}.yaml").run_config().probe.alternatives
]


@given(run_configs())
def test_hyperparameters_round_trip_every_valid_run_config(config):
    hyperparameters = config.to_hyperparameters()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in hyperparameters.items())
    back = RunConfig.from_hyperparameters(hyperparameters)
    assert back == config
    assert json.dumps(back.model_dump(mode="json"), sort_keys=True) == json.dumps(config.model_dump(mode="json"), sort_keys=True)
    # SageMaker adds its own keys; the container ignores them.
    assert RunConfig.from_hyperparameters({**hyperparameters, "sagemaker_program": '"x"'}) == config
