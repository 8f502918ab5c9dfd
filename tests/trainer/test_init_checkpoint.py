"""Starting checkpoints: the model type their config.json names (Qwen2 keeps its q/k/v biases),
the architecture and bias settings checked against the plan, and the tensors checked both ways."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny import tiny_config  # noqa: E402

from training.models.decoder import build_model, check_keys, check_matches, lm_config, read_config  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
QWEN = {"name": "tiny-qwen", "qkv_bias": True, "rope_theta": 1000000.0, "norm_eps": 1e-6}


def _qwen_checkpoint(directory: Path) -> Path:
    """A tiny random Qwen2 checkpoint, saved by transformers, with non-zero q/k/v biases."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    lm.save_pretrained(directory)
    return directory


def test_from_scratch_q_k_v_biases_build_qwen2_without_an_o_proj_bias():
    lm = build_model(tiny_config(model=QWEN).model)
    attention = lm.model.layers[0].self_attn
    assert lm.config.model_type == "qwen2"
    assert attention.q_proj.bias is not None and attention.k_proj.bias is not None and attention.v_proj.bias is not None
    assert attention.o_proj.bias is None
    assert build_model(tiny_config().model).config.model_type == "llama"
    # the planner's parameter count is the model's
    plan = tiny_config(model=QWEN).model
    assert sum(p.numel() for p in lm.parameters()) == plan.parameters


def test_bias_settings_are_compared_with_the_plan(tmp_path):
    import json

    with pytest.raises(ValueError, match=r"q/k/v bias: checkpoint True, plan False"):
        check_matches(lm_config(tiny_config(model=QWEN).model), tiny_config().model)
    llama = lm_config(tiny_config().model).to_dict()
    llama.update(attention_bias=True)  # a Llama with attention biases has an o_proj bias too
    (tmp_path / "config.json").write_text(json.dumps(llama))
    with pytest.raises(ValueError, match=r"o_proj bias: checkpoint True, plan False"):
        check_matches(read_config(tmp_path), tiny_config(model=QWEN).model)
    check_matches(lm_config(tiny_config(model=QWEN).model), tiny_config(model=QWEN).model)


def test_checkpoint_tensors_must_be_exactly_the_models():
    expected = {"a.weight", "a.bias", "lm_head.weight"}
    check_keys(expected, set(expected), Path("ckpt"))
    with pytest.raises(ValueError, match=r"1 tensor\(s\) the model needs are missing \(a.bias\)"):
        check_keys(expected, {"a.weight", "lm_head.weight"}, Path("ckpt"))
    with pytest.raises(ValueError, match=r"ckpt does not fit the model: 1 tensor\(s\) the model does not use \(b.bias\)"):
        check_keys(expected, expected | {"b.bias"}, Path("ckpt"))
    check_keys({"a.weight"}, {"a.weight", "lm_head.weight"}, Path("ckpt"), tied=True)  # a saved tied head


def test_an_unknown_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gemma2", "hidden_size": 64}')
    with pytest.raises(ValueError, match=r"config.json: model_type 'gemma2' is not one the trainer builds \(llama, qwen2, qwen3, mistral\)"):
        read_config(tmp_path)


@pytest.mark.torch
def test_a_qwen2_checkpoint_loads_with_its_biases_and_gives_transformers_logits(tmp_path):
    from transformers import Qwen2ForCausalLM

    init = _qwen_checkpoint(tmp_path / "qwen")
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "init_driver.py"), "--init", str(init), "--out", str(tmp_path / "out.pt")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    reference = Qwen2ForCausalLM.from_pretrained(init, torch_dtype=torch.float32).eval()
    assert got["model_type"] == "qwen2"
    for name, value in reference.state_dict().items():
        assert torch.equal(got["state"][name], value), name  # every tensor, biases included, loaded exactly
    sys.path.insert(0, str(HERE))
    from init_driver import tokens

    with torch.no_grad():
        expected = reference(input_ids=tokens()).logits
        # the biases matter: without them the logits move by far more than the tolerance
        for layer in reference.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.zero_()
        unbiased = reference(input_ids=tokens()).logits
    assert (unbiased - expected).abs().max() > 1e-2
    # The same class, weights and SDPA kernel on the same CPU: equal up to fp32 rounding of a
    # differently blocked matmul (torch.testing's fp32 defaults: rtol 1.3e-6, atol 1e-5).
    torch.testing.assert_close(got["logits"], expected)
