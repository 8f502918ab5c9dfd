"""Context parallelism: each sequence is split over ``context_parallel`` GPUs (ring attention).

PyTorch's context parallelism (``torch.distributed.tensor.experimental``, as torchtitan
uses it) does the work:

- ``shard``: every rank of a context-parallel group reads the same micro-batch; inputs,
  labels and RoPE positions are reordered by ``_HeadTailLoadBalancer`` (the sequence is cut
  into ``2 x cp`` chunks; rank ``r`` keeps chunks ``r`` and ``2 x cp - 1 - r``, so every
  rank does the same share of the causal mask's work) and each rank keeps its part.
- ``apply_context_parallel``: attention runs through an attention function of the decoder
  (``model.ATTENTION_FUNCTIONS``) that marks q, k, v as sequence-sharded DTensors (``Shard(2)`` on
  the CP mesh) and calls SDPA; PyTorch's CP dispatcher turns that into ring attention: K/V blocks travel the
  ring (all-gather by default) and partial results are merged with their log-sum-exp.
  Every other layer (norms, MLP, projections, RoPE) is per token and runs on the local part.
- The loss is summed over local tokens and divided by a count of tokens over the ranks:
  in training the step's global count (``loss.valid_tokens``; FSDP sums gradients), in
  validation the group's count (``loss.chunked_cross_entropy(group=...)``), so it equals
  the loss of the whole sequences.

PyTorch registers ring attention for the CUDA SDPA kernels (flash, memory-efficient,
cuDNN). On the CPU, SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``, which has
no context-parallel handler (``NotImplementedError: Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
registered``). ``_register_cpu_ring_attention`` hands that kernel and its backward to
PyTorch's own ring (``_templated_ring_attention`` and its backward: the same schedule,
load balancing and merge as on GPUs), so CPU runs (tests, local rehearsal) are context
parallel too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental._attention import (
    _context_parallel_shard,
    _enable_context_parallel_dispatcher,
    _HeadTailLoadBalancer,
)

if TYPE_CHECKING:
    from training.models.decoder import CausalLM

ATTENTION = "context_parallel"  # the decoder's attention implementation registered here
SEQ_DIM = 2  # q, k, v are [batch, heads, sequence, head_dim]
_aten = torch.ops.aten


@dataclass(frozen=True)
class ContextParallel:
    """The context-parallel layout of this rank: which data it reads and how it splits sequences.

    With ``mesh`` None (``context_parallel`` 1) every rank is its own data-parallel rank and
    ``shard`` passes batches through unchanged.
    """

    mesh: DeviceMesh | None  # the 1-D "cp" mesh of this rank's group
    data_rank: int  # which data-parallel rank (group of CP ranks) this rank belongs to
    data_ranks: int  # world size / context_parallel: ranks that read distinct sequences

    @classmethod
    def from_mesh(cls, mesh: DeviceMesh, rank: int, world_size: int) -> ContextParallel:
        names = mesh.mesh_dim_names or ()
        if "cp" not in names or mesh["cp"].size() == 1:
            return cls(None, rank, world_size)
        cp = mesh["cp"]
        return cls(cp, rank // cp.size(), world_size // cp.size())  # cp is the innermost mesh dimension

    @property
    def size(self) -> int:
        return 1 if self.mesh is None else self.mesh.size()

    @property
    def group(self) -> dist.ProcessGroup | None:
        return None if self.mesh is None else self.mesh.get_group()

    def shard(
        self, inputs: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """This rank's part of ``[batch, sequence]`` inputs and labels, with their RoPE positions."""
        if self.mesh is None:
            return inputs, labels, None
        positions = torch.arange(inputs.shape[1], device=inputs.device).unsqueeze(0).expand_as(inputs)
        balancer = _HeadTailLoadBalancer(inputs.shape[1], self.size, inputs.device)
        inputs, labels, positions = cast(
            "list[torch.Tensor]",  # tensors in, tensors out (torch's type allows for BlockMasks)
            _context_parallel_shard(self.mesh, [inputs, labels, positions], [1, 1, 1], load_balancer=balancer),
        )
        return inputs, labels, positions


def apply_context_parallel(lm: CausalLM, cp: ContextParallel) -> None:
    """Route the model's attention through ring attention over ``cp.mesh`` (no-op without CP)."""
    if cp.mesh is None:
        return
    enable_ring_attention(cp.mesh)
    lm.config.attn_implementation = ATTENTION


