"""Fine-tuning in the recipe language: task sft, the adapter, LoRA settings, the export format,
a model from a Hugging Face config.json, and what the planner makes of them."""

from __future__ import annotations

import json

import pytest
import yaml
from support import recipe_dict
from support import run_cli as cli

from tiered_training import catalog as catalogs
from tiered_training.contract import hf_config
from tiered_training.contract.architecture import Lora
from tiered_training.planning import memory, perf
from tiered_training.planning.planner import plan_file, resolve
from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import parse_recipe

CHECKPOINT = "s3://bucket-for-tests/models/base/"
MISSING = object()


def sft(**overrides) -> dict:
    return recipe_dict(**{"task": "sft", "model.init_checkpoint": CHECKPOINT, "data.uri": "s3://bucket-for-tests/sft/",
                          "budget.total_tokens": 100_000_000, "budget.global_batch_tokens": 4096 * 64} | overrides)


def problems(data) -> list[tuple]:
    with pytest.raises(RecipeError) as info:
        parse_recipe(yaml.safe_dump(data, sort_keys=False), "r.yaml")
    return [(p.line, p.field, p.message) for p in info.value.problems]


def plan_of(data):
    recipe, lines = parse_recipe(yaml.safe_dump(data, sort_keys=False), "r.yaml")
    return resolve(recipe, source="r.yaml", lines=lines)


# -- the recipe -----------------------------------------------------------------------------


def test_a_pretraining_recipe_is_unchanged_and_plans_no_fine_tuning():
    plan = plan_of(recipe_dict())
    assert plan.ok and plan.task == "pretrain" and plan.adapter is None
    config = plan.run_config()
    assert config.sft is None and config.export.format == "merged"
    assert "tuning.adapter" not in {d.field for d in plan.decisions}


@pytest.mark.parametrize("overrides, expected", [
    # sft without a starting checkpoint: at the model section (the field it lacks is not in the file)
    ({"model.init_checkpoint": None}, (3, "model.init_checkpoint", "task sft fine-tunes trained weights")),
    ({"data.loss_on": "prompt"}, (8, "data.loss_on", "must be one of 'assistant', 'all'")),
    ({"data.overlong": "wrap"}, (8, "data.overlong", "must be one of 'error', 'drop', 'truncate'")),
    ({"data.format": "csv"}, (8, "data.format", "must be one of 'auto', 'messages', 'sharegpt', 'alpaca'")),
    ({"data.on_bad_example": "ignore"}, (8, "data.on_bad_example", "must be one of 'error', 'skip'")),
    ({"data.on_bad_example": "skip", "data.max_bad_fraction": 1.5}, (9, "data.max_bad_fraction", "less than or equal to 1")),
    ({"data.max_bad_fraction": 0.01}, (8, "data.max_bad_fraction", "applies with data.on_bad_example: skip only")),
    ({"data.ignore": ["*.md"]}, (8, "data.ignore", "applies with data.prepare only")),
    ({"data.prepare": {}, "data.ignore": [""]}, (10, "data.ignore.0", "at least 1 character")),
    ({"tuning.adapter": "dora"}, (16, "tuning.adapter", "must be one of 'none', 'lora', 'qlora', 'auto'")),
    ({"tuning.lora": {"rank": 0}}, (17, "tuning.lora.rank", "greater than or equal to 1")),
    ({"tuning.lora": {"alpha": -1}}, (17, "tuning.lora.alpha", "greater than 0")),
    ({"tuning.lora": {"dropout": 1.0}}, (17, "tuning.lora.dropout", "less than 1")),
    ({"tuning.lora": {"target_modules": ["q_proj", "qkv_proj"]}}, (19, "tuning.lora.target_modules.1", "must be one of 'q_proj'")),
    ({"tuning.lora": {"target_modules": ["q_proj", "q_proj"]}}, (17, "tuning.lora.target_modules", "q_proj listed more than once")),
    ({"tuning.lora": {"target_modules": []}}, (17, "tuning.lora.target_modules", "at least 1 item")),
    ({"tuning.lora": {"rnak": 8}}, (17, "tuning.lora.rnak", "did you mean 'rank'")),
    ({"tuning.adapter": "none", "tuning.lora": {"rank": 8}}, (17, "tuning.lora", "set, but tuning.adapter is none")),
    ({"export.format": "adapter", "tuning.adapter": "none"}, (16, "export.format", "needs task: sft (or dpo) and tuning.adapter: lora")),
    ({"export.format": "safetensors"}, (16, "export.format", "must be one of 'merged', 'adapter'")),
    ({"task": "rlhf"}, (1, "task", "must be one of 'pretrain', 'sft', 'dpo'")),
    ({"task": "dpo", "data.overlong": "truncate"}, (8, "data.overlong", "truncate would compare cut answers")),
    ({"task": "dpo", "preference": {"loss": "ipo", "label_smoothing": 0.1}},
     (17, "preference.label_smoothing", "applies to loss robust")),
    ({"task": "dpo", "preference": {"reference": "adapter_disabled"}, "tuning.adapter": "none"},
     (16, "preference.reference", "adapter_disabled needs LoRA")),
    ({"preference": {"beta": 0.2}}, (15, "preference", "applies to task dpo only")),
])
def test_a_bad_fine_tuning_value_names_its_line_and_field(overrides, expected):
    data = sft(**{k: v for k, v in overrides.items() if v is not None})
    if overrides.get("model.init_checkpoint", 0) is None:
        del data["model"]["init_checkpoint"]
    data = {"task": data.pop("task"), **data}  # task first, as the templates write it
    found = problems(data)
    assert len(found) == 1, found
    line, field, message = found[0]
    assert (line, field) == expected[:2] and expected[2] in message, found


