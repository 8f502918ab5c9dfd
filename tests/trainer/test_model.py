"""The trainer's decoder against transformers' LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and
MistralForCausalLM: the same weights
give the same logits and gradients bit for bit (the same operations in the same order), packed
examples and Llama 3.1's rope scaling included; its config.json loads back into transformers; and a
worker that imports the trainer does not import transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny import hf_model, tiny_config  # noqa: E402

from training.models.decoder import CausalLM, lm_config, read_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QWEN = {"name": "tiny-qwen", "qkv_bias": True, "rope_theta": 1000000.0, "norm_eps": 1e-6}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def _pair(tmp_path: Path, reference) -> CausalLM:
    """The trainer's decoder built from ``reference``'s saved config.json, holding its weights."""
    reference.save_pretrained(tmp_path)
    lm = CausalLM(read_config(tmp_path))
    lm.load_state_dict(reference.state_dict(), strict=True)
    return lm


def _tokens(length: int = 32) -> torch.Tensor:
    return torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("model", [None, QWEN], ids=["llama", "qwen2"])
def test_logits_and_gradients_equal_transformers_bit_for_bit(tmp_path, model):
    torch.manual_seed(0)
    reference = hf_model(tiny_config(**({"model": model} if model else {})).model)
    if model:
        with torch.no_grad():  # biases that matter
            for name, param in reference.named_parameters():
                if name.endswith(".bias"):
                    param.normal_(0.0, 0.5)
    lm = _pair(tmp_path, reference)
    ids = _tokens()
    packed = torch.cat([torch.arange(10), torch.arange(22)])[None].expand(2, -1)  # two examples per row
    for positions in (None, packed):
        with torch.no_grad():
            expected = reference.eval()(input_ids=ids, position_ids=positions).logits
        # gradients recorded: packed rows take SDPA under the dense mask, as transformers does (without
        # them the CPU runs FlexAttention, tests/trainer/test_attention.py)
        assert torch.equal(lm.eval()(ids, positions).detach(), expected)
    with torch.no_grad():  # the packed mask matters: the second example alone gives its logits
        alone = lm(ids[:, 10:])
        # the same function through another kernel (FlexAttention's block mask, not is_causal) on another
        # length: fp32 rounding apart (torch.testing's fp32 defaults)
        torch.testing.assert_close(lm(ids, packed)[:, 10:], alone)
        assert not torch.allclose(lm(ids)[:, 10:], alone, atol=1e-3)
    reference.train()(input_ids=ids).logits.square().mean().backward()
    lm.train()(ids).square().mean().backward()
    grads = dict(lm.named_parameters())
    for name, param in reference.named_parameters():
        assert torch.equal(grads[name].grad, param.grad), name


def test_llama3_rope_scaling_equals_transformers_and_both_config_forms_read_alike(tmp_path):
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      rope_parameters={**LLAMA3_ROPE, "rope_theta": 500000.0})
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    lm = _pair(tmp_path / "v5", reference).eval()
    assert lm.config.rope_scaling == LLAMA3_ROPE and lm.config.rope_theta == 500000.0
    ids = _tokens(128)  # beyond original_max_position_embeddings: the scaled frequencies matter
    with torch.no_grad():
        assert torch.equal(lm(ids), reference(input_ids=ids).logits)
        plain = CausalLM(read_config(tmp_path / "v5"))
        plain.config.rope_scaling = None
        from training.models.decoder import reset_rope

        reset_rope(plain, torch.device("cpu"))
        plain.load_state_dict(reference.state_dict())
        assert not torch.allclose(plain.eval()(ids), lm(ids), atol=1e-3)
    raw = json.loads((tmp_path / "v5" / "config.json").read_text())  # transformers 4's form: rope_theta + rope_scaling
    rope = raw.pop("rope_parameters")
    raw["rope_theta"] = rope.pop("rope_theta")
    raw["rope_scaling"] = rope
    (tmp_path / "v4").mkdir()
    (tmp_path / "v4" / "config.json").write_text(json.dumps(raw))
    assert read_config(tmp_path / "v4") == lm.config.__class__(**{**lm.config.__dict__, "source": raw})


@pytest.mark.parametrize("change,message", [
    ({"model_type": "gemma"}, r"model_type 'gemma' is not one the trainer builds \(llama, qwen2, qwen3, mistral\)"),
    ({"model_type": "mistral", "sliding_window": 4096}, r"sliding_window: 4096; the trainer runs full attention only"),
    ({"model_type": "qwen3", "use_sliding_window": True}, r"use_sliding_window: true; the trainer runs full attention only"),
    ({"model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention"]},
     r"layer_types has sliding_attention; the trainer runs full_attention only"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, r"rope type 'yarn' is not one the trainer builds"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}},
     r"llama3 rope scaling needs low_freq_factor, high_freq_factor, original_max_position_embeddings"),
    ({"head_dim": 33}, r"head_dim 33 is not a positive even integer"),
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu': the trainer builds SwiGLU \(silu\) MLPs only"),
    ({"mlp_bias": True}, r"mlp_bias: true; the trainer builds MLPs without biases"),
    ({"model_type": "qwen2", "use_sliding_window": True}, r"use_sliding_window: true; the trainer runs full attention only"),
])
def test_a_config_the_decoder_cannot_build_is_refused(tmp_path, change, message):
    raw = {**lm_config(tiny_config().model).to_dict(), **change}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message):
        read_config(tmp_path)


def test_the_exported_config_loads_into_transformers_with_the_same_logits(tmp_path):
    from safetensors.torch import save_file

    for model in (None, QWEN):
        cfg = tiny_config(**({"model": model} if model else {})).model
        torch.manual_seed(0)
        lm = CausalLM(lm_config(cfg)).eval()
        out = tmp_path / cfg.name
        out.mkdir()
        lm.config.save_pretrained(out, dtype=torch.float32)
        save_file({k: v.contiguous() for k, v in lm.state_dict().items()}, str(out / "model.safetensors"))
        loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        assert type(loaded).__name__ == ("Qwen2ForCausalLM" if model else "LlamaForCausalLM")
        with torch.no_grad():
            assert torch.equal(loaded(input_ids=_tokens()).logits, lm(_tokens()))


def test_a_training_worker_does_not_import_transformers():
    """transformers costs a worker several CPU-seconds of imports; the trainer needs none of it."""
    code = "import sys, training.trainer, training.__main__; print(sorted(m for m in ('transformers', 'peft') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def _family(kind: str, head_dim: int = 16):
    """A tiny random Qwen3 (QK-norm, rope_theta 1e6; ``head_dim`` 32 is not hidden / heads, as in Qwen3 0.6B, 4B
    and 32B) or Mistral (v0.3's shape: no sliding window) of transformers."""
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, use_cache=False)
    torch.manual_seed(0)
    if kind == "qwen3":
        config = transformers.Qwen3Config(**common, head_dim=head_dim, rope_parameters={"rope_type": "default",
                                          "rope_theta": 1000000.0}, use_sliding_window=False, attention_bias=False)
        model = transformers.Qwen3ForCausalLM(config)
        with torch.no_grad():  # q/k norm weights that matter (they start as ones)
            for name, param in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    param.uniform_(0.5, 1.5)
        return model
    config = transformers.MistralConfig(**common, sliding_window=None,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return transformers.MistralForCausalLM(config)


@pytest.mark.parametrize("kind, head_dim", [("qwen3", 16), ("qwen3", 32), ("mistral", 16)])
def test_qwen3_and_mistral_equal_transformers_bit_for_bit_and_export_back_bit_equal(tmp_path, kind, head_dim):
    """A transformers checkpoint loads into the decoder with every tensor used; the logits (packed rows too) and
    gradients are transformers' to the last bit; the export is the checkpoint again, tensor for tensor, under
    the same model_type, and loads into the same transformers class."""
    from safetensors.torch import load_file, save_file

    reference = _family(kind, head_dim)
    lm = _pair(tmp_path / "init", reference)
    assert lm.config.model_type == kind and lm.config.qk_norm == (kind == "qwen3")
    assert lm.model.layers[0].self_attn.q_proj.weight.shape == (4 * head_dim, 64) and lm.config.head_dim == head_dim
    assert set(lm.state_dict()) == set(reference.state_dict())
    ids = _tokens()
    packed = torch.cat([torch.arange(10), torch.arange(22)])[None].expand(2, -1)
    for positions in (None, packed):  # gradients recorded: the dense mask on the CPU, as transformers
        with torch.no_grad():
            expected = reference.eval()(input_ids=ids, position_ids=positions).logits
        assert torch.equal(lm.eval()(ids, positions).detach(), expected)
    reference.train()(input_ids=ids).logits.square().mean().backward()
    lm.train()(ids).square().mean().backward()
    grads = dict(lm.named_parameters())
    for name, param in reference.named_parameters():
        assert torch.equal(grads[name].grad, param.grad), name
    if kind == "qwen3":  # the norms are used: without them the logits differ
        plain = CausalLM(read_config(tmp_path / "init"))
        plain.config.qk_norm = False
        plain.load_state_dict(reference.state_dict(), strict=False)
        with torch.no_grad():
            assert not torch.allclose(plain.eval()(ids), lm.eval()(ids), atol=1e-3)
    out = tmp_path / "export"
    out.mkdir()
    lm.config.save_pretrained(out, dtype=torch.float32)
    save_file({k: v.contiguous() for k, v in lm.state_dict().items()}, str(out / "model.safetensors"))
    original, exported = load_file(str(tmp_path / "init" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(exported) == set(original) and all(torch.equal(exported[k], original[k]) for k in original)
    assert json.loads((out / "config.json").read_text())["model_type"] == kind
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(loaded) is type(reference)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, reference.eval()(input_ids=ids).logits)
