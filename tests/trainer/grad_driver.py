"""Runs under ``torchrun`` for ``test_grad_sync.py``: 2 simulated hosts x 2 ranks, hybrid sharding
(a shard group per host, replicas across hosts); writes JSON results for pytest.

    torchrun --nnodes 2 --node_rank K --nproc_per_node 2 ... grad_driver.py hybrid --root HOST_DIR --out result.json

Every ``dist.all_reduce`` on this rank's replicate group (the ranks holding the same shard on
the other host) is counted. Two trainer runs: the trainer as it is (one all-reduce across
replicas per optimiser step) and with ``sync_replicas`` disabled (FSDP's default: one per
micro-batch). Then one step's gradient buffers of both, for the same weights and micro-batches,
with what bounds their difference in fp32 (see the test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tiny import tiny_config, write_learnable_shards  # noqa: E402

from training import trainer as trainer_module  # noqa: E402
from training.components.data import split_batch  # noqa: E402
from training.distributed.dist import exit_process, init_distributed, shut_down  # noqa: E402
from training.paths import Paths  # noqa: E402

ACCUM = 3
ORIGINAL_SYNC = trainer_module.sync_replicas
STEPS = 4


class ReplicaCounter:
    """Wraps ``dist.all_reduce``; records the calls on one group (and, when asked, the sum over
    the group of each call's input magnitudes, and its output)."""

    def __init__(self, ranks: tuple[int, ...]):
        self.ranks, self.calls, self.record = ranks, 0, False
        self.inputs_abs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []
        self._original = dist.all_reduce
        dist.all_reduce = self

    def __call__(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        mine = group is not None and tuple(dist.get_process_group_ranks(group)) == self.ranks
        if mine:
            self.calls += 1
            if self.record:
                magnitude = tensor.detach().abs().double()
                self._original(magnitude, group=group)
                self.inputs_abs.append(magnitude)
        work = self._original(tensor, op=op, group=group, async_op=async_op)
        if mine and self.record:
            self.outputs.append(tensor.detach().double().clone())
        return work


def _config():
    return tiny_config(
        parallel={"sharding": "hybrid", "shard_group_size": 2},
        batch={"micro_batch_size": 2, "grad_accum_steps": ACCUM, "global_batch_tokens": 32 * 2 * ACCUM * 4,
               "total_steps": STEPS},
        optimizer={"lr": 1e-2, "warmup_steps": 2},
    )


def _run(cfg, data: Path, root: Path, counter: ReplicaCounter) -> dict:
    import gc

    per_step, gc_enabled, collections = [], [], []
    before = [counter.calls]

    def hook(stats):
        per_step.append(counter.calls - before[0])
        before[0] = counter.calls
        gc_enabled.append(gc.isenabled())

    def collected(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(collected)
    trainer_module.GC_EVERY_STEPS = 2  # the trainer's own collections, every 2 steps here
    result = trainer_module.run(cfg, Paths(data, root / "ckpt", root / "model"), hooks=[hook], resume=False,
                                save_checkpoints=False, export=False)
    gc.callbacks.remove(collected)
    replicate = tuple(dist.get_process_group_ranks(result.trainer.mesh["replicate"].get_group()))
    return {"losses": [result.losses[s] for s in sorted(result.losses)], "replica_all_reduces": per_step,
            "replicate_ranks": list(replicate),
            "gc": {"enabled_in_steps": gc_enabled, "enabled_after": gc.isenabled(), "collections": collections}}


def _one_step(trainer, counter: ReplicaCounter, micro_batches) -> dict:
    """One step's replica all-reduces: their outputs summed per FSDP unit (what the sharded
    gradient accumulates) and the group's summed input magnitudes per unit."""
    counter.inputs_abs.clear()
    counter.outputs.clear()
    counter.record = True
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer_module.forward_backward(trainer, micro_batches)
    counter.record = False
    calls = len(counter.outputs)
    units = calls // (ACCUM if trainer_module.sync_replicas is not ORIGINAL_SYNC else 1)  # one call per FSDP unit
    sums, magnitudes = [], []
    for unit in range(units):
        sums.append(sum(counter.outputs[i] for i in range(unit, calls, units)))
        magnitudes.append(sum(counter.inputs_abs[i] for i in range(unit, calls, units)))
    return {"calls": calls, "sums": sums, "magnitudes": magnitudes}


def cmd_hybrid(args, info) -> None:
    root = Path(args.root)  # this host's own directory (its own disk)
    data = root / "data"
    if int(os.environ["LOCAL_RANK"]) == 0 and not data.exists():
        write_learnable_shards(data)
    dist.barrier()
    replicate = (info.rank % 2, info.rank % 2 + 2)  # the (replicate, shard) mesh's columns: one rank per host
    counter = ReplicaCounter(replicate)
    cfg = _config()
    out = {"once_per_step": _run(cfg, data, root / "once", counter)}
    original = trainer_module.sync_replicas
    trainer_module.sync_replicas = lambda *a, **k: None  # FSDP's default: all-reduce every micro-batch
    out["every_micro_batch"] = _run(cfg, data, root / "every", counter)
    trainer_module.sync_replicas = original

    # One step's gradients both ways, same weights and micro-batches.
    torch.manual_seed(cfg.data.seed + info.rank)
    built = trainer_module.build(cfg, info=info)
    generator = torch.Generator().manual_seed(100 + info.rank)
    micro_batches = [split_batch(torch.randint(0, 256, (2, 33), generator=generator), info.device) + (None,)
                     for _ in range(ACCUM)]
    once = _one_step(built, counter, micro_batches)
    trainer_module.sync_replicas = lambda *a, **k: None
    every = _one_step(built, counter, micro_batches)
    trainer_module.sync_replicas = original
    terms = 2 * ACCUM  # replicas x micro-batches per gradient element
    u = torch.finfo(torch.float32).eps / 2
    ratios, differs = [], 0
    for a, b, magnitude in zip(once["sums"], every["sums"], every["magnitudes"]):
        bound = 2 * (terms - 1) * u * magnitude  # each order of the sum is within (n-1) u sum|t| of the exact sum
        delta = (a - b).abs()
        differs += int((delta > 0).sum())
        ratios.append(float((delta / bound.clamp(min=1e-300)).max()))
    out["one_step"] = {"calls_once": once["calls"], "calls_every": every["calls"], "max_delta_over_bound": max(ratios),
                       "elements_differing": differs}
    out["masked"] = _masked_step(cfg, info)
    Path(f"{args.out}.rank{info.rank}.json").write_text(json.dumps(out, indent=1))


# Masked labels per (rank, micro-batch), of 2 x 32: unequal counts on ranks and micro-batches.
MASKED = [[0, 48, 10], [60, 0, 33], [5, 64, 0], [20, 40, 63]]


def _masked_step(cfg, info) -> dict:
    """One step with unequal label masks: the trainer's gradient against the full batch's
    (every rank's micro-batches in one forward, mean over the valid labels), on rank 0."""
    import torch.nn.functional as F
    from tiny import hf_model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    torch.manual_seed(cfg.data.seed)
    built = trainer_module.build(cfg, info=info)
    generator = torch.Generator().manual_seed(7)
    every = []  # (inputs, labels) of every rank's micro-batches
    for rank in range(info.world_size):
        for masked in MASKED[rank]:
            inputs, labels = split_batch(torch.randint(0, 256, (2, 33), generator=generator), torch.device("cpu"))
            labels = labels.clone()
            labels.view(-1)[:masked] = -100
            every.append((inputs, labels))
    mine = [(x.to(info.device), y.to(info.device), None) for x, y in every[info.rank * ACCUM:(info.rank + 1) * ACCUM]]
    built.optimizer.zero_grad(set_to_none=True)
    step_loss = trainer_module.forward_backward(built, mine)
    dist.all_reduce(step_loss)
    grads = {name: p.grad.full_tensor() for name, p in built.lm.named_parameters()}
    weights = get_model_state_dict(built.lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if info.rank != 0:
        return {}
    reference = hf_model(cfg.model)  # transformers' Llama: an independent implementation
    reference.load_state_dict(weights)
    inputs = torch.cat([x for x, _ in every])
    labels = torch.cat([y for _, y in every])
    logits = reference(input_ids=inputs).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    full = {name: p.grad.detach().clone() for name, p in reference.named_parameters()}
    # What averaging per-micro-batch, per-rank means would give (the normalisation this replaces)
    reference.zero_grad()
    means = torch.stack([F.cross_entropy(reference(input_ids=x).logits.float().reshape(-1, logits.shape[-1]),
                                         y.reshape(-1), ignore_index=-100) for x, y in every]).mean()
    means.backward()
    averaged = {name: p.grad.detach().clone() for name, p in reference.named_parameters()}

    def relative(a: dict) -> float:
        num = sum(float((a[n].double() - full[n].double()).pow(2).sum()) for n in full)
        den = sum(float(full[n].double().pow(2).sum()) for n in full)
        return (num / den) ** 0.5

    return {"loss": step_loss.item(), "full_batch_loss": float(loss), "relative_error": relative(grads),
            "mean_of_means_relative_error": relative(averaged), "names_match": sorted(grads) == sorted(full)}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    hybrid = sub.add_parser("hybrid")
    hybrid.add_argument("--root", required=True)
    hybrid.add_argument("--out", required=True)
    args = parser.parse_args()
    info = init_distributed()
    {"hybrid": cmd_hybrid}[args.cmd](args, info)
    shut_down()


if __name__ == "__main__":
    main()
    exit_process(0)