@pytest.mark.parametrize("overrides, field", [
    ({"data.loss_on": "all"}, "data.loss_on"),
    ({"data.overlong": "truncate"}, "data.overlong"),
    ({"data.format": "sharegpt"}, "data.format"),
    ({"data.on_bad_example": "skip"}, "data.on_bad_example"),
    ({"tuning.adapter": "lora"}, "tuning.adapter"),
    ({"tuning.lora": {"rank": 8}}, "tuning.lora"),
    ({"export.format": "adapter"}, "export.format"),
])
def test_fine_tuning_fields_are_refused_in_a_pretraining_recipe(overrides, field):
    (_, where, message), = problems(recipe_dict(**overrides))
    assert where == field and ("task sft" in message or "task: sft" in message)


def test_packed_examples_never_split_over_context_parallel_ranks():
    plan = plan_of(sft(**{"model.catalog": "llama-3.1-8b", "sequence_length": 32768, "budget.global_batch_tokens": 32768 * 16}))
    assert plan.ok and plan.context_parallel == 1 and "document mask" in plan.decision("tuning.context_parallel").reason
    pinned = plan_of(sft(**{"model.catalog": "llama-3.1-8b", "tuning.context_parallel": 2}))
    error, = pinned.errors
    assert error.field == "tuning.context_parallel" and "no document mask" in error.message


def test_packed_attention_costs_the_causal_flops_at_flex_attentions_share():
    """FlexAttention's block mask skips the blocks between examples: at most the causal FLOPs, at 90% of
    the kernel's forward rate and 85% of its backward (forward 1, backward 2.5 of the FLOPs)."""
    hw = perf.Hardware.of(catalogs.instances()["ml.p6-b200.48xlarge"])
    arch, kw = catalogs.models()["llama-3.1-8b"].architecture, dict(sequence_length=8192, gpus=8, accum=1, params=perf.stored_parameters())
    causal = perf.step_time(arch, hw, perf.Setting(precision="bf16", checkpointing="none", micro_batch=1, shard_group=8), **kw)
    masked = perf.step_time(arch, hw, perf.Setting(precision="bf16", checkpointing="none", micro_batch=1, shard_group=8,
                                                   document_mask=True), **kw)
    overhead = 2 * arch.layers * kw["params"].gemm_overhead_seconds  # per call, not per FLOP
    share = (1 / 0.90 + 2.5 / 0.85) / 3.5
    assert masked.attention - overhead == pytest.approx(share * (causal.attention - overhead))
    assert masked.gemm == causal.gemm


