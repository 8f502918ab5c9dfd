"""A tiny RunConfig and a learnable synthetic token dataset, shared by the trainer tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tiered_training.contract.runconfig import RunConfig

VOCAB = 256


def tiny_config(**overrides) -> RunConfig:
    """A 2-layer, 64-wide Llama with GQA; override sections with dicts, e.g. precision={...}."""
    data = {
        "recipe_name": "tiny-test",
        "model": {
            "name": "tiny-llama", "layers": 2, "hidden_size": 64, "attention_heads": 4, "kv_heads": 2,
            "ffn_size": 128, "vocab_size": VOCAB, "max_sequence_length": 256, "rope_theta": 10000.0,
        },
        "parallel": {"sharding": "full", "shard_group_size": 2},
        "precision": {"precision": "fp32", "activation_checkpointing": "none", "loss_chunk_tokens": 24},
        "batch": {"sequence_length": 32, "micro_batch_size": 2, "grad_accum_steps": 1, "global_batch_tokens": 128,
                  "total_steps": 20},
        "optimizer": {"lr": 3e-3, "min_lr_ratio": 0.1, "warmup_steps": 2, "schedule": "cosine", "weight_decay": 0.01,
                      "grad_clip": 1.0, "beta1": 0.9, "beta2": 0.95},
        "data": {"token_dtype": "uint16", "seed": 1234},
        "checkpoint": {"interval_minutes": 0, "interval_steps": 5, "keep_last": 3, "shutdown_deadline_seconds": 60},
        "hardware": {"instance_type": "cpu", "gpus_per_node": 2, "peak_bf16_flops": 1e12, "hbm_bytes": 2**34},
        "probe": {"steps": 3},
    }
    for section, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(section), dict):
            data[section] = {**data[section], **value}
        else:
            data[section] = value
    return RunConfig.model_validate(data)


def tiny_lm(model: dict | None = None, *, seed: int = 0):
    """The trainer's decoder for ``tiny_config(model=...)``, on the CPU, initialised as the trainer does."""
    import torch

    from training.models.decoder import build_model, materialize

    lm = build_model(tiny_config(**({"model": model} if model else {})).model)
    materialize(lm, torch.device("cpu"), seed=seed)
    return lm


def hf_config(model):
    """transformers' LlamaConfig or Qwen2Config (q/k/v biases) for a RunConfig's architecture: the oracle."""
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=model.vocab_size, hidden_size=model.hidden_size, intermediate_size=model.ffn_size,
        num_hidden_layers=model.layers, num_attention_heads=model.attention_heads, num_key_value_heads=model.kv_heads,
        max_position_embeddings=model.max_sequence_length, rms_norm_eps=model.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_theta},
        tie_word_embeddings=model.tied_embeddings, initializer_range=0.02, use_cache=False,
    )
    if model.qkv_bias:
        return Qwen2Config(**common, use_sliding_window=False)
    return LlamaConfig(**common, attention_bias=False)


def hf_model(model):
    """transformers' LlamaForCausalLM or Qwen2ForCausalLM of the architecture (random weights)."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    config = hf_config(model)
    return (Qwen2ForCausalLM if config.model_type == "qwen2" else LlamaForCausalLM)(config)


def lm_loss(lm, ids):
    """Next-token cross-entropy of ``ids`` (fp32 logits), as a causal LM's ``labels=ids`` loss."""
    import torch.nn.functional as F

    return F.cross_entropy(lm(ids)[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())


def write_learnable_shards(data_dir: Path, *, tokens: int = 40_000, shards: int = 2, seed: int = 0, dtype=np.uint16) -> None:
    """A noisy bigram language: next = (3 * prev + 7) % 256 most of the time.

    A model that learns the bigram gets far below ln(256) = 5.5 nats.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    seq = np.empty(tokens, dtype=np.int64)
    seq[0] = 1
    noise = rng.random(tokens) < 0.1
    random_tokens = rng.integers(0, VOCAB, tokens)
    for i in range(1, tokens):
        seq[i] = random_tokens[i] if noise[i] else (3 * seq[i - 1] + 7) % VOCAB
    for index, part in enumerate(np.array_split(seq, shards)):
        part.astype(dtype).tofile(data_dir / f"shard-{index:05d}.bin")


def write_config(cfg: RunConfig, path: Path) -> Path:
    Path(path).write_text(cfg.to_json())
    return Path(path)


def read_json(path: Path):
    return json.loads(Path(path).read_text())


# ---- supervised fine-tuning: a tiny chat dataset and a tokenizer for it (training.tools.tiny_chat) -------

from training.tools.tiny_chat import (  # noqa: E402,F401
    CHAT_ROLES,
    CHAT_SPECIALS,
    CHAT_TEMPLATE,
    CHAT_TEMPLATE_MARKED,
    CHAT_TEXT,
    CHAT_WORDS,
    tiny_chat_examples,
    tiny_chat_jsonl,
    tiny_chat_tokenizer,
)


def run_sft_data(out: Path, tokenizer, *inputs, **options) -> tuple[int, str, str]:
    """``python -m training.sft_data INPUTS --tokenizer T --out OUT --option value ...`` in-process:
    (exit code, stdout, stderr)."""
    import contextlib
    import io

    from training import sft_data

    args = [str(i) for i in inputs] + ["--tokenizer", str(tokenizer), "--out", str(out)]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = sft_data.main(args)
    return code, stdout.getvalue(), stderr.getvalue()
