"""A random Hugging Face checkpoint of a RunConfig's model: the rehearsal's stand-in for ``model.init_checkpoint``.

    python -m training.models.random_checkpoint RUNCONFIG_MODEL_JSON OUT_DIR [--seed N]

Writes ``config.json`` and bf16 safetensors, as ``save_pretrained`` writes a published
checkpoint (transformers loads it), initialised as transformers initialises a Llama, so its
weights differ from the trainer's fresh initialisation and a run that loads it starts from them.
Checkpoints written by transformers itself are what the tests of ``model.init_checkpoint`` load.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tiered_training.contract.runconfig import ModelConfig


def write_random_checkpoint(model: ModelConfig, out_dir: Path, *, seed: int = 0, std: float | None = None) -> Path:
    """``config.json`` and bf16 ``model.safetensors`` of the decoder initialised as transformers initialises
    a Llama (every weight N(0, 0.02), or N(0, ``std``), biases zero, norms one; seeded): unlike the
    trainer, which scales each block's output projections down, so a run that loads it starts from
    another loss."""
    from safetensors.torch import save_file

    from training.models.decoder import INITIALIZER_RANGE, CausalLM, _init_parameter, lm_config

    lm = CausalLM(lm_config(model))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in lm.named_parameters():
            _init_parameter(name, param, model.layers, generator, std=std or INITIALIZER_RANGE, scale_outputs=False)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = lm.state_dict()
    if lm.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # as transformers saves a tied head
    save_file(
        {name: value.to(torch.bfloat16).contiguous() for name, value in state.items()},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    lm.config.save_pretrained(out_dir, dtype=torch.bfloat16)
    return out_dir


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