def test_hf_config_is_a_third_model_source():
    data = recipe_dict(**{"model.hf_config": "ckpt/"})
    (_, field, message), = problems(data)
    assert field == "model" and "exactly one of 'catalog'" in message and "'hf_config'" in message


# -- the planner ----------------------------------------------------------------------------


def test_a_30_64b_model_fine_tunes_with_lora_on_one_node_and_shows_the_full_parameter_alternative():
    plan = plan_of(sft(**{"model.catalog": "qwen2.5-32b", "compute.price_per_hour": 100.0}))
    assert plan.ok, plan.errors
    assert plan.adapter == "lora" and plan.nodes == 1
    adapter = plan.decision("tuning.adapter")
    assert adapter.source == "auto" and "large tier" in adapter.reason
    assert plan.decision("tuning.lora").value["rank"] == 16
    # Full-parameter training of 32.8B parameters needs 16 bytes each of sharded state: more than one node holds.
    full = plan.full_parameter
    assert full is not None and full.nodes >= 2
    assert full.cost_usd == pytest.approx(full.wall_time_hours * full.nodes * 100.0)
    assert "full-parameter-alternative" in {f.code for f in plan.findings}
    config = plan.run_config()
    assert config.sft.adapter == "lora" and config.sft.lora.alpha == 32.0
    assert config.model.init_checkpoint == CHECKPOINT
    # The container's MFU counts the FLOPs the planner counts: no weight gradients for the frozen base.
    speed = plan.estimates.tokens_per_second_per_gpu
    assert config.mfu(speed) == pytest.approx(plan.estimates.mfu, rel=1e-9)
    # Both conventions count the same LoRA FLOPs; causal counts half the attention, so it is lower.
    assert config.mfu(speed, causal=True) == pytest.approx(plan.estimates.mfu_causal, rel=1e-9)
    assert plan.estimates.mfu_causal < plan.estimates.mfu
    assert config.model_copy(update={"sft": None}).mfu(speed) > 1.4 * config.mfu(speed)


def test_full_parameter_fine_tuning_of_a_30_64b_model_on_one_node_names_lora_as_the_fix():
    plan = plan_of(sft(**{"model.catalog": "qwen2.5-32b", "tuning.adapter": "none"}))
    error = next(f for f in plan.errors if f.code == "needs-multiple-nodes")
    assert "tuning.adapter: lora" in error.fix and "full-parameter" in error.message
    assert "against-tier" in {f.code for f in plan.warnings}


def test_an_8b_model_fine_tunes_every_parameter_by_default():
    plan = plan_of(sft(**{"model.catalog": "llama-3.1-8b"}))
    assert plan.ok and plan.adapter == "none" and plan.full_parameter is None
    assert plan.run_config().sft.adapter == "none"


def test_an_adapter_export_chooses_lora_and_reaches_the_run_config():
    plan = plan_of(sft(**{"model.catalog": "llama-3.1-8b", "export.format": "adapter", "tuning.lora": {"rank": 8, "alpha": 16}}))
    assert plan.ok and plan.adapter == "lora"
    assert "export.format adapter" in plan.decision("tuning.adapter").reason
    config = plan.run_config()
    assert config.export.format == "adapter" and config.sft.lora.rank == 8 and config.sft.lora.alpha == 16
    assert plan.decision("tuning.lora").source == "recipe"


