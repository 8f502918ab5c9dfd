"""LoRA and QLoRA from counted work: the frozen base's GEMMs without weight gradients, the adapters'
thin GEMMs and elementwise work, NF4 dequantisation, no reduce-scatter or optimiser step for frozen
weights; and memory without their gradients or optimiser state. At the same configuration as a full
fine-tune, LoRA must then use less memory and run faster, in BF16 and in FP8."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from support import recipe_dict

from tiered_training import catalog as catalogs
from tiered_training import report
from tiered_training.contract.architecture import Lora
from tiered_training.planning import memory, perf
from tiered_training.planning.planner import plan_file, resolve
from tiered_training.recipe.loader import parse_recipe

ARCH = catalogs.models()["llama-3.1-8b"].architecture
P5 = catalogs.instances()["ml.p5.48xlarge"]
HW = perf.Hardware.of(P5)
PARAMS = perf.stored_parameters()
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA = Lora(32, TARGETS, dropout=False)
QLORA = Lora(32, TARGETS, dropout=False, quantized=True)
SEQ, GPUS, ACCUM = 4096, 8, 4
ADAPTER_TERMS = {"LoRA: adapter GEMMs", "LoRA: adapter elementwise", "LoRA: adapter dropout"}


def base(precision: str, **kw) -> perf.Setting:
    recipe = "tensorwise" if precision == "fp8" else None
    fields = dict(precision=precision, fp8_recipe=recipe, checkpointing="none", micro_batch=2, shard_group=8)
    return perf.Setting(**{**fields, "document_mask": True, **kw})


def step(setting: perf.Setting) -> perf.StepTime:
    return perf.step_time(ARCH, HW, setting, sequence_length=SEQ, gpus=GPUS, accum=ACCUM, params=PARAMS)


def mem(setting: perf.Setting) -> memory.MemoryBreakdown:
    return memory.estimate(
        ARCH, precision=setting.precision, checkpointing=setting.checkpointing, lora=setting.lora,
        document_mask=True, sequence_length=SEQ, micro_batch=setting.micro_batch, shard_group=8,
        hbm_bytes=P5.hbm_bytes, compiled=setting.compile,
    )


def with_lora(setting: perf.Setting, lora: Lora | None = LORA, **kw) -> perf.Setting:
    return dataclasses.replace(setting, lora=lora, **kw)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_lora_uses_less_memory_and_runs_faster_than_the_full_fine_tune_at_the_same_configuration(precision, checkpointing):
    """Llama 3 8B, 4K tokens, 8 H100, rank 32 on every projection, no dropout."""
    full = base(precision, checkpointing=checkpointing)
    tuned = with_lora(full)
    assert mem(tuned).total < mem(full).total
    assert step(tuned).tokens_per_second_per_gpu > step(full).tokens_per_second_per_gpu
    # the saving comes from the work that is gone: weight gradients, their reduction, the optimiser
    assert step(tuned).gemm < 0.7 * step(full).gemm and step(tuned).optimizer < step(full).optimizer / 50
    assert step(tuned).communication_total < step(full).communication_total


@pytest.mark.parametrize("compiled", [False, True])
def test_qlora_uses_less_memory_than_lora_and_pays_for_dequantisation(compiled):
    lora, qlora = with_lora(base("bf16", compile=compiled)), with_lora(base("bf16", compile=compiled), QLORA)
    assert mem(qlora).total < mem(lora).total and mem(qlora).parameters < mem(lora).parameters / 2
    fast, slow = step(lora), step(qlora)
    # Every projection's weight dequantised forward and again backward, per micro-batch: torchao's eager
    # get_original_weight moves 32 bytes per weight element, whatever the number of tokens.
    weights = sum(k * n for k, n in ARCH.projection_sizes().values())
    bandwidth = HW.hbm_bytes_per_s * PARAMS.memory_efficiency
    kernels = ACCUM * ARCH.layers * 2 * len(TARGETS) * perf.NF4_DEQUANT_KERNELS * perf.KERNEL_SECONDS
    assert slow.dequantization == pytest.approx(ACCUM * ARCH.layers * 2 * 32 * weights / bandwidth + kernels, rel=0.01)
    assert fast.dequantization == 0 and slow.seconds > fast.seconds
    # FSDP still all-gathers the frozen base, in NF4: about a quarter of the bf16 bytes for the projections
    assert slow.communication_total < fast.communication_total


def test_the_frozen_base_runs_forward_and_input_gradient_gemms_only():
    full, tuned = step(base("bf16")), step(with_lora(base("bf16")))
    assert tuned.gemm == pytest.approx(full.gemm * 2 / 3, rel=0.01)
    # Compiled FP8 drops the unused weight-gradient GEMM (AOTAutograd); eager FP8 runs it: torchao's
    # Float8Linear computes it whether or not the weight needs it.
    fp8_full, fp8_tuned = step(base("fp8")), step(with_lora(base("fp8")))
    assert fp8_tuned.gemm < 0.7 * fp8_full.gemm
    eager_full, eager_tuned = step(base("fp8", compile=False)), step(with_lora(base("fp8", compile=False)))
    assert eager_tuned.gemm > 0.9 * eager_full.gemm and not eager_tuned.frozen
    assert "eager FP8 computes the unused weight gradient" in eager_tuned.terms()[0].what


def test_the_adapters_thin_gemms_are_bound_by_the_bytes_they_move():
    """A rank-r GEMM does 2 M K r FLOPs on M K + K r + M r elements: at rank 32 the bytes take longer than the
    FLOPs, so rank 8 costs about what rank 32 does, and twice the tokens about twice the time."""
    r8, r32 = step(with_lora(base("bf16"), Lora(8, TARGETS, False))), step(with_lora(base("bf16")))
    assert r8.adapter_gemm == pytest.approx(r32.adapter_gemm, rel=0.05)
    half = step(with_lora(base("bf16", micro_batch=1)))
    overheads = ACCUM * ARCH.layers * 6 * len(TARGETS) * PARAMS.gemm_overhead_seconds  # each GEMM's fixed cost
    assert r32.adapter_gemm - overheads == pytest.approx(2 * (half.adapter_gemm - overheads), rel=0.01)
    # six GEMMs per adapter: each reads or writes the adapted input (fan-in) or the projection's output
    # (fan-out) once, at e bytes per element
    tokens = 2 * SEQ
    wide = sum(3 * (k + n) for k, n in ARCH.projection_sizes().values())
    floor = ACCUM * ARCH.layers * 2 * tokens * wide / (HW.hbm_bytes_per_s * PARAMS.memory_efficiency)
    assert floor + overheads < r32.adapter_gemm < 1.05 * (floor + overheads)


def test_adapter_dropout_is_its_own_term_in_step_time_and_memory():
    without, dropped = with_lora(base("bf16")), with_lora(base("bf16"), Lora(32, TARGETS, dropout=True))
    assert step(without).adapter_dropout == 0 < step(dropped).adapter_dropout
    assert mem(without).adapter_dropout == 0
    # each adapter keeps a bf16 copy of its input and a one-byte mask, every layer, without checkpointing
    inputs = sum(k for k, _ in ARCH.projection_sizes().values())
    assert mem(dropped).adapter_dropout == ARCH.layers * 3 * inputs * 2 * SEQ
    assert mem(dropped).total > mem(without).total


def test_step_time_lists_the_lora_terms_and_a_full_fine_tune_does_not():
    names = [t.name for t in step(with_lora(base("bf16"), QLORA)).terms()]
    assert ADAPTER_TERMS | {"QLoRA: NF4 dequantisation"} <= set(names)
    assert "QLoRA: NF4 dequantisation" not in {t.name for t in step(with_lora(base("bf16"))).terms()}
    assert not any(t.name.startswith(("LoRA", "QLoRA")) for t in step(base("bf16")).terms())
    terms = step(with_lora(base("bf16"))).terms()
    assert sum(t.seconds for t in terms) == pytest.approx(step(with_lora(base("bf16"))).seconds)


def plan_at_the_shape(adapter: str, precision: str, dropout: float = 0.0):
    data = recipe_dict(**{
        "task": "sft", "model.catalog": "llama-3.1-8b", "model.init_checkpoint": "s3://bucket-for-tests/base/",
        "data.uri": "s3://bucket-for-tests/sft/", "budget.total_tokens": 100_000_000,
        "budget.global_batch_tokens": SEQ * 64, "compute.instance_type": "ml.p5.48xlarge",
        "tuning.adapter": adapter, "tuning.precision": precision,
        "tuning.lora": {"rank": 32, "alpha": 64, "dropout": dropout},
    })
    recipe, lines = parse_recipe(yaml.safe_dump(data, sort_keys=False), "r.yaml")
    return resolve(recipe, source="r.yaml", lines=lines)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_the_full_parameter_alternative_is_slower_than_lora_at_the_same_shape(precision):
    plan = plan_at_the_shape("lora", precision)
    assert plan.ok, plan.errors
    full = plan.full_parameter
    assert full is not None and full.nodes == 1
    assert full.tokens_per_second_per_gpu < plan.estimates.tokens_per_second_per_gpu
    finding = next(f for f in plan.findings if f.code == "full-parameter-alternative")
    assert f"LoRA's {plan.estimates.tokens_per_second_per_gpu:,.0f} tokens/s per GPU" in finding.message
    lines = [str(line) for line in report.explain_lines(plan)]
    assert all(any(line.strip().startswith(name) for line in lines) for name in ADAPTER_TERMS)
    text = " ".join(" ".join(line.split()) for line in lines)
    assert f"(LoRA: {plan.estimates.tokens_per_second_per_gpu:,.0f} tokens/s per GPU on 1 node(s)" in text


def test_explain_of_the_lora_template_and_a_qlora_plan_lists_the_terms():
    from support import ROOT

    lines = [str(line) for line in report.explain_lines(plan_file(ROOT / "recipes/qwen2.5-32b-lora.yaml"))]
    dropout = next(line for line in lines if line.strip().startswith("LoRA: adapter dropout"))
    assert float(dropout.split()[3]) > 0  # the template sets dropout 0.05
    # without checkpointing every layer keeps its adapters' dropout copies: a memory line of their own
    plan = plan_at_the_shape("lora", "bf16", dropout=0.05)
    assert plan.decision("tuning.activation_checkpointing").value == "none"
    memory_line = next(str(line) for line in report.explain_lines(plan) if str(line).strip().startswith("adapter_dropout"))
    assert plan.memory.adapter_dropout > 0
    assert float(memory_line.split()[1]) == pytest.approx(plan.memory.adapter_dropout / 2**30, abs=0.01)
    qlora = [str(line) for line in report.explain_lines(plan_at_the_shape("qlora", "bf16"))]
    assert any(line.strip().startswith("QLoRA: NF4 dequantisation") for line in qlora)
