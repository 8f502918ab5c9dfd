"""A random Hugging Face checkpoint of a RunConfig's model: the rehearsal's stand-in for ``model.init_checkpoint``.

    python -m training.random_checkpoint RUNCONFIG_MODEL_JSON OUT_DIR [--seed N]

Writes ``config.json`` and bf16 safetensors, as ``save_pretrained`` writes a published
checkpoint, with transformers' own initialisation (seeded), so its weights differ from the
trainer's fresh initialisation and a run that loads it starts from them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tiered_training.runconfig import ModelConfig


def hf_config(model: ModelConfig):
    """transformers' LlamaConfig or Qwen2Config (q/k/v biases) for the RunConfig's architecture."""
    from transformers import LlamaConfig, Qwen2Config

    from .model import INITIALIZER_RANGE, model_type

    common = dict(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_size,
        num_hidden_layers=model.layers,
        num_attention_heads=model.attention_heads,
        num_key_value_heads=model.kv_heads,
        max_position_embeddings=model.max_sequence_length,
        rms_norm_eps=model.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_theta},
        tie_word_embeddings=model.tied_embeddings,
        initializer_range=INITIALIZER_RANGE,
        use_cache=False,
    )
    if model_type(model) == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False)
    return LlamaConfig(**common, attention_bias=False)


def hf_model(model: ModelConfig):
    """transformers' LlamaForCausalLM or Qwen2ForCausalLM of the architecture (random weights)."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    config = hf_config(model)
    return (Qwen2ForCausalLM if config.model_type == "qwen2" else LlamaForCausalLM)(config)


def write_random_checkpoint(model: ModelConfig, out_dir: Path, *, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    lm = hf_model(model).to(torch.bfloat16)  # Qwen2 for Qwen shapes (q/k/v biases), Llama otherwise
    lm.save_pretrained(out_dir, safe_serialization=True)
    return Path(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_json", help="the RunConfig's model section as JSON")
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = ModelConfig.model_validate(json.loads(Path(args.model_json).read_text()))
    write_random_checkpoint(model, Path(args.out_dir), seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
