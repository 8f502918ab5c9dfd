"""Runs under ``torchrun`` for ``test_qlora.py``: QLoRA training of a small model (its projections hold whole
NF4 scale blocks on each of 2 ranks) from a starting checkpoint, then its logits and exports.

    torchrun --nproc_per_node 2 tests/trainer/qlora_driver.py --root DIR --init INIT --out result.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tiny import tiny_config  # noqa: E402

from training.distributed.dist import exit_process, init_distributed, shut_down  # noqa: E402
from training.paths import Paths  # noqa: E402
from training.tools.tiny_chat import main as tiny_chat  # noqa: E402
from training.trainer import export_model, run  # noqa: E402

MODEL = {"hidden_size": 256, "attention_heads": 4, "kv_heads": 2, "ffn_size": 512}
STEPS = 6


def qlora_config(init: Path, **export):
    return tiny_config(
        model={**MODEL, "init_checkpoint": str(init), "hf_id": "tiny-org/tiny-llama"},
        precision={"precision": "bf16", "activation_checkpointing": "full"},
        batch={"total_steps": STEPS},
        checkpoint={"interval_steps": 100},
        optimizer={"lr": 1e-2, "warmup_steps": 1},
        sft={"adapter": "qlora", "lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0}},
        export={"format": "merged", "dtype": "fp32", **export},
    )


def tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(5))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    info = init_distributed()
    root = Path(args.root)
    data = root / "chat" / "prepared" / "train"
    if info.rank == 0 and not data.exists():
        tiny_chat([str(root / "chat"), "--sequence-length", "32", "--examples", "128", "--dtype", "uint16"])
    dist.barrier()
    cfg = qlora_config(Path(args.init))
    result = run(cfg, Paths(data, root / "ck", root / "model", Path(args.init)), export=False)
    trainer = result.trainer
    assert trainer is not None
    kinds = {name: type(param.to_local()).__name__ for name, param in trainer.lm.named_parameters()}
    exports = root / "exports"
    for name, export in (("merged", {}), ("adapter", {"format": "adapter"})):
        export_model(replace(trainer, cfg=qlora_config(Path(args.init), **export)), exports / name)
    trainer.model.eval()
    with torch.no_grad():
        trainer.model.unshard()
        logits = trainer.lm(tokens().to(info.device)).float().cpu()
        trainer.model.reshard()
    if info.rank == 0:
        torch.save({"logits": logits, "tokens": tokens()}, root / "logits.pt")
        out = {"losses": {str(k): v for k, v in result.losses.items()}, "kinds": kinds}
        Path(args.out).write_text(json.dumps(out, indent=1))
    shut_down()


if __name__ == "__main__":
    main()
    exit_process(0)
