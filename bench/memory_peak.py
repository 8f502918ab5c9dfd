"""The planner's memory model against the peak of a real training step, on the CPU.

Runs the trainer (``training.trainer.run``: its model build, FSDP2 over 2 ranks with gloo,
BF16 mixed precision, the chunked loss, AdamW) for two optimiser steps per activation
checkpointing mode, and takes the peak of the second step (forward, backward and
optimiser, with every micro-batch of the accumulation) from PyTorch's
``FSDPMemTracker``. The tracker is a ``TorchDispatchMode`` that follows every tensor
storage an op creates or FSDP resizes until it is freed, on whichever thread, and sorts
it into sharded and unsharded parameters and gradients, all-gather and reduce-scatter
buffers, activations, temporaries and optimiser states. Its peak stands in for
``torch.cuda.max_memory_allocated``; kernel-internal workspaces that never reach the
dispatcher are not in it.

The planner's side is ``tiered_training.planning.memory.estimate(...).allocated``: its total less
the terms a CPU step cannot show (the fixed CUDA/NCCL reserve and the allocator's
fragmentation reserve; see ``tiered_training/planning/memory.py``).

    .venv/bin/python bench/memory_peak.py                      # table + bench/results/memory_peak.json
    .venv/bin/python bench/memory_peak.py --modes full --accum 1 --out /tmp/peak.json
    .venv/bin/python bench/memory_peak.py --model '{"vocab_size": 8192, "ffn_size": 512}' --seq 256
    .venv/bin/python bench/memory_peak.py --lora 16 --lora-dropout 0.05   # LoRA adapters on a frozen base (training/models/lora.py)

With ``--lora``, the RunConfig trains LoRA adapters (``sft.adapter: lora``) on every
projection; a trainer that does not apply them itself (no ``training/models/lora.py``) gets them
here, the way peft injects them (``peft.inject_adapter_in_model``, the base frozen), before
sharding. The planner's side is ``estimate(..., lora=...)``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MIB = 2**20
# A Llama-shaped model small enough for two CPU ranks, with LLM-like proportions:
# activations dominate, GQA, SwiGLU at ~2.7x, a vocabulary larger than the width.
MODEL = {"name": "peak-llama", "layers": 4, "hidden_size": 256, "attention_heads": 4, "kv_heads": 2,
         "ffn_size": 688, "vocab_size": 2048, "max_sequence_length": 1024, "rope_theta": 10000.0}


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def run_config(mode: str, *, precision: str, world: int, seq: int, micro_batch: int, accum: int, chunk: int,
               model: dict | None = None, lora: int = 0, lora_dropout: float = 0.0):
    from tiered_training.contract.runconfig import RunConfig

    model = {**MODEL, **(model or {})}
    tuning = {}
    if lora:
        # No checkpoint at this URI reaches the bench: the model starts from a random initialisation.
        model["init_checkpoint"] = "s3://memory-peak/none/"
        tuning["sft"] = {"adapter": "lora", "lora": {"rank": lora, "alpha": 2.0 * lora, "dropout": lora_dropout,
                                                     "target_modules": LORA_TARGETS}}
    return RunConfig.model_validate({**tuning,
        "recipe_name": f"memory-peak-{mode}",
        "model": model,
        "parallel": {"sharding": "full", "shard_group_size": world},
        "precision": {"precision": precision, "activation_checkpointing": mode, "loss_chunk_tokens": chunk},
        "batch": {"sequence_length": seq, "micro_batch_size": micro_batch, "grad_accum_steps": accum,
                  "global_batch_tokens": seq * micro_batch * accum * world, "total_steps": 10},
        "optimizer": {"lr": 1e-3, "min_lr_ratio": 0.1, "warmup_steps": 2, "schedule": "cosine", "weight_decay": 0.1,
                      "grad_clip": 1.0, "beta1": 0.9, "beta2": 0.95},
        "data": {"token_dtype": "uint16", "seed": 0},
        "checkpoint": {"interval_minutes": 0, "interval_steps": 0, "keep_last": 1, "shutdown_deadline_seconds": 60},
        "hardware": {"instance_type": "cpu", "gpus_per_node": world, "peak_bf16_flops": 1e12, "hbm_bytes": 2**34},
        "probe": {"steps": 2},
    })


def planned(cfg, world: int) -> dict:
    from tiered_training.contract.architecture import Architecture, Lora
    from tiered_training.planning.memory import element_size, estimate

    lora = None
    if cfg.sft is not None and cfg.sft.lora is not None:
        lora = Lora(cfg.sft.lora.rank, tuple(cfg.sft.lora.target_modules), cfg.sft.lora.dropout > 0)
    arch = Architecture.model_validate(cfg.model.model_dump(include=set(Architecture.model_fields)))
    est = estimate(arch, precision=cfg.precision.precision, checkpointing=cfg.precision.activation_checkpointing,
                   sequence_length=cfg.batch.sequence_length, micro_batch=cfg.batch.micro_batch_size, shard_group=world,
                   hbm_bytes=cfg.hardware.hbm_bytes, loss_chunk_tokens=cfg.precision.loss_chunk_tokens,
                   grad_accum_steps=cfg.batch.grad_accum_steps, lora=lora, compiled=cfg.precision.compile,
                   dropout_mask_bytes=element_size(cfg.precision.precision))  # the CPU's dropout keeps its noise
    terms = ("parameters", "gradients", "optimizer_states", "unsharded_in_flight", "activations", "adapter_dropout",
             "logits_and_loss")
    return {"allocated": est.allocated, "peak_at": est.peak_at, **{k: getattr(est, k) for k in terms}}


def step_tracker(model, optimizer):
    """``FSDPMemTracker`` over every micro-batch of a step: its per-module statistics restart
    at each forward of the root (the peak it reports spans them all).

    A view of a storage that no op created is not counted: on gloo, ``reduce_scatter``
    copies its input outside the dispatcher and splits the copy in ``wait()``. NCCL makes no
    such copy, so counting it would charge the GPU model for a CPU-only buffer.
    """
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.tensor import DTensor

    class StepTracker(FSDPMemTracker):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.is_view and not any(t == DTensor for t in types):
                source = args[0] if args and isinstance(args[0], torch.Tensor) else None
                if source is not None and type(source) is torch.Tensor and source.untyped_storage() not in self._WINFO:
                    return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _fsdp_state_pre_forward(self, fsdp_mod, orig_fsdp_state_pre_fw):
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig_fsdp_state_pre_fw)

            def pre_forward(*args, **kwargs):
                if fsdp_mod is self._root_mod and fsdp_mod in self.memory_tracking:
                    self.reset_mod_stats()
                return inner(*args, **kwargs)

            return pre_forward

    return StepTracker(model, optimizer)


def measure(cfg, root: Path) -> dict:
    """Peak bytes of the second optimiser step on this rank, by the tracker's categories."""
    import gc

    import training.trainer as trainer_module
    from training.paths import Paths

    built = []
    build, build_model = trainer_module.build, trainer_module.build_model
    lora = cfg.sft.lora if cfg.sft is not None and cfg.sft.adapter == "lora" else None
    if lora is not None and not hasattr(trainer_module, "apply_lora"):  # a trainer without LoRA: add it here
        def build_model_with_lora(*args, **kwargs):
            import peft

            lm = build_model(*args, **kwargs)
            peft.inject_adapter_in_model(peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                         target_modules=list(lora.target_modules), bias="none"), lm)
            for name, param in lm.named_parameters():
                param.requires_grad_(".lora_A." in name or ".lora_B." in name)
            return lm

        trainer_module.build_model = build_model_with_lora

    def capture(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    tracker = {}

    def hook(stats):
        if stats.step == 1:  # optimiser states exist from here on: step 2 is a steady-state step
            trainer = built[-1]
            gc.collect()
            tracker["mode"] = step_tracker(trainer.model, trainer.optimizer)
            tracker["mode"].__enter__()
        elif stats.step == 2:
            tracker["mode"].__exit__(None, None, None)

    trainer_module.build = capture
    try:
        trainer_module.run(cfg, Paths(root / "data", root / "ckpt", root / "model"), hooks=[hook], max_steps=2,
                           resume=False, save_checkpoints=False, export=False)
    finally:
        trainer_module.build, trainer_module.build_model = build, build_model
    peak = next(iter(tracker["mode"].get_tracker_snapshot("peak").values()))
    return {"total": peak["Total"],
            "by_kind": {str(getattr(k, "value", k)): v for k, v in peak.items() if v and k != "Total"}}


def write_packed_manifest(data: Path, sequences: int, seq: int) -> None:
    """Make the token shard a packed SFT shard too (one example per sequence: no document mask),
    for a trainer that reads SFT runs' data as packed sequences (training/components/packing.py)."""
    import hashlib

    import numpy as np

    np.ones(sequences * (seq + 1), dtype=np.uint8).tofile(data / "shard-00000.mask.bin")
    np.tile(np.arange(seq + 1, dtype=np.uint16), sequences).tofile(data / "shard-00000.pos.bin")
    manifest = {"kind": "sft-packed", "sequence_length": seq, "token_dtype": "uint16", "fingerprint": "0" * 64,
                "loss_on": "all", "overlong": "drop", "examples": sequences, "dropped": 0, "truncated": 0,
                "tokenizer": "none", "shards": [{"file": "shard-00000.bin", "sequences": sequences, "max_token": 255,
                                                  "sha256": {name: hashlib.sha256((data / name).read_bytes()).hexdigest()
                                                             for name in ("shard-00000.bin", "shard-00000.mask.bin",
                                                                          "shard-00000.pos.bin")}}]}
    (data / "shards.json").write_text(json.dumps(manifest))


def worker(args) -> None:
    import numpy as np
    import torch.distributed as dist

    import training.distributed.parallel
    from training.distributed.dist import init_distributed

    training.distributed.parallel.SEPARATE_END_UNITS = False  # the tracker needs one module per unit; see training/distributed/parallel.py
    info = init_distributed()
    root = Path(args.root)
    if info.rank == 0:
        (root / "data").mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        sequences = 200_000 // (args.seq + 1)
        rng.integers(0, 256, sequences * (args.seq + 1), dtype=np.uint16).tofile(root / "data" / "shard-00000.bin")
        if args.lora and importlib.util.find_spec("training.components.packing") is not None:
            write_packed_manifest(root / "data", sequences, args.seq)
    dist.barrier()
    rows = []
    for mode in args.modes.split(","):
        cfg = run_config(mode, precision=args.precision, world=info.world_size, seq=args.seq,
                         micro_batch=args.micro_batch, accum=args.accum, chunk=args.chunk, model=json.loads(args.model),
                         lora=args.lora, lora_dropout=args.lora_dropout)
        measured = measure(cfg, root)
        plan = planned(cfg, info.world_size)
        rows.append({"mode": mode, "precision": args.precision, "sequence_length": args.seq,
                     "micro_batch": args.micro_batch, "grad_accum_steps": args.accum, "loss_chunk_tokens": args.chunk,
                     "world_size": info.world_size, "measured_bytes": measured["total"],
                     "measured_by_kind": measured["by_kind"], "planned_bytes": plan["allocated"], "planned": plan,
                     "error": plan["allocated"] / measured["total"] - 1})
    if info.rank == 0:
        Path(args.out).write_text(json.dumps({"model": {**MODEL, **json.loads(args.model)}, "rows": rows}, indent=1))
    dist.barrier()
    dist.destroy_process_group()


def table(result: dict) -> str:
    head = f"{'mode':<10} {'accum':>5} {'measured MiB':>13} {'planned MiB':>12} {'error':>7}  planner's peak"
    lines = [head, "-" * len(head)]
    for row in result["rows"]:
        lines.append(f"{row['mode']:<10} {row['grad_accum_steps']:>5} {row['measured_bytes'] / MIB:>13.2f} "
                     f"{row['planned_bytes'] / MIB:>12.2f} {100 * row['error']:>+6.1f}%  {row['planned']['peak_at']}")
    return "\n".join(lines)


def launch(out: Path, *, modes: str = "none,selective,full", precision: str = "bf16", seq: int = 512,
           micro_batch: int = 2, accum: int = 2, chunk: int = 256, nproc: int = 2, model: dict | None = None,
           timeout: float = 300, lora: int = 0, lora_dropout: float = 0.0) -> dict:
    """Run the measurement under torchrun (gloo, ``nproc`` ranks) and return its JSON."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="memory-peak-") as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(Path(__file__).resolve()), "--worker", "--root", tmp, "--out", str(out), "--modes", modes,
               "--precision", precision, "--seq", str(seq), "--micro-batch", str(micro_batch), "--accum", str(accum),
               "--chunk", str(chunk), "--model", json.dumps(model or {}), "--lora", str(lora),
               "--lora-dropout", str(lora_dropout)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"memory_peak failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory_peak.json"))
    parser.add_argument("--modes", default="none,selective,full")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--model", default="{}", help="JSON overrides of the model's dimensions, e.g. '{\"vocab_size\": 8192}'")
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank on every projection; 0: no adapters")
    parser.add_argument("--lora-dropout", type=float, default=0.0)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = launch(out, modes=args.modes, precision=args.precision, seq=args.seq, micro_batch=args.micro_batch,
                    accum=args.accum, chunk=args.chunk, nproc=args.nproc, model=json.loads(args.model),
                    lora=args.lora, lora_dropout=args.lora_dropout)
    print(table(result))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