def test_plan_json_and_diff_show_the_task_and_the_adapter():
    from tiered_training import report

    old, new = plan_of(sft(**{"model.catalog": "llama-3.1-8b"})), plan_of(sft(**{"model.catalog": "llama-3.1-8b", "tuning.adapter": "lora"}))
    assert new.to_dict()["task"] == "sft" and new.to_dict()["tuning"]["adapter"] == "lora"
    changed = {c["field"]: (c["old"], c["new"]) for c in report.diff(old, new)["changed"]}
    assert changed["tuning.adapter"] == ("none", "lora")
    pretrain = plan_of(recipe_dict(**{"model.catalog": "llama-3.1-8b"}))
    assert {c["field"]: c["new"] for c in report.diff(pretrain, old)["changed"]}["task"] == "sft"
    assert "LoRA" in report.summary_row(new)["model"]
    assert any("Full-parameter" in line for line in report.explain_lines(plan_of(sft(**{"model.catalog": "qwen2.5-32b"}))))


# -- memory and throughput under LoRA -------------------------------------------------------------


ARCH = catalogs.models()["qwen2.5-32b"].architecture


def test_lora_memory_keeps_no_gradient_or_optimiser_state_for_the_frozen_base():
    lora = Lora(16, ("q_proj", "v_proj"), dropout=False)
    kw = dict(precision="bf16", checkpointing="full", sequence_length=4096, micro_batch=1, shard_group=8, hbm_bytes=180 * 2**30)
    full, tuned = memory.estimate(ARCH, **kw), memory.estimate(ARCH, lora=lora, **kw)
    # Adapters of q and v on each layer: A is 16 x h, B is out x 16 (h for q, kv for v), sharded 8 ways on dim 0.
    h, kv, group = ARCH.hidden_size, ARCH.kv_size, 8
    adapters = ARCH.layers * (2 * (16 // group) * h + (h // group) * 16 + (kv // group) * 16)
    base = full.parameters // 4  # the fp32 master copy's elements
    assert tuned.parameters == 2 * base + 4 * adapters  # frozen base in bf16 + fp32 adapters
    assert tuned.gradients == 4 * adapters and tuned.optimizer_states == 8 * adapters
    assert tuned.total < full.total - 12 * base  # the base's gradients and AdamW moments are gone
    # Activations: the same block inputs are kept under full checkpointing.
    assert tuned.activations <= full.activations * 1.01


def test_lora_dropout_copies_are_counted_without_checkpointing():
    kw = dict(precision="bf16", checkpointing="none", sequence_length=2048, micro_batch=1, shard_group=8, hbm_bytes=180 * 2**30)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    without = memory.estimate(ARCH, lora=Lora(16, targets, dropout=False), **kw)
    with_dropout = memory.estimate(ARCH, lora=Lora(16, targets, dropout=True), **kw)
    h, f, e = ARCH.hidden_size, ARCH.ffn_size, 2
    # With dropout each adapter keeps its own copy of its input (bf16) and a one-byte mask; the base's
    # norm outputs (2 x h) and SwiGLU product (f), kept without dropout by the adapters, are released.
    copies = (e + 1) * (6 * h + f)
    per_token = copies - 2 * e * h - e * f
    kept = with_dropout.activations + with_dropout.adapter_dropout
    assert kept - without.activations == ARCH.layers * per_token * 2048
    # The copies are their own term, apart from the activations, and in the total.
    assert with_dropout.adapter_dropout == ARCH.layers * copies * 2048 and without.adapter_dropout == 0
    assert with_dropout.as_gib()["adapter_dropout"] > 0 and "adapter_dropout" not in without.as_gib()
    assert with_dropout.total - without.total > ARCH.layers * per_token * 2048


def test_lora_runs_about_two_thirds_of_the_base_gemm_time_plus_the_adapters():
    hw = perf.Hardware.of(catalogs.instances()["ml.p6-b200.48xlarge"])
    params = perf.stored_parameters()
    base = perf.Setting(precision="bf16", checkpointing="none", micro_batch=1, shard_group=8)
    lora = Lora(16, ("q_proj",), dropout=False)
    kw = dict(sequence_length=4096, gpus=8, accum=4, params=params)
    full, tuned = perf.step_time(ARCH, hw, base, **kw), perf.step_time(ARCH, hw, perf.Setting(**{**base.__dict__, "lora": lora}), **kw)
    # One adapter per layer adds 2 tiny GEMMs forward and 4 backward, each paying the fixed cost.
    adapters = 4 * ARCH.layers * 6 * params.gemm_overhead_seconds
    assert tuned.gemm == pytest.approx(full.gemm * 2 / 3 + adapters, rel=0.02)
    assert tuned.optimizer < full.optimizer / 100 and tuned.attention == full.attention
    flops = ARCH.flops_per_token(4096, lora=lora)
    assert flops < ARCH.flops_per_token(4096) * 0.75


# -- a model from a Hugging Face config.json ----------------------------------------------------


LLAMA_31_8B = {  # the published config.json of meta-llama/Llama-3.1-8B, less the fields the planner ignores
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "head_dim": 128,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3"},
}


def test_a_llama_config_gives_the_catalogue_dimensions(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    _, arch = hf_config.read(tmp_path)
    assert arch == catalogs.models()["llama-3.1-8b"].architecture


# Published config.json files (the fields the planner reads): https://huggingface.co/Qwen/Qwen3-8B and
# https://huggingface.co/mistralai/Mistral-7B-v0.3
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}
MISTRAL_7B_V03 = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32768,
}


@pytest.mark.parametrize("config, entry", [(QWEN3_8B, "qwen3-8b"), (MISTRAL_7B_V03, "mistral-7b")])
def test_qwen3_and_mistral_configs_give_their_catalogue_dimensions(tmp_path, config, entry):
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, arch = hf_config.read(tmp_path)
    assert arch == catalogs.models()[entry].architecture
    for change, words in (({"sliding_window": 4096}, "sliding_window: 4096"),
                          ({"use_sliding_window": True}, "use_sliding_window: true")):
        if (config["model_type"] == "mistral") == ("sliding_window" in change):
            (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
            with pytest.raises(hf_config.ConfigError, match=words):
                hf_config.read(tmp_path)


# Qwen3's head_dim (128) is not hidden_size / num_attention_heads in the 0.6B, 4B and 32B models; the model cards
# (https://huggingface.co/Qwen/Qwen3-0.6B, -4B, -32B) give the non-embedding parameters 0.44B, 3.6B and 31.2B.
@pytest.mark.parametrize("size, dims, non_embedding", [
    ("0.6B", {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 28, "intermediate_size": 3072,
              "tie_word_embeddings": True}, 0.44e9),
    ("4B", {"hidden_size": 2560, "num_attention_heads": 32, "num_hidden_layers": 36, "intermediate_size": 9728,
            "tie_word_embeddings": True}, 3.6e9),
    ("32B", {"hidden_size": 5120, "num_attention_heads": 64, "num_hidden_layers": 64, "intermediate_size": 25600},
     31.2e9),
])
def test_a_qwen3_head_dim_other_than_hidden_over_heads_plans(tmp_path, size, dims, non_embedding):
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_8B, **dims}))
    _, arch = hf_config.read(tmp_path)
    assert arch.head_dim == 128 and arch.q_size == 128 * dims["num_attention_heads"] != arch.hidden_size
    assert arch.qk_norm and ("self_attn.q_norm.weight", (128,)) in arch.layer_shapes()
    assert abs(arch.layers * arch.layer_parameters / non_embedding - 1) < 0.02
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(sft(**{"model": {"hf_config": str(tmp_path), "init_checkpoint": CHECKPOINT}})))
    plan = plan_file(path)
    assert plan.ok, plan.errors
    model = plan.run_config().model
    assert model.head_size == 128 and model.qk_norm and plan.parameters == arch.parameters


