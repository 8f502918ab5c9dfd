"""Runs under ``torchrun`` for ``test_init_checkpoint.py``: builds the sharded trainer model from a
Hugging Face checkpoint and saves, on rank 0, its logits for fixed tokens and its gathered weights.

    torchrun --nproc_per_node 2 tests/trainer/init_driver.py --init DIR --out result.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from tiny import tiny_config  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: E402

from training.distributed.dist import exit_process, init_distributed, shut_down  # noqa: E402
from training.paths import Paths  # noqa: E402
from training.trainer import build  # noqa: E402

QWEN = {"name": "tiny-qwen", "qkv_bias": True, "rope_theta": 1000000.0, "norm_eps": 1e-6}


def tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--init", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    info = init_distributed()
    cfg = tiny_config(model=QWEN)
    root = Path(args.out).parent
    trainer = build(cfg, Paths(root, root / "ckpt", root / "model", Path(args.init)), info=info)
    x = tokens().to(info.device)
    with torch.no_grad():
        trainer.model(x, x)  # the root's first forward (FSDP's lazy init)
        trainer.model.unshard()  # the root's embedding, norm and head; the layers gather themselves
        logits = trainer.lm(x)
        trainer.model.reshard()
    full = get_model_state_dict(trainer.lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if info.rank == 0:
        torch.save({"logits": logits.cpu(), "state": full, "model_type": trainer.lm.config.model_type}, args.out)
    shut_down()


if __name__ == "__main__":
    main()
    exit_process(0)
