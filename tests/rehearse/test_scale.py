"""What a rehearsal scales, without running it: context parallelism, accumulation, interrupts it cannot reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiered_training.contract.runconfig import RunConfig
from tiered_training.contract.world import planned_world
from tiered_training.planning.planner import plan_file
from tiered_training.rehearse.hosts import Interrupt
from tiered_training.rehearse.run import steps_for
from tiered_training.rehearse.scale import MAX_ACCUM, scale

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def long_context():
    plan = plan_file(REPO / "recipes/llama3-8b-128k-p5.yaml")  # 128K on 80 GB GPUs: CP 2 or more
    assert plan.ok and plan.run_config().parallel.context_parallel > 1
    return plan


def _scaled(plan, **kwargs):
    return scale(plan.run_config(), hosts=2, workers=2, plan_step_seconds=plan.estimates.step_time_seconds,
                 plan_total_steps=plan.estimates.total_steps, memory_per_worker=2**30, **kwargs)


def test_context_parallelism_is_rehearsed_as_1_and_said_so_when_the_trainer_lacks_it(long_context):
    scaled = _scaled(long_context, context_parallel=False)
    (change,) = [c for c in scaled.changes if c.field == "parallel.context_parallel"]
    assert change.plan == long_context.run_config().parallel.context_parallel and change.rehearsal == 1
    assert "no context parallelism" in change.why
    cfg = scaled.config
    assert cfg.parallel.context_parallel == 1
    b = cfg.batch
    assert b.global_batch_tokens == b.micro_batch_size * b.sequence_length * b.grad_accum_steps * 4


def test_context_parallelism_is_kept_within_a_host_when_the_trainer_has_it(long_context):
    cfg = _scaled(long_context, context_parallel=True).config
    assert cfg.parallel.context_parallel == 2  # at most the 2 workers of a host
    assert cfg.parallel.shard_group_size % 2 == 0
    b = cfg.batch
    assert b.global_batch_tokens == b.micro_batch_size * b.sequence_length * b.grad_accum_steps * 2  # 2 CP groups


def test_accumulation_shrinks_by_one_factor_keeping_the_ramp_shape():
    plan = plan_file(REPO / "recipes/qwen2.5-32b-hybrid.yaml")
    planned = plan.run_config().batch
    b = _scaled(plan).config.batch
    assert b.grad_accum_steps <= MAX_ACCUM
    if planned.ramp_start_accum_steps:
        assert b.ramp_start_accum_steps / b.grad_accum_steps == pytest.approx(
            planned.ramp_start_accum_steps / planned.grad_accum_steps, rel=0.5)


@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
def test_every_probe_candidate_is_scaled_as_the_plans_own_at_the_shared_global_batch(recipe):
    plan = plan_file(REPO / "recipes" / recipe)
    planned = plan.run_config()
    scaled = _scaled(plan)
    cfg = scaled.config
    # as many as the plan measures: the decisions in doubt, 3 to 5 under auto (2 where a pin leaves fewer to doubt)
    assert cfg.probe.count == planned.probe.count == len(plan.candidates) and 2 <= cfg.probe.count <= 5
    for number in range(1, cfg.probe.count + 1):
        run = cfg.with_candidate(number)
        RunConfig.model_validate(run.model_dump())
        # the trainer keeps the global batch only where the candidate's own counts make it on these 4 workers
        assert planned_world(run) == 4, (recipe, number)
        mine, theirs = run.candidate_config(number), planned.candidate_config(number)
        assert (mine.precision.precision, mine.precision.fp8_recipe, mine.precision.activation_checkpointing) == (
            theirs.precision.precision, theirs.precision.fp8_recipe, theirs.precision.activation_checkpointing)
        assert mine.parallel.sharding == theirs.parallel.sharding
        assert mine.precision.compile is False and mine.precision.loss_chunk_tokens == cfg.precision.loss_chunk_tokens
    listed = dict(scaled.kept)["probe candidates"]
    assert [part.split(" = ")[0] for part in listed.split("; ")] == [str(n) for n in range(1, cfg.probe.count + 1)]


def test_a_candidate_micro_batch_that_cannot_make_the_global_batch_is_lowered_and_listed():
    plan = plan_file(REPO / "recipes/llama3-1b-bf16.yaml")
    cfg = plan.run_config()
    odd = cfg.probe.alternatives[0].model_copy(update={"micro_batch_size": 3})
    cfg = cfg.model_copy(update={"probe": cfg.probe.model_copy(update={"alternatives": [odd, *cfg.probe.alternatives[1:]]})})
    scaled = scale(cfg, hosts=2, workers=2, plan_step_seconds=plan.estimates.step_time_seconds,
                   plan_total_steps=plan.estimates.total_steps, memory_per_worker=2**30)
    b = scaled.config.batch
    sequences = b.global_batch_tokens // (b.sequence_length * 4)  # per data-parallel rank and step
    (change,) = [c for c in scaled.changes if c.field == "probe.alternatives[0].micro_batch_size"]
    assert change.plan == 3 and sequences % change.rehearsal == 0 and change.rehearsal < 3
    assert "candidate 2" in change.why
    assert planned_world(scaled.config.with_candidate(2)) == 4


def test_an_interrupt_the_run_cannot_reach_is_refused_before_anything_runs():
    save = Interrupt.parse("kill-host@save")
    assert save.unreachable(28, 14) is None
    problem = save.unreachable(12, 14)
    assert "step 28" in problem and "a checkpoint every 14 steps" in problem and "--steps" in problem
    assert steps_for(save, 14) == 29 and steps_for(Interrupt.parse("sigterm@5"), 3) == 12


def test_the_trainer_comes_from_the_checkout_or_from_the_wheels_container(tmp_path):
    from tiered_training.rehearse.run import RehearsalError, repo_root

    assert (repo_root() / "training" / "launcher.py").is_file()  # this checkout
    library = tmp_path / "site-packages" / "tiered_training"
    (library / "container").mkdir(parents=True)
    with pytest.raises(RehearsalError, match="reinstall tiered-training"):
        repo_root(library)
    (library / "container" / "launcher.py").write_text("")
    root = repo_root(library)  # an installed wheel: training/ is its container directory
    assert (root / "training" / "launcher.py").is_file() and (root / "training").resolve() == library / "container"


def test_a_qlora_rehearsal_model_splits_into_whole_nf4_blocks_and_scales_a_head_dim_with_its_width(tmp_path):
    import json

    import yaml
    from support import recipe_dict

    from tiered_training.contract.architecture import Lora
    from tiered_training.planning import memory

    qwen3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128, "hidden_size": 2560,
             "intermediate_size": 9728, "max_position_embeddings": 40960, "num_attention_heads": 32,
             "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
             "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936}  # Qwen/Qwen3-4B
    (tmp_path / "config.json").write_text(json.dumps(qwen3))
    for adapter in ("lora", "qlora"):
        path = tmp_path / f"{adapter}.yaml"
        path.write_text(yaml.safe_dump(recipe_dict(**{
            "task": "sft", "model": {"hf_config": str(tmp_path), "init_checkpoint": "s3://bucket-for-tests/m/"},
            "data.uri": "s3://bucket-for-tests/sft/", "budget.total_tokens": 10_000_000,
            "budget.global_batch_tokens": 4096 * 64, "tuning.adapter": adapter})))
        plan = plan_file(path)
        assert plan.ok, plan.errors
        cfg = _scaled(plan).config
        model = cfg.model
        assert model.head_size is None and model.qk_norm and cfg.sft.adapter == adapter
        group = cfg.parallel.shard_group_size
        targets = tuple(cfg.sft.lora.target_modules)
        unsplittable = memory.nf4_unsplittable(model, targets, group)
        assert (unsplittable == []) if adapter == "qlora" else unsplittable, adapter
        assert Lora(16, targets).parameters(model) > 0
