"""GPU memory per rank: the planner's model of what the trainer in ``training/`` allocates.

Every term is in bytes for the busiest rank (rank 0) of a training step: FSDP2 over a
shard group, the compute dtype's parameters gathered one unit at a time, fp32 gradient
reduction, AdamW, the chunked loss and the activation checkpointing of ``training/components/ac.py``.

The peak is the largest of four moments of a step (``peak_at``):

- ``loss backward``: the forward of the last micro-batch is done; every layer's saved
  activations are alive and the loss chunks are recomputed and differentiated.
- ``top layer backward``: the last layer is recomputed (with checkpointing) and
  differentiated while the layers below still hold their activations.
- ``bottom layer backward``: the first layer's turn; the layers above have released
  their activations, and (with one micro-batch per step) left their sharded gradients.
- ``root reduce``: the end of backward; the embedding and output head's gradients are
  reduced.
- ``optimizer step``: every gradient exists (the fused AdamW of CUDA needs no more).

Sharded fp32 gradients exist through forward and backward from the second micro-batch
of an accumulation on; with one micro-batch per step they appear only as backward
reduces them, after the first two moments.

Two terms are not allocations and stay apart (``overhead``), so that a measurement can
be compared like for like: the fixed per-GPU reserve (CUDA context, NCCL buffers, cuBLAS
workspaces; outside PyTorch's allocator) and the caching allocator's fragmentation
(reserved minus allocated). ``allocated`` compares with ``torch.cuda.max_memory_allocated``
and ``reserved`` with ``torch.cuda.max_memory_reserved``.

Under LoRA (``lora``), the base is frozen: its weights are kept as FSDP2 shards them
(``FROZEN_BASE_BYTES``: bf16 under mixed precision), with no gradient and no optimiser state; the adapters carry fp32
parameters, gradients and AdamW moments, sharded with their layer. Activations are the
base's, plus what the adapters save (``lora_activation_bytes_per_token``). Under QLoRA (``lora.quantized``) the
base's projections are NF4 (``nf4_bytes``: about 0.516 byte per parameter) when stored and gathered, and the
projection that runs holds its weight dequantised to bf16.

The activation formulas were measured to the byte on transformers' LlamaForCausalLM;
``tests/trainer/test_planner_vs_trainer.py`` checks them per layer and checks the whole
step's peak against a real 2-rank FSDP step of the trainer (``bench/memory_peak.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tiered_training.contract.architecture import Architecture, Lora, sharded_elements

GIB = 1024**3
# CUDA context, NCCL buffers and cuBLAS workspaces: a fixed reserve per GPU, outside the allocator.
FIXED_OVERHEAD_BYTES = 4 * GIB
# The caching allocator rounds and fragments: reserved exceeds allocated by this share of the transient terms.
FRAGMENTATION = 0.10
# Bytes per element of optimiser-owned state: fp32 master parameter, fp32 gradient,
# AdamW's two fp32 moments.
STATE_BYTES = {"param": 4, "grad": 4, "optimizer": 8}
# FSDP2 reduces gradients in fp32 (MixedPrecisionPolicy reduce_dtype).
REDUCE_BYTES = 4
# Dropout's mask per element: CUDA's fused kernel keeps a bool mask; on the CPU, PyTorch's
# unfused dropout keeps its scaled noise in the activations' dtype (pass that for a CPU step).
DROPOUT_MASK_BYTES = 1
# Bytes per element of a LoRA run's frozen base, by precision: under mixed precision (bf16, fp8) the
# trainer stores it in bf16, the dtype FSDP2 gathers it in (training/models/lora.py store_frozen_base);
# under fp32 it stays fp32.
FROZEN_BASE_BYTES = {"bf16": 2, "fp8": 2, "fp32": 4}
# QLoRA: the frozen base's projections (the seven linear layers of every decoder layer) in torchao's NF4 layout
# (torchao.quantization.to_nf4 defaults, NF4Tensor): two 4-bit codes per byte; one int8 scale per block of
# NF4_BLOCK elements; those scales double-quantised, one factor in the source dtype (bf16) per NF4_SCALER_BLOCK
# scales; per tensor, the scales' mean and the 16-entry code table in bf16. Embedding, norms and head stay bf16.
NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256
NF4_TENSOR_BYTES = 2 + 16 * 2


def nf4_bytes(elements: int, source_bytes: int = 2) -> int:
    """Bytes of an NF4Tensor of ``elements`` (a whole tensor, or one FSDP2 shard of one) quantised from a tensor
    of ``source_bytes`` per element."""
    return (
        elements // 2
        + elements // NF4_BLOCK
        + source_bytes * (elements // (NF4_BLOCK * NF4_SCALER_BLOCK))
        + NF4_TENSOR_BYTES
    )


def nf4_unsplittable(arch: Architecture, targets: tuple[str, ...], group: int) -> list[str]:
    """The target projections whose weights do not split into whole NF4 scale blocks (NF4_BLOCK x
    NF4_SCALER_BLOCK elements) on each of ``group`` FSDP2 ranks, with their shapes (training/models/nf4.py)."""
    unit = NF4_BLOCK * NF4_SCALER_BLOCK * group
    sizes = arch.projection_sizes()
    out = []
    for name in targets:
        fan_in, fan_out = sizes[name]
        if fan_out % group or (fan_in * fan_out) % unit:
            out.append(f"{name} ({fan_out} x {fan_in})")
    return out


def _adapted(name: str, targets: tuple[str, ...]) -> bool:
    """Whether ``name`` is the weight of a projection that carries an adapter (and so, under QLoRA, is NF4)."""
    return name.endswith("_proj.weight") and name.split(".")[-2] in targets


def frozen_layer_bytes(arch: Architecture, precision: str, group: int = 1, *, quantized: tuple[str, ...]) -> int:
    """Bytes of one decoder layer's frozen base on rank 0 of a shard group of ``group`` (1: gathered whole):
    in ``FROZEN_BASE_BYTES``, the weights of the ``quantized`` projections (QLoRA's targets) in NF4."""
    size = FROZEN_BASE_BYTES[precision]
    total = 0
    for name, shape in arch.layer_shapes():
        elements = sharded_elements([(name, shape)], group)
        total += nf4_bytes(elements) if _adapted(name, quantized) else size * elements
    return total


def adapter_dropout_bytes_per_token(arch: Architecture, precision: str, lora: Lora | None, mask_bytes: int) -> int:
    """Bytes one layer's adapter dropout keeps per token: each adapter's own copy of its projection's input
    and the mask (0 without dropout)."""
    if lora is None or not lora.dropout:
        return 0
    sizes = arch.projection_sizes()
    return sum((element_size(precision) + mask_bytes) * sizes[name][0] for name in lora.targets)


def lora_activation_bytes_per_token(
    arch: Architecture, precision: str, lora: Lora, mask_bytes: int = DROPOUT_MASK_BYTES
) -> int:
    """Bytes one layer's adapters keep for backward, per token: each ``lora_B`` keeps its
    rank-wide input; with dropout, each adapter's dropout makes its own copy of the
    projection's input (kept by ``lora_A``) and a mask (peft applies
    ``lora_B(lora_A(dropout(x)))``). Without dropout ``lora_A`` keeps ``x`` itself, counted
    with the base's tensors."""
    ranks = element_size(precision) * lora.rank * len(lora.targets)
    return ranks + adapter_dropout_bytes_per_token(arch, precision, lora, mask_bytes)


PHASES = ("loss backward", "top layer backward", "bottom layer backward", "root reduce", "optimizer step")


def element_size(precision: str) -> int:
    """Bytes per activation element: BF16 compute for bf16 and fp8 (torchao keeps the
    high-precision input for backward), fp32 otherwise."""
    return 4 if precision == "fp32" else 2


@functools.lru_cache(maxsize=1024)  # pure, and asked for each candidate of the planner's search
def activation_bytes_per_token(
    arch: Architecture,
    precision: str,
    checkpointing: str,
    lora: Lora | None = None,
    mask_bytes: int = DROPOUT_MASK_BYTES,
    *,
    compiled: bool = False,
) -> int:
    """Bytes one decoder layer keeps for backward, per token of the micro-batch.

    - ``none``: every tensor autograd saves. Per RMSNorm, an fp32 copy of its input
      (4h), the rsqrt (4) and two h-wide tensors in the compute dtype; Q, K, V after
      RoPE, the attention output and its fp32 log-sum-exp (4 per head); SwiGLU's gate,
      up, SiLU and product (4f). About 49 h for Llama 3 8B. Qwen3's q/k norms add what
      ``qk_norm_bytes_per_token`` counts.
    - ``none``, ``compiled``: what Inductor's partitioner keeps of a compiled block, counted
      per saved tensor on ``torch.compile`` of transformers' LlamaDecoderLayer: the block
      input and both RMSNorm outputs (3h), their fp32 rsqrt (4 each), Q, K and V after RoPE
      (q + 2kv, q = n_heads * head_dim, h unless head_dim is set), the attention output and its contiguous copy
      for o_proj (2q), the log-sum-exp,
      and SwiGLU's gate, up and SiLU(gate) (3f). The fp32 upcasts are recomputed in
      backward. About 34 h for Llama 3 8B. Measured for BF16 and fp32 blocks
      (``bench/activations_compiled.py``).
    - ``none``, ``compiled``, FP8 (torchao's Float8Linear, tensorwise or rowwise): the partitioner
      saves no float8 tensor (it recomputes the casts) and keeps fewer compute-dtype tensors:
      e * (4h + 2kv + 2f) per token (Q, K, V, the attention output, gate and up among them; SiLU(gate)
      is recomputed), the two rsqrts and the log-sum-exp, plus a few scalar scales per micro-batch
      (tensorwise). About 23 h for Llama 3 8B. Measured per saved tensor on the CPU
      (``bench/activations_compiled.py``); eager FP8 keeps what BF16 keeps.
    - ``selective``: the block input, the attention output and its log-sum-exp, and the
      outputs of every other matmul (q, v, gate, down: h + kv + f + h); the rest is
      recomputed.
    - ``full``: only the block input.

    Under ``lora`` (a frozen base): ``none`` drops what the base keeps only for its weight
    gradients (each RMSNorm's normalised input and output, SwiGLU's product) unless an
    adapter without dropout keeps the same tensor, and adds the adapters' own
    (``lora_activation_bytes_per_token``); ``none``, ``compiled``: what a compiled BF16 block keeps
    without adapters (the projections' inputs that lora_A's weight gradient reads among them), plus the
    adapters' own, under FP8 too: with the adapters reading the BF16 inputs, the partitioner keeps
    them rather than recompute them (measured, ``bench/activations_compiled.py``); ``selective`` saves
    every other matmul output with the adapters' two matmuls counted in order after their projection's.
    """
    e = element_size(precision)
    h, kv, f, heads, q = arch.hidden_size, arch.kv_size, arch.ffn_size, arch.attention_heads, arch.q_size
    if checkpointing == "none" and compiled and lora is not None:
        base = activation_bytes_per_token(arch, "bf16" if precision == "fp8" else precision, "none", compiled=True)
        return base + lora_activation_bytes_per_token(arch, precision, lora, mask_bytes)
    if checkpointing == "none" and compiled and precision == "fp8" and lora is None:
        return e * (4 * h + 2 * kv + 2 * f) + 2 * 4 + 4 * heads
    if checkpointing == "none" and compiled and lora is None:
        return e * (3 * h + 3 * q + 2 * kv + 3 * f) + 2 * 4 + 4 * heads
    if checkpointing == "none":
        attention = e * (2 * q + 2 * kv) + 4 * heads + qk_norm_bytes_per_token(arch, precision, frozen=lora is not None)
        if lora is None:
            return 2 * (4 * h + 4 + 2 * e * h) + attention + 4 * e * f
        kept = set(lora.targets) if not lora.dropout else set()  # adapters that keep their projection's input
        norms = 2 * (4 * h + 4) + e * h * (
            bool(kept & {"q_proj", "k_proj", "v_proj"}) + bool(kept & {"gate_proj", "up_proj"})
        )
        mlp = 3 * e * f + e * f * ("down_proj" in kept)
        return norms + attention + mlp + lora_activation_bytes_per_token(arch, precision, lora, mask_bytes)
    if checkpointing == "selective":
        block_input = e * h
        matmuls = e * sum(_matmul_widths(arch, lora)[0::2])  # without LoRA: q_proj, v_proj, gate_proj, down_proj
        attention = e * q + 4 * heads  # output and log-sum-exp
        return block_input + matmuls + attention
    if checkpointing == "full":
        return e * h
    raise ValueError(f"unknown activation checkpointing {checkpointing!r}")


def qk_norm_bytes_per_token(arch: Architecture, precision: str, *, frozen: bool) -> int:
    """What Qwen3's q and k norms keep per token (0 without them), counted as for the layer norms: each keeps
    its input in fp32 and one rsqrt per head; with a trained weight, also the normalised input in the compute
    dtype. RoPE, which follows, keeps only cos and sin."""
    if not arch.qk_norm:
        return 0
    width, rows = arch.q_size + arch.kv_size, arch.attention_heads + arch.kv_heads
    return 4 * width + 4 * rows + (0 if frozen else element_size(precision) * width)


def _matmul_widths(arch: Architecture, lora: Lora | None) -> list[int]:
    """Output widths of one layer's matmuls in forward order (each adapter's A and B after its projection)."""
    widths = []
    for name, (_, fan_out) in arch.projection_sizes().items():
        widths.append(fan_out)
        if lora is not None and name in lora.targets:
            widths += [lora.rank, fan_out]
    return widths


@functools.lru_cache(maxsize=1024)  # pure, and asked for each candidate of the planner's search
def backward_bytes_per_token(
    arch: Architecture,
    precision: str,
    checkpointing: str,
    lora: Lora | None = None,
    mask_bytes: int = DROPOUT_MASK_BYTES,
) -> int:
    """Bytes per token that one layer's backward adds, at its height, to what it keeps.

    - ``none``: the RMSNorm backward's fp32 temporaries (four h-wide fp32 tensors and the
      incoming gradient); the layer's own saved tensors are being released meanwhile.
    - ``full``: the recompute brings back everything ``none`` saves, and the SwiGLU
      backward holds two f-wide gradients while two h-wide inputs are already freed.
    - ``selective``: as ``full`` less what the policy kept (V, the attention output and
      log-sum-exp, gate, and the q that RoPE re-derives) and one f-wide gradient fewer.

    Measured on transformers' LlamaDecoderLayer for three shapes (different h, f and kv).
    """
    e = element_size(precision)
    h, kv, f, heads = arch.hidden_size, arch.kv_size, arch.ffn_size, arch.attention_heads
    none = activation_bytes_per_token(arch, precision, "none", lora, mask_bytes)
    if checkpointing == "none":
        return (e + 16) * h
    if checkpointing == "full":
        return none + e * (2 * f - 2 * h)
    if checkpointing == "selective":
        return none + e * (f - 4 * h - kv) - 4 * heads
    raise ValueError(f"unknown activation checkpointing {checkpointing!r}")


def loss_bytes_per_logit(precision: str) -> int:
    """Peak bytes per logit of one loss chunk's recompute and backward: the logits, their
    fp32 upcast and log-softmax, and the gradient (measured: 12 for BF16, 16 for fp32)."""
    return 16 if precision == "fp32" else 12


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU at the step's peak, by what holds them."""

    parameters: int  # sharded fp32 master parameters
    gradients: int  # sharded fp32 gradients alive at the peak
    optimizer_states: int  # sharded AdamW moments
    unsharded_in_flight: int  # gathered parameters, unreduced gradients and reduce buffers of the units in flight
    activations: int  # saved for backward, plus the backward (and recompute) of the layer at the peak
    logits_and_loss: int  # final norm, one loss chunk's logits and their gradient
    overhead: int  # fixed reserve (CUDA context, NCCL, cuBLAS) + allocator fragmentation
    hbm: int
    fragmentation: int = 0  # the part of ``overhead`` that the caching allocator reserves but does not allocate
    peak_at: str = ""  # which moment of the step the peak is (one of PHASES)
    adapter_dropout: int = 0  # LoRA: each adapter dropout's copy of its input and mask, apart from ``activations``

    @property
    def total(self) -> int:
        return self.allocated + self.overhead

    @property
    def allocated(self) -> int:
        """Bytes of live tensors at the peak: compare with ``torch.cuda.max_memory_allocated``."""
        return (
            self.parameters
            + self.gradients
            + self.optimizer_states
            + self.unsharded_in_flight
            + self.activations
            + self.logits_and_loss
            + self.adapter_dropout
        )

    @property
    def reserved(self) -> int:
        """What the caching allocator holds: compare with ``torch.cuda.max_memory_reserved``."""
        return self.allocated + self.fragmentation

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
            **({"adapter_dropout": self.adapter_dropout} if self.adapter_dropout else {}),
            "logits_and_loss": self.logits_and_loss,
            "overhead": self.overhead,
            "total": self.total,
            "hbm": self.hbm,
        }
        return {key: round(value / GIB, 3) for key, value in items.items()}


