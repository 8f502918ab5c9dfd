"""Runs under ``torchrun`` for the context-parallel tests; writes JSON results for pytest.

    torchrun --nproc_per_node 4 tests/trainer/cp_driver.py --root DIR --out out.json \\
        --runs 1:fp32:none:hybrid:1,2:fp32:none:hybrid:2:resume,...

First the pieces around attention are checked on every rank (ring attention against
plain SDPA, the sequence split and its positions, the loss over the parts); then each run
``cp:precision:checkpointing:sharding:micro_batch[:resume][:compile]`` trains and writes its
losses (hybrid: shard groups of 2 ranks). fp32 runs also export the final weights.

The runs train with SGD with momentum (``--optimizer sgd``, the default here) instead of the
trainer's AdamW: the tests compare the parallel split, and SGD's update is continuous in the
gradient, so a rounding difference in the gradient stays a rounding difference in the weights.
AdamW's m/sqrt(v) turns a rounding difference on a parameter with a near-zero gradient into a
difference of up to lr per step.
``resume`` runs save checkpoints, then the newest is deleted and the run restarts from
the one before it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tiny import tiny_config, write_learnable_shards  # noqa: E402
from torch.distributed.tensor.experimental._attention import _context_parallel_shard, _HeadTailLoadBalancer  # noqa: E402

import training.trainer  # noqa: E402
from training.components.loss import IGNORE_INDEX, chunked_cross_entropy  # noqa: E402
from training.distributed.context_parallel import ContextParallel, enable_ring_attention, ring_attention_forward  # noqa: E402
from training.distributed.dist import exit_process, init_distributed, shut_down  # noqa: E402
from training.distributed.parallel import build_mesh, shard_group_size  # noqa: E402
from training.paths import Paths  # noqa: E402
from training.trainer import run  # noqa: E402

CHECKPOINT_EVERY = 3
SGD_LR = 0.5  # with gradients clipped to norm 1, each step moves the weights by at most 0.5 (L2)
SGD_MOMENTUM = 0.9


def _sgd(model, opt, device):
    """SGD with momentum (a state that checkpoints carry, like AdamW's moments)."""
    return torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM)


