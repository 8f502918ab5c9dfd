"""Context-parallel check on a GPU machine: PyTorch's ring attention on the CUDA SDPA
kernels, then the trainer with context parallelism 2 against 1 on the same data.

    torchrun --standalone --nproc_per_node 2 -m training.tools.context_parallel_check --out cp.json

1. Attention: causal SDPA over the whole sequence against ring attention over its
   head-tail parts (``training.distributed.context_parallel.ring_attention_forward``: bf16 with GQA,
   the path training takes; bf16 without GQA; fp32), forward and q/k/v gradients, both
   measured against an fp32 reference. Passes when the ring's error is at most twice
   that of one SDPA call in the same dtype (plus 1e-4).
2. Trainer: a small Llama (4 layers, 1024 wide, GQA) in bf16 with selective
   checkpointing, ``context_parallel`` 2 (micro-batch 2 per group) against 1 (micro-batch
   1 per rank): the same sequences and weights, so the losses agree to bf16 noise
   (0.05); then the CP run again with ``torch.compile`` (same bound).

With fewer GPUs than ranks (one lent GPU) the ranks share GPU 0 and talk over gloo
(NCCL refuses two ranks on one GPU); it also runs on the CPU (gloo) as a dry run.
Every part records its error and the check carries on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from training.distributed.dist import exit_process, shut_down


def init() -> DistInfo:  # noqa: F821
    from training.distributed.dist import init_distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() < world and not dist.is_initialized():
        os.environ["LOCAL_RANK"] = str(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("cuda:gloo,cpu:gloo")
    return init_distributed()


def attention_case(cp, device: torch.device, dtype: torch.dtype, kv_heads: int, seq: int) -> dict:
    from torch.distributed.tensor.experimental._attention import _context_parallel_shard, _HeadTailLoadBalancer

    from training.distributed.context_parallel import enable_ring_attention, ring_attention_forward

    generator = torch.Generator(device).manual_seed(0)  # the same tensors on every rank
    heads, dim = 16, 128
    q = torch.randn(1, heads, seq, dim, device=device, generator=generator)
    k, v = (torch.randn(1, kv_heads, seq, dim, device=device, generator=generator) for _ in range(2))
    grad = torch.randn(1, seq, heads, dim, device=device, generator=generator)

    def full(dt):
        leaves = [t.to(dt).clone().requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=kv_heads != heads).transpose(1, 2)
        out.backward(grad.to(dt))
        return [out.detach().float(), *(t.grad.float() for t in leaves)]

    reference, same_dtype = full(torch.float32), full(dtype)
    balancer = _HeadTailLoadBalancer(seq, cp.size, device)
    parts = _context_parallel_shard(
        cp.mesh, [q.to(dtype), k.to(dtype), v.to(dtype), grad.to(dtype)], [2, 2, 2, 1], load_balancer=balancer
    )
    leaves = [t.clone().requires_grad_() for t in parts[:3]]
    enable_ring_attention(cp.mesh)
    started = time.perf_counter()
    out, _ = ring_attention_forward(None, *leaves, None, mesh=cp.mesh)
    out.backward(parts[3])
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    ring = [out.detach().float(), *(t.grad.float() for t in leaves)]
    row = {
        "dtype": str(dtype).removeprefix("torch."),
        "kv_heads": kv_heads,
        "heads": heads,
        "seq": seq,
        "ring_s": round(seconds, 3),
    }
    ok = True
    for name, got, one_call, ref in zip(("out", "dq", "dk", "dv"), ring, same_dtype, reference):
        expected = _context_parallel_shard(
            cp.mesh, [ref, one_call], [1 if name == "out" else 2] * 2, load_balancer=balancer
        )
        ring_err = (got - expected[0]).abs().max().item()
        sdpa_err = (expected[1] - expected[0]).abs().max().item()
        row[f"{name}_ring_err"], row[f"{name}_sdpa_err"] = ring_err, sdpa_err
        ok &= ring_err <= 2 * sdpa_err + 1e-4
    row["status"] = "ok" if ok else "mismatch"
    return row


def trainer_cases(info, root: Path, seq: int, steps: int) -> list[dict]:
    import numpy as np

    from tiered_training.contract.runconfig import RunConfig
    from training.paths import Paths
    from training.trainer import run

    data = root / "data"
    if info.rank == 0:
        data.mkdir(parents=True, exist_ok=True)
        np.random.default_rng(0).integers(0, 32000, 8 * steps * (seq + 1), dtype=np.uint32).tofile(data / "tokens.bin")
    dist.barrier()

    def config(cp: int, micro_batch: int, compiled: bool) -> RunConfig:
        world = info.world_size
        return RunConfig.model_validate(
            {
                "recipe_name": "cp-check",
                "model": {
                    "name": "cp-check",
                    "layers": 4,
                    "hidden_size": 1024,
                    "attention_heads": 16,
                    "kv_heads": 4,
                    "ffn_size": 4096,
                    "vocab_size": 32000,
                    "max_sequence_length": seq,
                    "rope_theta": 500000.0,
                },
                "parallel": {"sharding": "full", "shard_group_size": world, "context_parallel": cp},
                "precision": {"precision": "bf16", "activation_checkpointing": "selective", "compile": compiled},
                "batch": {
                    "sequence_length": seq,
                    "micro_batch_size": micro_batch,
                    "grad_accum_steps": 1,
                    "global_batch_tokens": micro_batch * seq * world // cp,
                    "total_steps": steps,
                },
                "optimizer": {
                    "lr": 3e-4,
                    "min_lr_ratio": 0.1,
                    "warmup_steps": 2,
                    "schedule": "cosine",
                    "weight_decay": 0.1,
                    "grad_clip": 1.0,
                    "beta1": 0.9,
                    "beta2": 0.95,
                },
                "data": {"token_dtype": "uint32", "seed": 0},
                "checkpoint": {"interval_minutes": 0, "keep_last": 1, "shutdown_deadline_seconds": 60},
                "hardware": {
                    "instance_type": "check",
                    "gpus_per_node": world,
                    "peak_bf16_flops": 1e15,
                    "hbm_bytes": 2**37,
                },
                "probe": {"steps": steps},
            }
        )

    rows, losses = [], {}
    for name, cp, micro_batch, compiled, against in (
        ("cp1", 1, 1, False, None),
        ("cp2", 2, 2, False, "cp1"),
        ("cp2-compile", 2, 2, True, "cp2"),
    ):
        row = {"run": name, "context_parallel": cp, "micro_batch": micro_batch, "compile": compiled, "seq": seq}
        try:
            stats = []
            if info.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            result = run(
                config(cp, micro_batch, compiled),
                Paths(data, root / f"ckpt-{name}", root / f"model-{name}"),
                hooks=[stats.append],
                resume=False,
                save_checkpoints=False,
                export=False,
            )
            losses[name] = [result.losses[s] for s in sorted(result.losses)]
            timed = stats[2:] or stats  # leave out warm-up (and compile) steps
            row.update(
                status="ok",
                losses=[round(x, 4) for x in losses[name]],
                tokens_per_second=round(sum(s.tokens for s in timed) / sum(s.step_time_s for s in timed), 1),
                peak_gib=round(max(s.peak_memory_bytes or 0 for s in stats) / 2**30, 2),
            )
            if against in losses:
                diff = max(abs(a - b) for a, b in zip(losses[name], losses[against]))
                row.update(against=against, max_loss_diff=round(diff, 5), status="ok" if diff <= 0.05 else "mismatch")
        except Exception as error:  # noqa: BLE001 - record and carry on
            row.update(status="error", error=f"{type(error).__name__}: {error}"[:500])
            traceback.print_exc()
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.tools.context_parallel_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "context_parallel_check.json")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: 8192 on GPUs, 256 on the CPU)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-trainer", action="store_true", help="only the attention check")
    args = parser.parse_args(argv)

    from tiered_training.contract.runconfig import ParallelConfig
    from training.distributed.context_parallel import ContextParallel
    from training.distributed.parallel import build_mesh

    info = init()
    seq = args.seq or (8192 if info.device.type == "cuda" else 256)
    cp = ContextParallel.from_mesh(
        build_mesh(
            ParallelConfig(sharding="full", shard_group_size=info.world_size, context_parallel=info.world_size),
            info.world_size,
            info.device.type,
        ),
        info.rank,
        info.world_size,
    )
    env = {
        "torch": torch.__version__,
        "world_size": info.world_size,
        "device": str(info.device),
        "backend": str(dist.get_backend()),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    attention = []
    for dtype, kv_heads in ((torch.bfloat16, 4), (torch.bfloat16, 16), (torch.float32, 4)):
        try:
            attention.append(attention_case(cp, info.device, dtype, kv_heads, seq))
        except Exception as error:  # noqa: BLE001 - record and carry on
            attention.append(
                {
                    "dtype": str(dtype),
                    "kv_heads": kv_heads,
                    "status": "error",
                    "error": f"{type(error).__name__}: {error}"[:500],
                }
            )
            traceback.print_exc()
    trainer = []
    if not args.no_trainer:
        root = [tempfile.mkdtemp(prefix="cp-check-") if info.rank == 0 else None]
        dist.broadcast_object_list(root, src=0)  # one data directory for all ranks (one machine)
        trainer = trainer_cases(info, Path(root[0]), seq, args.steps)
        dist.barrier()
        if info.rank == 0:
            shutil.rmtree(root[0], ignore_errors=True)
    result = {
        "environment": env,
        "attention": attention,
        "trainer": trainer,
        "passed": all(r.get("status") == "ok" for r in attention + trainer),
    }
    if info.rank == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        for row in attention + trainer:
            print("context_parallel_check:", json.dumps(row), flush=True)
        print(f"context_parallel_check: {'passed' if result['passed'] else 'FAILED'}; wrote {args.out}", flush=True)
    shut_down()
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    exit_process(main())
