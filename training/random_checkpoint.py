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

from .model import causal_lm_class, hf_config


def write_random_checkpoint(model: ModelConfig, out_dir: Path, *, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = hf_config(model)  # Qwen2 for Qwen shapes (q/k/v biases), Llama otherwise
    lm = causal_lm_class(config)(config).to(torch.bfloat16)
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
