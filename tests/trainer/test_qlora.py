"""QLoRA: LoRA adapters on a frozen base whose projections are NF4 (torchao), alone and under FSDP2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from tiny import tiny_config  # noqa: E402

from training.models.decoder import CausalLM, lm_config  # noqa: E402
from training.models.lora import apply_lora  # noqa: E402
from training.models.nf4 import NF4_BLOCK, NF4_SCALER_BLOCK, check_shardable, dequantized, is_nf4, quantize_base  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODEL = {"hidden_size": 256, "attention_heads": 4, "kv_heads": 2, "ffn_size": 512}
# NF4's 16 code points (torchao's table, QLoRA's NormalFloat); the widest gap between neighbours is 1 - 0.7230
CODES = torch.tensor([-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0, 0.0796, 0.1609, 0.2461,
                      0.3379, 0.4407, 0.5626, 0.7230, 1.0])


def _pair(seed: int = 0):
    """A LoRA model with trained-looking adapters, and the same model with its base in NF4."""
    cfg = tiny_config(model={**MODEL, "init_checkpoint": "s3://b/m/"}, precision={"precision": "bf16"}, sft={"adapter": "qlora", "lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0}})
    torch.manual_seed(seed)
    plain = apply_lora(CausalLM(lm_config(cfg.model)), cfg.sft.lora)
    with torch.no_grad():
        for name, param in plain.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.02)  # B starts at zero; a non-zero update is what the check needs
            elif not name.endswith("norm.weight"):
                param.copy_(param.to(torch.bfloat16))  # the checkpoint's bf16 values
    quantized = apply_lora(CausalLM(lm_config(cfg.model)), cfg.sft.lora)
    quantized.load_state_dict(plain.state_dict())
    return plain, quantize_base(quantized)


def test_the_qlora_models_logits_are_the_dequantised_bases_bit_for_bit():
    """Each adapted projection runs torchao's linear_nf4: its weight dequantised to the input's dtype. A plain
    model whose base weights are the NF4 round trip computes the same logits, to the last bit."""
    plain, quantized = _pair()
    bases = {n: p for n, p in quantized.named_parameters() if n.endswith("base_layer.weight")}
    assert len(bases) == 2 * 7 and all(is_nf4(p) and not p.requires_grad for p in bases.values())
    reference = dict(plain.named_parameters())
    with torch.no_grad():
        for name, param in bases.items():
            reference[name].copy_(dequantized(param))
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(quantized.eval()(ids), plain.eval()(ids))


def test_the_nf4_round_trip_stays_within_its_derived_bound():
    """Per element: half the widest gap between code points times the block's absmax, plus the error of
    the double-quantised absmax (half a step of 2 * absmax / 256 over its block of 256 scales), plus bf16 rounding."""
    plain, quantized = _pair()
    original = dict(plain.named_parameters())
    for name, param in quantized.named_parameters():
        if not is_nf4(param):
            continue
        weight = original[name].detach().float().flatten()
        error = (dequantized(param).flatten() - weight).abs()
        absmax = weight.view(-1, NF4_BLOCK).abs().amax(1)
        centred = absmax - absmax.mean()
        scale_step = centred.view(-1, NF4_SCALER_BLOCK).abs().amax(1) * 2 / 256
        half_gap = (CODES.diff().max() / 2).item()
        bound = half_gap * absmax + scale_step.repeat_interleave(NF4_SCALER_BLOCK) / 2
        bound = (bound + 2**-8 * (absmax + scale_step.repeat_interleave(NF4_SCALER_BLOCK))).repeat_interleave(NF4_BLOCK)
        assert bool((error <= bound).all()), name
        assert error.max() > 0  # it is quantised


def test_a_projection_that_does_not_split_into_whole_scale_blocks_is_refused_by_name():
    _, quantized = _pair()
    check_shardable(quantized, 2)
    with pytest.raises(ValueError, match=r"k_proj is 128 x 256; NF4 under FSDP2 needs .* by 16384 x 4"):
        check_shardable(quantized, 4)


@pytest.mark.torch
def test_qlora_trains_under_fsdp2_on_two_ranks_and_exports_the_dequantised_base_merged(tmp_path):
    """2 ranks over gloo: the base's projections stay NF4 shards, the adapters train, the merged export is the
    dequantised base plus the update (its logits are the trainer's within bf16 compute's error) and the adapter
    exports as LoRA's does."""
    from safetensors.torch import load_file
    from tiny import hf_model, tiny_chat_tokenizer

    from training.models.decoder import read_config

    init = tmp_path / "init"  # a checkpoint saved by transformers, with the tiny chat tokenizer
    torch.manual_seed(0)
    hf_model(tiny_config(model=MODEL).model).save_pretrained(init)
    tiny_chat_tokenizer(init)
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "qlora_driver.py"), "--root", str(tmp_path), "--init", str(init), "--out",
                           str(tmp_path / "out.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    out = json.loads((tmp_path / "out.json").read_text())
    kinds = out["kinds"]
    assert {k for k, v in kinds.items() if v == "NF4Tensor"} == {k for k in kinds if k.endswith("base_layer.weight")}
    losses = list(out["losses"].values())
    assert len(losses) == 6 and all(loss == loss for loss in losses) and losses[-1] < losses[0]
    merged = tmp_path / "exports" / "merged"
    lm = CausalLM(read_config(merged))
    lm.load_state_dict(load_file(str(merged / "model.safetensors")))
    saved_logits = torch.load(tmp_path / "logits.pt")
    with torch.no_grad():
        logits = lm.eval()(saved_logits["tokens"])
    # the trainer computes in bf16 (FSDP2's param dtype), the export in fp32: bf16's error on logits of this size
    assert (logits - saved_logits["logits"]).abs().max() < 0.05 * logits.abs().max()
    adapter = tmp_path / "exports" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "LORA"
    adapters = load_file(str(adapter / "adapter_model.safetensors"))
    assert adapters and all(".lora_" in key for key in adapters)
    # each merged weight is the checkpoint's weight through NF4 and back, plus alpha / rank * B @ A, exactly
    from torchao.quantization import to_nf4

    start, exported = load_file(str(init / "model.safetensors")), load_file(str(merged / "model.safetensors"))
    for key, weight in exported.items():
        module = key.removesuffix(".weight")
        a = adapters.get(f"base_model.model.{module}.lora_A.weight")
        if a is None:
            assert torch.equal(weight, start[key].to(torch.bfloat16).float()), key  # the frozen rest, in bf16
            continue
        b = adapters[f"base_model.model.{module}.lora_B.weight"]
        base = to_nf4(start[key].to(torch.bfloat16)).get_original_weight().float()
        assert torch.equal(weight, base + 2.0 * (b @ a)), key