def test_a_recipe_plans_from_a_local_config_relative_to_its_file(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps(LLAMA_31_8B))
    data = sft(**{"model": {"hf_config": "base", "init_checkpoint": CHECKPOINT}})
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = plan_file(path)
    assert plan.ok and plan.parameters == catalogs.models()["llama-3.1-8b"].architecture.parameters
    assert plan.run_config().model.layers == 32


@pytest.mark.parametrize("change, words", [
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}, "model_type 'mixtral' (MixtralForCausalLM) is not one the trainer builds"),
    ({"model_type": "gemma2"}, "it builds llama, qwen2, qwen3, mistral"),
    ({"attention_bias": True}, "attention_bias"),
    ({"head_dim": 127}, "head_size (head_dim) 127 is odd"),
    ({"num_attention_heads": 30, "head_dim": None}, "hidden_size 4096 is not a multiple of attention_heads 30"),
    ({"vocab_size": "big"}, "vocab_size: input should be a valid integer"),
])
def test_an_architecture_the_trainer_cannot_build_is_refused_by_name(tmp_path, change, words):
    config = {**LLAMA_31_8B, **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(hf_config.ConfigError) as info:
        hf_config.read(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value) and words in str(info.value)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(sft(**{"model": {"hf_config": str(tmp_path), "init_checkpoint": CHECKPOINT}})))
    plan = plan_file(path)
    error, = plan.errors
    assert error.code == "hf-config" and error.field == "model.hf_config" and words in error.message


