"""Runs under ``torchrun`` for the multi-process trainer tests; writes JSON results for pytest.

    torchrun --nproc_per_node N tests/trainer/driver.py losses --root DIR --sharding full --combos fp32:none,...
    torchrun --nproc_per_node N tests/trainer/driver.py train --root DIR --out result.json [--sigterm-after 10] ...
    torchrun --nproc_per_node N tests/trainer/driver.py train --sft-data DIR --init DIR ...   # fine-tuning
    torchrun --nproc_per_node N tests/trainer/driver.py --then '["train", "--root", ...]' train --root DIR ...

``--then`` (repeatable) runs further commands in the same launch, after the first: each start of torchrun and
its workers costs seconds of imports. A run stopped by a signal ends the launch, so it comes last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tiny import tiny_config, write_learnable_shards  # noqa: E402

from tiered_training.planning.memory import sharded_state_bytes  # noqa: E402
from training.distributed.dist import exit_process, init_distributed, shut_down  # noqa: E402
from training.paths import Paths  # noqa: E402
from training.trainer import run  # noqa: E402


def _prepare_data(root: Path, rank: int) -> Path:
    data = root / "data"
    if rank == 0 and not data.exists():
        write_learnable_shards(data)
    dist.barrier()
    return data


def _state_bytes(trainer) -> dict:
    """Bytes of fp32 parameters, gradients-to-be and AdamW moments this rank holds."""
    param = sum(p.to_local().numel() * p.element_size() for p in trainer.model.parameters())
    moments = 0
    for state in trainer.optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            t = t.to_local() if hasattr(t, "to_local") else t
            moments += t.numel() * t.element_size()
    return {"param": param, "optimizer": moments}


def cmd_losses(args, info) -> None:
    root = Path(args.root)
    data = _prepare_data(root, info.rank)
    results = {}
    for combo in args.combos.split(","):
        precision, ac, *rest = combo.split(":")
        sharding = rest[0] if rest else args.sharding
        extra = {}
        if precision == "fp8":  # tensorwise with FSDP float8 all-gather (and the scale precompute)
            extra = {"fp8_recipe": "tensorwise", "fp8_all_gather": True}
        elif precision == "fp8row":
            precision, extra = "fp8", {"fp8_recipe": "rowwise"}
        cfg = tiny_config(
            parallel={"sharding": sharding, "shard_group_size": args.shard_group},
            precision={"precision": precision, "activation_checkpointing": ac, **extra},
            batch={"total_steps": args.steps},
            optimizer={"lr": 1e-2, "warmup_steps": 2},
        )
        started = time.perf_counter()
        result = run(cfg, Paths(data, root / f"ckpt-{combo}", root / f"model-{combo}"), resume=False,
                     save_checkpoints=False, export=False)
        entry = {"losses": [result.losses[s] for s in sorted(result.losses)], "seconds": time.perf_counter() - started}
        if precision == "fp32":
            measured = _state_bytes(result.trainer)
            group = {"hybrid": args.shard_group, "full": info.world_size, "none": 1}[sharding]
            planned = sharded_state_bytes(cfg.model, group)
            entry["state_bytes"] = {"measured": measured, "planned": planned}
        results[combo] = entry
    if info.rank == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))


def cmd_train(args, info) -> None:
    root = Path(args.root)
    if args.sft_data:  # full-parameter SFT on prepared packed shards, from an init checkpoint
        data = Path(args.sft_data)
        cfg = tiny_config(batch={"total_steps": args.steps}, model={"init_checkpoint": "s3://example-bucket/tiny/"},
                          sft={"adapter": "none"}, export={"dtype": "fp32"},
                          validation={"source": "holdout", "holdout_every": 4, "batches": 1, "interval_minutes": 1e-6})
    else:
        data = _prepare_data(root, info.rank)
        cfg = tiny_config(batch={"total_steps": args.steps})
    seen = []
    hooks = [lambda stats: seen.append(stats.as_dict())]
    if args.sigterm_after:
        def sigterm(stats):
            if stats.step == args.sigterm_after and info.rank == 0:
                stop = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)  # the trainer's handler
                os.kill(os.getppid(), signal.SIGTERM)  # torchrun forwards it to every worker
                # Wait until it reached this rank, however busy the machine: the ranks agree on the stop
                # at the next step boundary, so the run stops within a step of this one.
                deadline = time.monotonic() + 60
                while stop is not None and stop.received_at is None and time.monotonic() < deadline:
                    time.sleep(0.01)
        hooks.append(sigterm)
    if args.sigkill_after:
        def sigkill(stats):
            if stats.step >= args.sigkill_after and info.rank == args.sigkill_rank:
                committed = (Path(args.ckpt or root / "ckpt") / f"step-{args.sigkill_after}" / "COMMITTED").exists()
                if committed or stats.step >= args.sigkill_after + 3:
                    os.kill(os.getpid(), signal.SIGKILL)
        hooks.append(sigkill)
    paths = Paths(data, Path(args.ckpt or root / "ckpt"), Path(args.model or root / "model"),
                  Path(args.init) if args.init else None)
    result = run(cfg, paths, hooks=hooks)
    out = {"step": result.step, "resumed_from": result.resumed_from, "stopped": result.stopped,
           "losses": {str(k): v for k, v in result.losses.items()}, "checkpoint_step": result.checkpoint_step}
    if args.dump_full:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(result.trainer.lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if info.rank == 0:
            torch.save(full, args.dump_full)
    if args.loss_sums:  # the trained model's loss sum and valid labels on each validation batch, every rank
        from training.components.data import sft_validation_batches

        one = torch.ones((), dtype=torch.int64)
        batches = sft_validation_batches(data, "uint16", cfg.batch.sequence_length, cfg.batch.micro_batch_size,
                                         rank=info.rank, world_size=info.world_size, count=4, holdout_every=4)
        with torch.no_grad():
            sums = [float(result.trainer.model(b["input_ids"], b["labels"], b["position_ids"], divisor=one))
                    for b in batches]
        torch.save({"batches": batches, "sums": sums}, f"{args.loss_sums}.rank{info.rank}")
    if info.rank == 0:
        Path(args.out).write_text(json.dumps(out, indent=1))
    Path(f"{args.out}.rank{info.rank}.stats.json").write_text(json.dumps(seen))
    Path(f"{args.out}.rank{info.rank}.exit").write_text("0")  # the trainer returned normally on this rank


def cmd_init(args, info) -> None:
    """Build the sharded model from a Hugging Face checkpoint and dump its gathered weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from training.trainer import build

    cfg = tiny_config(parallel={"sharding": args.sharding, "shard_group_size": 2},
                      precision={"activation_checkpointing": "full"})
    paths = Paths(Path(args.root), Path(args.root) / "unused-ckpt", Path(args.root) / "unused-model", Path(args.init))
    trainer = build(cfg, paths, info=info)
    full = get_model_state_dict(trainer.lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    rope = trainer.lm.model.rotary_emb.inv_freq.cpu()
    if info.rank == 0:
        torch.save({"state": full, "inv_freq": rope}, args.out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--then", action="append", default=[], metavar="JSON",
                        help="a further command of this launch: its arguments as a JSON list")
    sub = parser.add_subparsers(dest="cmd", required=True)
    losses = sub.add_parser("losses")
    losses.add_argument("--root", required=True)
    losses.add_argument("--out", required=True)
    losses.add_argument("--sharding", default="full")
    losses.add_argument("--shard-group", type=int, default=2)
    losses.add_argument("--combos", required=True)
    losses.add_argument("--steps", type=int, default=12)
    train = sub.add_parser("train")
    train.add_argument("--root", required=True)
    train.add_argument("--out", required=True)
    train.add_argument("--ckpt")
    train.add_argument("--model")
    train.add_argument("--steps", type=int, default=20)
    train.add_argument("--sigterm-after", type=int, default=0)
    train.add_argument("--sigkill-after", type=int, default=0)
    train.add_argument("--sigkill-rank", type=int, default=1)
    train.add_argument("--dump-full")
    train.add_argument("--sft-data", help="packed SFT shards (training.sft_data's OUT/train): fine-tune")
    train.add_argument("--init", help="the init checkpoint (Hugging Face directory) for --sft-data")
    train.add_argument("--loss-sums", help="with --sft-data: save the trained model's loss sums on validation batches")
    init = sub.add_parser("init")
    init.add_argument("--root", required=True)
    init.add_argument("--out", required=True)
    init.add_argument("--init", required=True)
    init.add_argument("--sharding", default="hybrid")
    args = parser.parse_args()
    commands = [args, *(parser.parse_args(json.loads(more)) for more in args.then)]
    info = init_distributed()
    for command in commands:
        {"losses": cmd_losses, "train": cmd_train, "init": cmd_init}[command.cmd](command, info)
    shut_down()


if __name__ == "__main__":
    main()
    exit_process(0)
