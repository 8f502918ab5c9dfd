"""GPU memory per rank: the planner's model of what the trainer in ``training/`` allocates.

Every term is in bytes for the busiest rank (rank 0). The activation formulas were
measured to the byte on transformers' LlamaForCausalLM with
``torch.autograd.graph.saved_tensors_hooks``; ``tests/training/test_planner_vs_trainer.py``
keeps them honest.
"""

from __future__ import annotations

from dataclasses import dataclass

from .architecture import Architecture, sharded_elements

GIB = 1024**3
# CUDA context, NCCL buffers and cuBLAS workspaces: a fixed reserve per GPU.
FIXED_OVERHEAD_BYTES = 4 * GIB
# The caching allocator rounds and fragments: a reserve on the transient terms.
FRAGMENTATION = 0.10
# Bytes per element of optimiser-owned state: fp32 master parameter, fp32 gradient,
# AdamW's two fp32 moments.
STATE_BYTES = {"param": 4, "grad": 4, "optimizer": 8}


def element_size(precision: str) -> int:
    """Bytes per activation element: BF16 compute for bf16 and fp8 (torchao keeps the
    high-precision input for backward), fp32 otherwise."""
    return 4 if precision == "fp32" else 2


def activation_bytes_per_token(arch: Architecture, precision: str, checkpointing: str) -> int:
    """Bytes one decoder layer keeps for backward, per token of the micro-batch.

    - ``none``: every tensor autograd saves. Per RMSNorm, an fp32 copy of its input
      (4h), the rsqrt (4) and two h-wide tensors in the compute dtype; Q, K, V after
      RoPE, the attention output and its fp32 log-sum-exp (4 per head); SwiGLU's gate,
      up, SiLU and product (4f).
    - ``selective``: the block input plus the outputs of every matmul and of
      attention, which the selective policy saves; the rest is recomputed.
    - ``full``: only the block input.
    """
    e = element_size(precision)
    h, kv, f, heads = arch.hidden_size, arch.kv_size, arch.ffn_size, arch.attention_heads
    if checkpointing == "none":
        norms = 2 * (4 * h + 4 + 2 * e * h)
        attention = e * (2 * h + 2 * kv) + 4 * heads
        mlp = 4 * e * f
        return norms + attention + mlp
    if checkpointing == "selective":
        block_input = e * h
        matmuls = e * (h + 2 * kv) + e * h + e * (2 * f) + e * h  # qkv, o, gate+up, down
        attention = e * h + 4 * heads  # output and log-sum-exp
        return block_input + matmuls + attention
    if checkpointing == "full":
        return e * h
    raise ValueError(f"unknown activation checkpointing {checkpointing!r}")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU, by what holds them."""

    parameters: int  # sharded fp32 master parameters
    gradients: int  # sharded fp32 gradients
    optimizer_states: int  # sharded AdamW moments
    unsharded_in_flight: int  # all-gathered parameters and unreduced gradients of the units in flight
    activations: int  # saved for backward, all layers, plus one layer's recompute
    logits_and_loss: int
    overhead: int  # CUDA context, NCCL, allocator fragmentation
    hbm: int

    @property
    def total(self) -> int:
        return (
            self.parameters
            + self.gradients
            + self.optimizer_states
            + self.unsharded_in_flight
            + self.activations
            + self.logits_and_loss
            + self.overhead
        )

    @property
    def fraction(self) -> float:
        return self.total / self.hbm

    def as_gib(self) -> dict[str, float]:
        items = {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_states": self.optimizer_states,
            "unsharded_in_flight": self.unsharded_in_flight,
            "activations": self.activations,
            "logits_and_loss": self.logits_and_loss,
            "overhead": self.overhead,
            "total": self.total,
            "hbm": self.hbm,
        }
        return {key: round(value / GIB, 3) for key, value in items.items()}


def sharded_state_bytes(arch: Architecture, shard_group: int) -> dict[str, int]:
    """Bytes of fp32 parameters, gradients and AdamW moments that rank 0 holds."""
    elements = arch.layers * sharded_elements(arch.layer_shapes(), shard_group) + sharded_elements(
        arch.root_shapes(), shard_group
    )
    return {kind: elements * size for kind, size in STATE_BYTES.items()}


def estimate(
    arch: Architecture,
    *,
    precision: str,
    checkpointing: str,
    sequence_length: int,
    micro_batch: int,
    shard_group: int,
    hbm_bytes: int,
    loss_chunk_tokens: int | None = 4096,
) -> MemoryBreakdown:
    """Peak memory of one GPU for a training step.

    ``loss_chunk_tokens=None`` models an unchunked loss (full fp32 logits).
    """
    states = sharded_state_bytes(arch, shard_group)
    e = element_size(precision)
    tokens = sequence_length * micro_batch

    # FSDP2 keeps the root unit (embedding, final norm, head) and up to two layers
    # (current and prefetched) unsharded in the compute dtype; their gradients exist
    # unsharded in the compute dtype and once more in fp32 for the reduce-scatter.
    gathered = e * (arch.root_parameters + 2 * arch.layer_parameters)
    unreduced = (e + 4) * 2 * arch.layer_parameters
    in_flight = gathered + unreduced

    per_layer = activation_bytes_per_token(arch, precision, checkpointing) * tokens
    recompute = 0 if checkpointing == "none" else activation_bytes_per_token(arch, precision, "none") * tokens
    embeddings = e * arch.hidden_size * tokens  # embedding output feeding layer 0
    activations = arch.layers * per_layer + recompute + embeddings

    # Final norm's saved tensors, then BF16 logits, their fp32 upcast and gradient (10 bytes
    # per logit) for one chunk of tokens at a time.
    chunk = tokens if loss_chunk_tokens is None else min(loss_chunk_tokens, tokens)
    final_norm = (4 * arch.hidden_size + 4 + 2 * e * arch.hidden_size) * tokens
    logits = final_norm + 10 * chunk * arch.vocab_size

    transient = in_flight + activations + logits
    overhead = FIXED_OVERHEAD_BYTES + int(FRAGMENTATION * transient)
    return MemoryBreakdown(
        parameters=states["param"],
        gradients=states["grad"],
        optimizer_states=states["optimizer"],
        unsharded_in_flight=in_flight,
        activations=activations,
        logits_and_loss=logits,
        overhead=overhead,
        hbm=hbm_bytes,
    )