def test_models_from_config_prints_a_catalogue_entry(tmp_path):
    qwen = {**LLAMA_31_8B, "model_type": "qwen2", "_name_or_path": "Qwen/Qwen2.5-32B", "hidden_size": 5120,
            "num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 27648, "num_hidden_layers": 64,
            "vocab_size": 152064, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "head_dim": None,
            "use_sliding_window": False}
    (tmp_path / "config.json").write_text(json.dumps(qwen))
    run = cli("models", "--from-config", tmp_path)
    assert run.returncode == 0, run.stderr
    (ident, entry), = yaml.safe_load(run.stdout).items()
    assert ident == "qwen2.5-32b" and entry["architecture"] == catalogs.models()["qwen2.5-32b"].architecture.model_dump()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    run = cli("models", "--from-config", tmp_path)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "model_type 't5'" in run.stderr


def test_the_plan_states_the_format_and_bad_examples_preflight_will_check():
    plan = plan_of(sft(**{"data.format": "sharegpt", "data.on_bad_example": "skip", "data.max_bad_fraction": 0.01}))
    assert plan.ok
    assert plan.decision("task").reason.endswith(
        "format sharegpt, bad examples: skip, at most 0.01 of them bad (preflight checks it)")


def test_the_run_config_names_the_checkpoint_by_hugging_face_id_from_the_recipe_or_the_catalogue():
    """An adapter export names its base by this id (peft's base_model_name_or_path), not by an S3 URI."""
    catalogued = sft(**{"model.catalog": "llama-3.1-8b"})
    assert plan_of(catalogued).run_config().model.hf_id == "meta-llama/Llama-3.1-8B"
    named = sft(**{"model.catalog": "llama-3.1-8b", "model.hf_id": "meta-llama/Llama-3.1-8B-Instruct"})
    assert plan_of(named).run_config().model.hf_id == "meta-llama/Llama-3.1-8B-Instruct"
    (problem,) = problems(sft(**{"model.catalog": "llama-3.1-8b", "model.hf_id": "s3://bucket/model/"}))
    assert problem[1] == "model.hf_id" and "a Hugging Face model id, owner/name" in problem[2]


def test_the_hugging_face_id_is_not_part_of_the_run_identity():
    """Naming the checkpoint changes no trained state: a run resumes across it, and plan hashes stay as before."""
    plain = plan_of(sft(**{"model.catalog": "llama-3.1-8b"})).run_config()
    named = plan_of(sft(**{"model.catalog": "llama-3.1-8b", "model.hf_id": "someone/llama-tuned"})).run_config()
    assert plain.model.hf_id != named.model.hf_id and plain.plan_hash() == named.plan_hash()
