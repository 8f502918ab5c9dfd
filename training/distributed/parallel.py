"""Sharding: the device mesh and FSDP2 ``fully_shard`` on the embedding, every decoder layer,
the final norm with the head, and the root.

- ``full``: a 1-D mesh ``("shard",)`` over all ranks.
- ``hybrid``: a 2-D mesh ``("replicate", "shard")``; each group of
  ``shard_group_size`` ranks shards one copy of the state, copies are replicated.
- ``none``: a 2-D mesh with a shard dimension of 1, i.e. plain data parallelism
  (every rank holds the whole state; gradients are all-reduced).
- ``context_parallel`` > 1: a 3-D mesh ``("replicate", "shard", "cp")`` (replicate 1 for
  ``full``); consecutive ranks form a context-parallel group. FSDP shards over the
  flattened ``("shard", "cp")`` dimension ``shard_cp`` (torchtitan's ``dp_shard_cp``), so
  ``shard_group_size`` counts the context-parallel ranks.

Gradient accumulation: with replicas (hybrid sharding, or ``none``), each micro-batch's
gradients are reduce-scattered inside the shard group, and summed there; the all-reduce
across replicas runs once per optimiser step, in the last micro-batch's backward
(:func:`sync_replicas`, FSDP2's ``set_requires_all_reduce``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from tiered_training.contract.runconfig import ParallelConfig, PrecisionConfig

log = logging.getLogger("training.distributed.parallel")


def build_mesh(parallel: ParallelConfig, world_size: int, device_type: str) -> DeviceMesh:
    if parallel.context_parallel > 1:
        return _build_cp_mesh(parallel, world_size, device_type)
    if parallel.sharding == "full":
        if parallel.shard_group_size != world_size:
            log.warning(
                "sharding full over %d ranks, but the plan assumed a shard group of %d: its memory "
                "estimate does not describe this run",
                world_size,
                parallel.shard_group_size,
            )
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    group = 1 if parallel.sharding == "none" else parallel.shard_group_size
    if world_size % group:
        raise ValueError(f"hybrid sharding: world size {world_size} is not a multiple of shard_group_size {group}")
    return init_device_mesh(device_type, (world_size // group, group), mesh_dim_names=("replicate", "shard"))


def _build_cp_mesh(parallel: ParallelConfig, world_size: int, device_type: str) -> DeviceMesh:
    cp = parallel.context_parallel
    if world_size % cp:
        raise ValueError(f"context_parallel {cp} does not divide the world size {world_size}")
    group = world_size if parallel.sharding == "full" else parallel.shard_group_size
    if parallel.sharding == "full" and parallel.shard_group_size != world_size:
        log.warning(
            "sharding full over %d ranks, but the plan assumed a shard group of %d: its memory "
            "estimate does not describe this run",
            world_size,
            parallel.shard_group_size,
        )
    if world_size % group:
        raise ValueError(f"hybrid sharding: world size {world_size} is not a multiple of shard_group_size {group}")
    mesh = init_device_mesh(
        device_type, (world_size // group, group // cp, cp), mesh_dim_names=("replicate", "shard", "cp")
    )
    mesh["shard", "cp"]._flatten("shard_cp")
    return mesh


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP shards over: ``mesh`` itself, or with context parallelism the flattened
    ``shard_cp`` dimension (with ``replicate`` in front for hybrid sharding)."""
    if "cp" not in (mesh.mesh_dim_names or ()):
        return mesh
    return mesh["shard_cp"] if mesh["replicate"].size() == 1 else mesh["replicate", "shard_cp"]


def shard_group_size(mesh: DeviceMesh) -> int:
    """Ranks that share one copy of the sharded state (context-parallel ranks included)."""
    mesh = fsdp_mesh(mesh)
    names = mesh.mesh_dim_names or ()
    for name in ("shard_cp", "shard"):
        if name in names:
            return mesh[name].size()
    return mesh.size()


def mixed_precision_policy(precision: PrecisionConfig) -> MixedPrecisionPolicy | None:
    """BF16 parameters and FP32 gradient reduction for bf16 and fp8; none (all fp32) for fp32."""
    if precision.precision == "fp32":
        return None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def enable_tf32() -> None:
    """FP32 training runs its matmuls in TF32 on GPUs that have it."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")


# The embedding, and the final norm with the head, as units of their own (torchtitan's layout).
# bench/memory_peak.py turns this off: torch's FSDPMemTracker cannot follow a unit of several
# modules, and the planner's memory model counts the three in the root unit.
SEPARATE_END_UNITS = True


def apply_fsdp(model: nn.Module, layers: nn.ModuleList, mesh: DeviceMesh, precision: PrecisionConfig) -> nn.Module:
    """``fully_shard`` as torchtitan does: the embedding alone, each decoder layer, the final norm
    and the output head together, then the root (which then holds no parameters).

    The last layer, and the norm with the head, are not resharded after forward: backward
    needs them at once. A tied head shares the embedding's weight: the three stay in the root.
    """
    kwargs: dict[str, Any] = {"mesh": fsdp_mesh(mesh)}
    policy = mixed_precision_policy(precision)
    if policy is not None:
        kwargs["mp_policy"] = policy
    lm = getattr(model, "lm", None)
    tied = lm is None or bool(getattr(lm.config, "tie_word_embeddings", False)) or not SEPARATE_END_UNITS
    if not tied and lm is not None:  # (tied when there is no lm)
        fully_shard(lm.model.embed_tokens, **kwargs)
    for index, layer in enumerate(layers):
        fully_shard(layer, reshard_after_forward=index < len(layers) - 1, **kwargs)
    if not tied and lm is not None:
        fully_shard([lm.model.norm, lm.lm_head], reshard_after_forward=False, **kwargs)
    fully_shard(model, **kwargs)
    sum_gradients(model)
    return model


def sum_gradients(model: nn.Module) -> None:
    """FSDP sums gradients over ranks instead of averaging them: the loss is already divided by
    the step's global count of valid labels (``loss.valid_tokens``), as in torchtitan."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives, no pre- or post-scaling


def replicas(mesh: DeviceMesh) -> int:
    """Copies of the sharded state (the ``replicate`` dimension; 1 without one)."""
    names = mesh.mesh_dim_names or ()
    return mesh["replicate"].size() if "replicate" in names else 1


def sync_replicas(model: nn.Module, mesh: DeviceMesh, *, last: bool) -> None:
    """Before a micro-batch's backward: all-reduce gradients across replicas only when it is the
    step's ``last``; the earlier ones keep their reduce-scattered sums for it (FSDP2
    ``set_requires_all_reduce``). Nothing to do without replicas."""
    if replicas(mesh) > 1 and isinstance(model, FSDPModule):
        model.set_requires_all_reduce(last)