def init_check(info) -> dict:
    """The model a 4-rank (shard 2 x cp 2) run starts from equals the one a single rank builds."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from training.models.decoder import build_model, materialize
    from training.trainer import build

    cfg = tiny_config(parallel={"sharding": "full", "shard_group_size": info.world_size, "context_parallel": 2})
    trainer = build(cfg, None, info=info)
    local = trainer.lm.model.embed_tokens.weight.to_local()
    gathered = [None] * info.world_size
    dist.all_gather_object(gathered, local.clone())
    sharded = get_model_state_dict(trainer.lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if info.rank != 0:  # the gathered state dict is on rank 0 only
        return {}
    one = build_model(cfg.model)
    materialize(one, torch.device("cpu"), seed=cfg.data.seed)
    single = one.state_dict()
    return {
        "differs": {k: (sharded[k] - single[k]).abs().max().item() for k in single},
        "embedding_shards_differ": all(not torch.equal(gathered[0], other) for other in gathered[1:]),
    }


def _config(precision: str, ac: str, sharding: str, micro_batch: int, cp: int, world: int, steps: int,
            compile: bool = False):
    extra = {"compile": compile}
    if precision == "fp8":  # tensorwise with FSDP float8 all-gather (emulated on the CPU)
        extra.update(fp8_recipe="tensorwise", fp8_all_gather=True)
    group = world if sharding == "full" else 2
    return tiny_config(
        parallel={"sharding": sharding, "shard_group_size": group, "context_parallel": cp},
        precision={"precision": precision, "activation_checkpointing": ac, **extra},
        batch={"total_steps": steps, "micro_batch_size": micro_batch,
               "global_batch_tokens": micro_batch * 32 * (world // cp)},
        optimizer={"lr": 1e-2, "warmup_steps": 2},
        checkpoint={"interval_steps": CHECKPOINT_EVERY},
        export={"dtype": "fp32"},  # the exports are compared as trained, not rounded to bf16
        # a validation pass after every step, on every 8th window (held out of training)
        validation={"source": "holdout", "holdout_every": 8, "interval_minutes": 1e-6, "batches": 2},
    )


class _Validation:
    """A hook that keeps the validation losses."""

    def __init__(self):
        self.losses: list[float] = []

    def __call__(self, stats) -> None:
        pass

    def record_validation(self, loss: float) -> None:
        self.losses.append(loss)


def checks(info) -> dict:
    """Ring attention, the sequence split and the loss over parts, on a (replicate, shard, cp) mesh."""
    cfg = tiny_config(parallel={"sharding": "hybrid", "shard_group_size": 2, "context_parallel": 2})
    mesh = build_mesh(cfg.parallel, info.world_size, "cpu")
    cp = ContextParallel.from_mesh(mesh, info.rank, info.world_size)
    out = {"rank": info.rank, "data_rank": cp.data_rank, "data_ranks": cp.data_ranks, "cp_rank": cp.mesh.get_local_rank()}

    # The split: every rank of a CP group gets the same sequences; inputs, labels and positions stay aligned.
    seq = 16
    tokens = torch.arange(2 * (seq + 1)).reshape(2, seq + 1) + 1000 * cp.data_rank
    inputs, labels, positions = cp.shard(tokens[:, :-1], tokens[:, 1:])
    out["shard"] = {"inputs": inputs.tolist(), "labels": labels.tolist(), "positions": positions.tolist()}

    # Ring attention (with GQA: 4 query heads, 2 K/V heads) against SDPA over the whole sequence.
    torch.manual_seed(0)  # the same tensors on every rank
    q, k, v = torch.randn(2, 4, 32, 8), torch.randn(2, 2, 32, 8), torch.randn(2, 2, 32, 8)
    grad = torch.randn(2, 32, 4, 8)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=True).transpose(1, 2)
    (ref * grad).sum().backward()
    balancer = _HeadTailLoadBalancer(32, cp.size, torch.device("cpu"))
    parts = _context_parallel_shard(cp.mesh, [q, k, v, grad], [2, 2, 2, 1], load_balancer=balancer)
    local = [t.clone().requires_grad_() for t in parts[:3]]
    enable_ring_attention(cp.mesh)
    ring = ring_attention_forward(None, *local, None, mesh=cp.mesh)
    (ring * parts[3]).sum().backward()
    expected = _context_parallel_shard(cp.mesh, [ref.detach(), *(t.grad for t in full)], [1, 2, 2, 2], load_balancer=balancer)
    got = [ring.detach(), *(t.grad for t in local)]
    out["attention_max_error"] = {name: (a - b).abs().max().item() for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected)}
    out["attention_max_abs"] = {name: b.abs().max().item() for name, b in zip(("out", "dq", "dk", "dv"), expected)}

    # The loss over parts: the mean over the group's ranks equals the whole sequences' mean,
    # also when the ignored labels fall unevenly on the ranks.
    torch.manual_seed(1)
    hidden, weight = torch.randn(2, 32, 16), torch.randn(64, 16)
    labels = torch.randint(0, 64, (2, 32))
    labels[0, :9] = IGNORE_INDEX  # the head of the sequence: mostly on one rank after the split
    whole = chunked_cross_entropy(hidden, weight, labels, 5)
    h_part, y_part = _context_parallel_shard(cp.mesh, [hidden, labels], [1, 1], load_balancer=balancer)
    part = chunked_cross_entropy(h_part, weight, y_part, 5, group=cp.group)
    dist.all_reduce(part, group=cp.group)
    out["loss"] = {"whole": whole.item(), "mean_of_parts": part.item() / cp.size,
                   "ignored_here": int((y_part == IGNORE_INDEX).sum())}
    return out


def cmd_runs(args, info) -> None:
    root = Path(args.root)
    data = root / "data"
    if info.rank == 0 and not data.exists():
        write_learnable_shards(data)
    dist.barrier()
    results = {"checks": [None] * info.world_size}
    dist.all_gather_object(results["checks"], checks(info))
    results["init"] = init_check(info)
    if args.optimizer == "sgd":
        training.trainer.build_optimizer = _sgd
    for spec in args.runs.split(","):
        cp, precision, ac, sharding, micro_batch, *flags = spec.split(":")
        cfg = _config(precision, ac, sharding, int(micro_batch), int(cp), info.world_size, args.steps, "compile" in flags)
        name = spec.replace(":", "-")
        paths = Paths(data, root / f"ckpt-{name}", root / f"model-{name}")
        exporting = precision == "fp32"
        resume = "resume" in flags
        validation = _Validation()
        result = run(cfg, paths, hooks=[validation], resume=False, save_checkpoints=resume, export=exporting)
        trainer = result.trainer
        entry = {
            "losses": [result.losses[s] for s in sorted(result.losses)], "validation_losses": validation.losses,
            "mesh": list(trainer.mesh.mesh_dim_names), "mesh_shape": list(trainer.mesh.shape),
            "shard_group_size": shard_group_size(trainer.mesh), "cp_size": trainer.cp.size,
            "attention": trainer.lm.config.attn_implementation,
            "data_rank": trainer.cp.data_rank, "data_ranks": trainer.cp.data_ranks,
            "model_dir": str(paths.model_dir) if exporting else None,
        }
        if resume:
            dist.barrier()
            if info.rank == 0:
                shutil.rmtree(paths.checkpoint_dir / f"step-{args.steps}")
            dist.barrier()
            again = run(cfg, Paths(data, paths.checkpoint_dir, root / f"model-{name}-resumed"), export=exporting)
            entry["resumed_from"] = again.resumed_from
            entry["resumed_losses"] = [again.losses[s] for s in sorted(again.losses)]
            entry["resumed_model_dir"] = str(root / f"model-{name}-resumed")
        results[spec] = entry
    if info.rank == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    args = parser.parse_args()
    info = init_distributed()
    cmd_runs(args, info)
    shut_down()


if __name__ == "__main__":
    main()
    exit_process(0)