def enable_ring_attention(mesh: DeviceMesh) -> None:
    """PyTorch's CP dispatcher on, and the decoder's ``context_parallel`` attention over ``mesh``.
    Causality is SDPA's is_causal over the whole (reordered) sequence: no mask tensor is built."""
    from training.models.decoder import ATTENTION_FUNCTIONS

    _enable_context_parallel_dispatcher()
    if mesh.device_type == "cpu":
        _register_cpu_ring_attention()
    ATTENTION_FUNCTIONS[ATTENTION] = partial(ring_attention_forward, mesh=mesh)


def _native_gqa(query: torch.Tensor) -> bool:
    """SDPA kernels that take fewer K/V heads than query heads (only K/V heads travel the ring):
    CUDA flash attention (16-bit) and the CPU flash kernel."""
    return query.device.type == "cpu" or query.dtype in (torch.bfloat16, torch.float16)


def ring_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
    *,
    mesh: DeviceMesh,
) -> torch.Tensor:
    """The decoder's attention function: causal SDPA over the sequence split on ``mesh``.

    query/key/value: this rank's ``[batch, heads, local sequence, head_dim]``; returns
    ``[batch, local sequence, heads, head_dim]`` as ``model.sdpa_attention`` does.
    """
    if mask is not None:
        raise ValueError("context parallelism supports causal attention without a mask")
    groups = query.shape[1] // key.shape[1]
    gqa = groups > 1 and _native_gqa(query)
    if groups > 1 and not gqa:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    placement = [Shard(SEQ_DIM)]
    q, k, v = (DTensor.from_local(t, mesh, placement, run_check=False) for t in (query, key, value))
    out = cast(DTensor, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa))
    return out.to_local().transpose(1, 2).contiguous()


# -- the CPU kernel through PyTorch's ring ------------------------------------------------


def _cp_args(args, kwargs) -> tuple[DeviceMesh, list, dict]:
    mesh = next(a.device_mesh for a in (*args, *kwargs.values()) if isinstance(a, DTensor))
    for a in (*args, *kwargs.values()):
        if isinstance(a, DTensor) and tuple(a.placements) != (Shard(SEQ_DIM),):
            raise NotImplementedError(f"context-parallel attention expects Shard({SEQ_DIM}) inputs, got {a.placements}")
    unwrap = lambda a: a.to_local() if isinstance(a, DTensor) else a  # noqa: E731
    return mesh, [unwrap(a) for a in args], {k: unwrap(v) for k, v in kwargs.items()}


def _wrap(mesh: DeviceMesh, tensors) -> tuple:
    return tuple(DTensor.from_local(t, mesh, [Shard(SEQ_DIM)], run_check=False) for t in tensors)


def _ring():
    """PyTorch's ring attention (forward, backward); private, so imported only where needed."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention
    except ImportError:  # older layout
        from torch.distributed.tensor.experimental import _attention  # type: ignore[no-redef]  # the same module
    return _attention._templated_ring_attention, _attention._templated_ring_attention_backward


def _cpu_flash_forward(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None, mesh):
    if attn_mask is not None:
        raise NotImplementedError("context-parallel attention does not take an attention mask")
    return _ring()[0](
        mesh.get_group(),
        SEQ_DIM,
        _aten._scaled_dot_product_flash_attention_for_cpu,
        query=query,
        key=key,
        value=value,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def _cpu_flash_backward(
    grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None, mesh
):
    if attn_mask is not None:
        raise NotImplementedError("context-parallel attention does not take an attention mask")
    return _ring()[1](
        mesh.get_group(),
        SEQ_DIM,
        _aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        grad_out=grad_out,
        grad_out_name="grad_out",
        query=query,
        key=key,
        value=value,
        out=out,
        logsumexp=logsumexp,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def _handler(function):
    def handle(op_call, args, kwargs):
        mesh, args, kwargs = _cp_args(args, kwargs)
        return _wrap(mesh, function(*args, **kwargs, mesh=mesh))

    return handle


def _register_cpu_ring_attention() -> None:
    """Send the CPU flash kernel (forward and backward) on sequence-sharded DTensors to the ring."""
    handlers = DTensor._op_dispatcher._custom_op_handlers
    handlers[_aten._scaled_dot_product_flash_attention_for_cpu.default] = _handler(_cpu_flash_forward)
    handlers[_aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = _handler(_cpu_flash_backward)
