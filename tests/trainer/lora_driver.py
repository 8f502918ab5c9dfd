"""Runs under ``torchrun`` for ``test_lora.py``: LoRA training of the tiny model from a starting
checkpoint, with a SIGTERM, and (with ``--exports``) what the test checks afterwards.

    torchrun --nproc_per_node 2 tests/trainer/lora_driver.py --root DIR --init INIT --ckpt CKPT --out result.json \
        [--sigterm-after 4] [--exports DIR] [--ac full] [--then '["--root", ...]' ...]

``--then`` (repeatable) runs further runs in the same launch, after the first: each start of torchrun and its
workers costs seconds of imports. A run stopped by a signal ends the launch, so it comes last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tiny import tiny_config  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: E402

from training.components.data import split_batch  # noqa: E402
from training.distributed.dist import exit_process, init_distributed, shut_down  # noqa: E402
from training.paths import Paths  # noqa: E402
from training.tools.tiny_chat import main as tiny_chat  # noqa: E402
from training.trainer import export_model, forward_backward, run  # noqa: E402

STEPS = 8
LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.05}
HF_ID = "tiny-org/tiny-llama"  # the base's Hugging Face id; the test resolves it to a local directory


def lora_config(init: Path, ac: str = "none", precision: str = "fp32", **export):
    return tiny_config(
        model={"init_checkpoint": str(init), "hf_id": HF_ID},
        precision={"activation_checkpointing": ac, "precision": precision},
        batch={"total_steps": STEPS},
        checkpoint={"interval_steps": 4},
        optimizer={"lr": 1e-2, "warmup_steps": 1},
        sft={"adapter": "lora", "lora": LORA},
        export={"format": "merged", "dtype": "bf16", **export},
    )


def tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(5))


def grad_batch() -> torch.Tensor:
    return torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(7))


def _inspect(trainer, info) -> tuple[dict, dict]:
    """Which parameters require and get gradients, and which carry optimiser state, after one more
    backward (both ranks on ``grad_batch()``); and the adapters' whole gradients, by Hugging Face name."""
    model = trainer.model
    forward_backward(trainer, [trainer.cp.shard(*split_batch(grad_batch(), info.device))])
    names = {id(p): n for n, p in model.named_parameters()}
    found = {
        "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad),
        "with_grad": sorted(n for n, p in model.named_parameters() if p.grad is not None),
        "with_state": sorted(names[id(p)] for p in trainer.optimizer.state),
        "all": sorted(n for n, _ in model.named_parameters()),
    }
    grads = {n.removeprefix("lm."): p.grad.full_tensor().cpu() for n, p in model.named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    return found, grads


def _logits(trainer, info) -> torch.Tensor:
    x = tokens().to(info.device)
    trainer.model.eval()  # no LoRA dropout, as a loaded model runs
    with torch.no_grad():
        trainer.model.unshard()
        logits = trainer.lm(x)
        trainer.model.reshard()
    return logits.cpu()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sigterm-after", type=int, default=0)
    parser.add_argument("--exports")
    parser.add_argument("--ac", default="none")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--then", action="append", default=[], metavar="JSON",
                        help="a further run of this launch: its arguments as a JSON list")
    args = parser.parse_args()
    runs = [args, *(parser.parse_args(json.loads(more)) for more in args.then)]
    info = init_distributed()
    for each in runs:
        launch(each, info)
    shut_down()


def launch(args: argparse.Namespace, info) -> None:
    root = Path(args.root)
    data = root / "chat" / "prepared" / "train"
    if info.rank == 0 and not data.exists():  # packed SFT shards of the tiny chat dataset
        tiny_chat([str(root / "chat"), "--sequence-length", "32", "--examples", "128", "--dtype", "uint16"])
    dist.barrier()
    cfg = lora_config(Path(args.init), args.ac, args.precision)
    hooks = []
    if args.sigterm_after:
        def sigterm(stats):
            if stats.step == args.sigterm_after and info.rank == 0:
                os.kill(os.getppid(), signal.SIGTERM)  # torchrun forwards it to every worker
                time.sleep(1.0)
        hooks.append(sigterm)
    result = run(cfg, Paths(data, Path(args.ckpt), root / "model", Path(args.init)), hooks=hooks, export=False)
    out = {"step": result.step, "resumed_from": result.resumed_from, "stopped": result.stopped,
           "losses": {str(k): v for k, v in result.losses.items()}}
    if result.trainer is not None:  # the dtypes the frozen base and the adapters are stored in
        params = list(result.trainer.lm.named_parameters())
        out["dtypes"] = {kind: sorted({str(p.dtype) for n, p in params if (".lora_" in n) == adapter})
                         for kind, adapter in (("base", False), ("adapters", True))}
    if args.exports and not result.stopped:
        trainer = result.trainer
        exports = Path(args.exports)
        for name, export in (("merged-bf16", {}), ("merged-fp32", {"dtype": "fp32"}), ("adapter", {"format": "adapter"})):
            export_model(replace(trainer, cfg=lora_config(Path(args.init), args.ac, args.precision, **export)), exports / name)
        full = get_model_state_dict(trainer.lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        logits = _logits(trainer, info)  # leaves the model in eval mode: no dropout in the gradient below
        out["inspect"], grads = _inspect(trainer, info)
        if info.rank == 0:
            torch.save({"state": full, "logits": logits, "tokens": tokens(), "grads": grads, "grad_batch": grad_batch()},
                       exports / "trained.pt")
    if info.rank == 0:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
    exit_process(0)
