"""QLoRA's frozen base in the planner: NF4 bytes as torchao stores them, and what they save against LoRA."""

from __future__ import annotations

import pytest

from tiered_training.catalog import models
from tiered_training.contract.architecture import Lora
from tiered_training.planning import memory

torch = pytest.importorskip("torch")
nf4_module = pytest.importorskip("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def stored_bytes(tensor) -> int:
    """Bytes of every tensor an NF4Tensor holds (its codes, scales, factors, their mean and the code table)."""
    names, _ = tensor.__tensor_flatten__()
    assert {"quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4"} <= set(names)
    return sum(getattr(tensor, name).numel() * getattr(tensor, name).element_size() for name in names)


@pytest.mark.parametrize("shape", [(128, 128), (1024, 4096), (14336, 64), (512, 896)])
def test_nf4_bytes_equal_an_nf4_tensors_storage(shape):
    weight = torch.randn(shape, dtype=torch.bfloat16)
    quantized = nf4_module.to_nf4(weight)
    assert (quantized.block_size, quantized.scaler_block_size) == (memory.NF4_BLOCK, memory.NF4_SCALER_BLOCK)
    assert stored_bytes(quantized) == memory.nf4_bytes(weight.numel())
    assert quantized.quantized_data.untyped_storage().nbytes() == weight.numel() // 2


def test_an_fsdp2_shard_of_an_nf4_tensor_holds_what_the_planner_counts():
    """FSDP2 shards a parameter with torch.chunk on dim 0; NF4Tensor splits its codes, scales and factors."""
    weight = torch.randn(4096, 1024, dtype=torch.bfloat16)
    shards = torch.chunk(nf4_module.to_nf4(weight), 8, dim=0)
    assert len(shards) == 8
    for shard in shards:
        assert stored_bytes(shard) == memory.nf4_bytes(weight.numel() // 8)


def test_qlora_stores_the_base_in_about_a_quarter_of_loras_bytes():
    arch = models()["llama-3.1-70b"].architecture
    lora, qlora = Lora(16, ALL), Lora(16, ALL, quantized=True)
    bf16 = memory.sharded_state_bytes(arch, 8, lora)["param"]
    nf4 = memory.sharded_state_bytes(arch, 8, qlora)["param"]
    projections = arch.layers * sum(fan_in * fan_out for fan_in, fan_out in arch.projection_sizes().values())
    # the projections go from 2 bytes to 0.5 + 1/64 + 2/16384 a parameter; the rest is unchanged
    saved = projections * (2 - (0.5 + 1 / 64 + 2 / 16384)) / 8
    assert abs((bf16 - nf4) - saved) / saved < 1e-3
    estimate = dict(
        precision="bf16",
        checkpointing="full",
        sequence_length=4096,
        micro_batch=1,
        shard_group=8,
        hbm_bytes=141 * memory.GIB,
    )
    assert memory.estimate(arch, lora=qlora, **estimate).total < memory.estimate(arch, lora=lora, **estimate).total


def test_a_qlora_recipe_plans_bf16_eager_with_an_nf4_base_and_less_memory_than_lora():
    import yaml
    from support import recipe_dict

    from tiered_training.planning.planner import resolve
    from tiered_training.recipe.loader import parse_recipe

    def plan(**extra):
        data = recipe_dict(
            **{
                "task": "sft",
                "model.catalog": "qwen2.5-32b",
                "model.init_checkpoint": "s3://bucket-for-tests/m/",
                "data.uri": "s3://bucket-for-tests/sft/",
                "budget.total_tokens": 100_000_000,
                "budget.global_batch_tokens": 4096 * 64,
                "compute.instance_type": "ml.p4de.24xlarge",
                **extra,
            }
        )
        recipe, lines = parse_recipe(yaml.safe_dump(data, sort_keys=False), "r.yaml")
        return resolve(recipe, source="r.yaml", lines=lines)

    lora, qlora = plan(**{"tuning.adapter": "lora"}), plan(**{"tuning.adapter": "qlora"})
    assert qlora.ok, qlora.errors
    config = qlora.run_config()
    assert config.sft.adapter == "qlora" and config.precision.precision == "bf16" and not config.precision.compile
    assert qlora.memory.parameters < lora.memory.parameters / 2
    assert qlora.to_dict()["tuning"]["adapter"] == "qlora"
    with pytest.raises(Exception, match="tuning.adapter qlora computes in bf16"):
        plan(**{"tuning.adapter": "qlora", "tuning.precision": "fp8"})


def test_a_qlora_model_whose_weights_do_not_split_into_whole_nf4_blocks_is_refused_by_the_planner(tmp_path):
    import json

    import yaml
    from support import recipe_dict

    from tiered_training.planning.planner import plan_file

    config = {  # Qwen2.5-0.5B's config.json (https://huggingface.co/Qwen/Qwen2.5-0.5B): k/v 128 x 896
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    data = recipe_dict(
        **{
            "task": "sft",
            "model": {"hf_config": str(tmp_path), "init_checkpoint": "s3://bucket-for-tests/m/"},
            "data.uri": "s3://bucket-for-tests/sft/",
            "budget.total_tokens": 10_000_000,
            "budget.global_batch_tokens": 4096 * 64,
            "tuning.adapter": "qlora",
        }
    )
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = plan_file(path)
    (error,) = plan.errors
    assert error.code == "qlora-shards" and "k_proj (128 x 896)" in error.message
    assert memory.nf4_unsplittable(models()["llama-3.1-8b"].architecture, ALL, 8) == []


def test_only_the_adapted_projections_are_counted_in_nf4():
    """The trainer quantises the base of each LoRA layer (training/models/nf4.py); other projections stay bf16."""
    arch = models()["llama-3.1-8b"].architecture
    qv = memory.frozen_layer_bytes(arch, "bf16", quantized=("q_proj", "v_proj"))
    bf16 = memory.frozen_layer_bytes(arch, "bf16", quantized=())
    sizes = arch.projection_sizes()
    nf4 = sum(memory.nf4_bytes(sizes[n][0] * sizes[n][1]) for n in ("q_proj", "v_proj"))
    assert bf16 - qv == 2 * (sizes["q_proj"][0] * sizes["q_proj"][1] + sizes["v_proj"][0] * sizes["v_proj"][1]) - nf4
    assert bf16 == 2 * arch.layer_parameters