def block_mask_bytes(sequence_length: int, block: int = 128) -> int:
    """One row's FlexAttention block mask (``training/models/attention.py``): the used and the unmasked
    key blocks of each query block and their transposes (four ``blocks x blocks`` int32 index tables and
    four int32 counts per block), and each token's example id (int64) that the element mask reads."""
    blocks = -(-sequence_length // block)
    return 16 * blocks * (blocks + 1) + 8 * sequence_length


def sharded_state_bytes(
    arch: Architecture, shard_group: int, lora: Lora | None = None, precision: str = "bf16"
) -> dict[str, int]:
    """Bytes of fp32 parameters, gradients and AdamW moments that rank 0 holds. Under LoRA the
    frozen base adds its weights (``FROZEN_BASE_BYTES[precision]`` each; under QLoRA its projections in NF4),
    and only the adapters have state."""
    return dict(_sharded_state(arch, shard_group, lora, precision))


@functools.lru_cache(maxsize=1024)
def _sharded_state(
    arch: Architecture, shard_group: int, lora: Lora | None, precision: str
) -> tuple[tuple[str, int], ...]:
    """:func:`sharded_state_bytes`, kept per model, group, adapters and precision (the planner asks often)."""
    return tuple(_state_bytes(arch, shard_group, lora, precision).items())


def _state_bytes(arch: Architecture, shard_group: int, lora: Lora | None, precision: str) -> dict[str, int]:
    elements = arch.layers * sharded_elements(arch.layer_shapes(), shard_group) + sharded_elements(
        arch.root_shapes(), shard_group
    )
    if lora is None:
        return {kind: elements * size for kind, size in STATE_BYTES.items()}
    adapters = arch.layers * sharded_elements(arch.lora_shapes(lora.rank, lora.targets), shard_group)
    states = {kind: adapters * size for kind, size in STATE_BYTES.items()}
    if lora.quantized:
        root = sharded_elements(arch.root_shapes(), shard_group) * FROZEN_BASE_BYTES[precision]
        states["param"] += arch.layers * frozen_layer_bytes(arch, precision, shard_group, quantized=lora.targets) + root
    else:
        states["param"] += elements * FROZEN_BASE_BYTES[precision]
    return states


def _phases(
    arch: Architecture,
    precision: str,
    checkpointing: str,
    tokens: int,
    sequence_length: int,
    chunk: int,
    lora: Lora | None = None,
    mask_bytes: int = DROPOUT_MASK_BYTES,
    document_mask: bool = False,
    compiled: bool = False,
) -> dict[str, tuple[int, int, int, float, int]]:
    """(unsharded in flight, activations, logits and loss, share of the sharded gradients
    already reduced in this micro-batch, adapter dropout's part of the activations) at each moment, in bytes."""
    e = element_size(precision)
    h, vocab, layers = arch.hidden_size, arch.vocab_size, arch.layers
    layer, root = _layer_and_root_parameters(arch)
    head_grad = e * vocab * h  # the output head's (or tied embedding's) unsharded gradient, until the root reduces
    kept = activation_bytes_per_token(arch, precision, checkpointing, lora, mask_bytes, compiled=compiled) * tokens
    # adapter dropout's copies and masks: kept by every layer without checkpointing, else by the layer in backward
    dropout = adapter_dropout_bytes_per_token(arch, precision, lora, mask_bytes) * tokens
    kept_dropout = dropout if checkpointing == "none" else 0
    adapters = 0
    gathered_layer = e * layer  # one decoder layer's parameters, gathered
    if lora is not None:
        # Frozen base: no head, embedding or layer gradients; the adapters are gathered with
        # their layer, and theirs are the only gradients reduced.
        adapters = lora.layer_elements(arch)
        head_grad = 0
        if lora.quantized:  # gathered in NF4; each projection dequantises its weight to bf16 when it runs
            sizes = arch.projection_sizes()
            widest = max(sizes[name][0] * sizes[name][1] for name in lora.targets)
            gathered_layer = frozen_layer_bytes(arch, precision, quantized=lora.targets) + e * widest
    rope = 2 * e * arch.head_dim * sequence_length  # RoPE's cos and sin, shared by the micro-batch's rows
    if document_mask:  # packed examples: a FlexAttention block mask per row, shared by the layers
        rope += tokens // sequence_length * block_mask_bytes(sequence_length)
    final_norm = (4 * h + 4 + 2 * e * h) * tokens  # the final RMSNorm's saved tensors and its output

    # End of forward: the root and the last layer stay gathered (FSDP2 does not reshard them).
    loss = (
        e * (root + adapters) + gathered_layer + head_grad,
        layers * kept + rope,
        final_norm + loss_bytes_per_logit(precision) * chunk * vocab + e * h * tokens,
        0.0,
        layers * kept_dropout,
    )
    # The last layer's backward: it and the prefetched layer below are gathered; its gradients
    # exist unsharded and, for the layer above it, as the fp32 reduce-scatter input; the
    # gradient of its output flows in.
    trained = layer if lora is None else adapters
    in_layer = e * (root + 2 * adapters) + 2 * gathered_layer + head_grad + (e + REDUCE_BYTES) * trained
    backward = (backward_bytes_per_token(arch, precision, checkpointing, lora, mask_bytes) + e * h) * tokens
    in_backward = dropout if checkpointing != "none" else 0  # the recomputed layer's copies
    top = (in_layer, layers * kept + rope + backward, 0, 0.0, layers * kept_dropout + in_backward)
    bottom = (in_layer, kept + rope + backward, 0, (layers - 1) / layers, kept_dropout + in_backward)
    # End of backward: the root's gradients, unsharded and as the fp32 reduce-scatter input.
    root_reduce = (e * root + (e + REDUCE_BYTES) * root if lora is None else e * root, rope, 0, 1.0, 0)
    return {
        "loss backward": loss,
        "top layer backward": top,
        "bottom layer backward": bottom,
        "root reduce": root_reduce,
        "optimizer step": (0, 0, 0, 1.0, 0),
    }


@functools.lru_cache(maxsize=1024)
def _trained_layer_elements(arch: Architecture, lora: Lora | None, shard_group: int) -> int:
    """Elements of the trained weights of every decoder layer (the adapters' under LoRA) that rank 0 holds."""
    trained = arch.layer_shapes() if lora is None else arch.lora_shapes(lora.rank, lora.targets)
    return arch.layers * sharded_elements(trained, shard_group)


@functools.lru_cache(maxsize=256)
def _layer_and_root_parameters(arch: Architecture) -> tuple[int, int]:
    return arch.layer_parameters, arch.root_parameters


@functools.lru_cache(maxsize=4096)  # pure: the planner's search asks again for settings it has seen
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
    grad_accum_steps: int | None = None,
    lora: Lora | None = None,
    dropout_mask_bytes: int = DROPOUT_MASK_BYTES,
    document_mask: bool = False,
    compiled: bool = False,
) -> MemoryBreakdown:
    """Peak memory of one GPU for a training step.

    ``loss_chunk_tokens=None`` models an unchunked loss (full fp32 logits).
    ``grad_accum_steps``: micro-batches per optimiser step; ``None`` (not known) is
    taken as more than one, so the sharded gradients are held throughout.
    ``lora``: LoRA adapters on a frozen base; ``dropout_mask_bytes``: per element of their
    dropout's mask (``DROPOUT_MASK_BYTES``); ``document_mask``: packed SFT examples, whose
    FlexAttention block mask (``block_mask_bytes`` per row, no N x N tensor) lives through the step.
    ``compiled``: the decoder layers run under ``torch.compile`` (what they keep without
    checkpointing differs; see :func:`activation_bytes_per_token`).
    """
    states = sharded_state_bytes(arch, shard_group, lora, precision)
    tokens = sequence_length * micro_batch
    chunk = tokens if loss_chunk_tokens is None else min(loss_chunk_tokens, tokens)
    accumulates = grad_accum_steps is None or grad_accum_steps > 1

    layer_grads = _trained_layer_elements(arch, lora, shard_group) * STATE_BYTES["grad"]
    peaks = []
    for phase, (in_flight, activations, logits, reduced, dropout) in _phases(
        arch,
        precision,
        checkpointing,
        tokens,
        sequence_length,
        chunk,
        lora,
        dropout_mask_bytes,
        document_mask,
        compiled,
    ).items():
        if accumulates or reduced == 1.0:
            grads = states["grad"]
        else:
            grads = int(reduced * layer_grads)
        allocated = states["param"] + states["optimizer"] + grads + in_flight + activations + logits
        peaks.append((allocated, phase, grads, in_flight, activations, logits, dropout))
    # The phase of the highest peak (the first, on a tie).
    _, phase, grads, in_flight, activations, logits, dropout = max(peaks, key=lambda peak: peak[0])

    # With one micro-batch per step the gradients are allocated only as backward reduces
    # them, but the caching allocator keeps their blocks reserved from one step to the
    # next (measured on an H200: reserved minus allocated is the sharded fp32 gradient).
    fragmentation = int(FRAGMENTATION * (in_flight + activations + logits)) + states["grad"] - grads
    return MemoryBreakdown(
        parameters=states["param"],
        gradients=grads,
        optimizer_states=states["optimizer"],
        unsharded_in_flight=in_flight,
        activations=activations - dropout,
        logits_and_loss=logits,
        adapter_dropout=dropout,
        overhead=FIXED_OVERHEAD_BYTES + fragmentation,
        hbm=hbm_bytes,
        fragmentation=fragmentation,
        peak_at=phase,
    )
