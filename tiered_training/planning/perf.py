"""The performance model: the step time of this container's training loop, term by term.

A step is ``accum`` micro-batches and one optimiser step. Per micro-batch and GPU:

- **GEMMs**, by shape: every Linear of every layer and the output head, forward
  (``2MKN`` FLOPs) and backward (two more GEMMs of the same size), at an efficiency
  that depends on the precision and the GEMM's size: each GEMM costs its FLOPs over
  ``efficiency x peak`` plus a fixed time, so small GEMMs reach a smaller fraction of
  the peak, and a GPU with a higher peak needs bigger GEMMs to reach it.
  FP8 (torchao) adds its casts: bytes over HBM bandwidth. Compiled, the casts are fused
  (a fitted factor on the bytes counted); eager, each is the chain of kernels torchao's
  code runs, counted op by op (``eager_fp8_casts``). Only this container's runs are eager
  FP8: a factor fitted on them scales the count, and held out it is 1, the count alone.
- **attention**: causal FLOPs of flash attention (forward ``2 s^2 h`` per sequence and
  layer, backward 2.5 times that), at the kernel's efficiency of the BF16 peak
  (``attention_efficiency``: flash-attention 2 or cuDNN), which falls
  for short calls (the per-rank chunk under context parallelism) as published kernel
  benchmarks show.
- **memory-bound work**: norms, RoPE, SwiGLU's products, residual adds and the loss,
  as bytes over HBM bandwidth; eager mode moves more bytes than compiled kernels: this
  container's decoder op by op (``container_eager``: each op one kernel reading and writing
  at HBM), a published framework's Llama ``eager_memory_factor`` times the compiled count.
- **recomputation**: what activation checkpointing runs a second time in backward; and this
  container's loss chunks, each under a checkpoint: the output head's GEMM and the loss
  forward again in backward (``CONTAINER_LOSS_BYTES``).
- **context parallelism's ring** (``ring_seconds``): PyTorch's ring attention merges each step's
  output into the running one in fp32 by its log-sum-exp and accumulates dQ, dK and dV in fp32,
  kernel by kernel at HBM bandwidth (``RING_*``); what the published ring runs take beyond that
  count is a fitted share of the attention per step past the first (``ring_cost``).
- **exposed communication**: FSDP2's all-gathers (forward, and again in backward)
  and reduce-scatters per unit, over NVLink inside a node and EFA across nodes;
  context parallelism's ring of K/V blocks. FSDP prefetching hides communication
  behind compute; what is left shows.

Per step, **hybrid sharding's all-reduce across replicas**, in the last micro-batch's
backward (the earlier micro-batches only reduce-scatter inside the shard group).

And per step, **the optimiser**: AdamW and gradient clipping over the sharded fp32
state, bytes over HBM bandwidth.

**Fine-tuning.** SFT on packed examples runs as pretraining, except attention: a
document mask keeps it inside each example (``document_mask``). The trainer runs it as
compiled FlexAttention with a block mask, which skips the blocks between examples: at
most the causal FLOPs (one example filling the sequence), at the SDPA kernel's rate times
FlexAttention's published share of FlashAttention-2's, 90% forward and 85% backward
(https://pytorch.org/blog/flexattention/, "Performance").

**Frozen weights (LoRA, QLoRA).** The frozen base still runs forward and backward through
its activations: per Linear the forward GEMM and the input-gradient GEMM, but no
weight-gradient GEMM, about 2/3 of the 6N FLOPs per token of full training (Kaplan et al.
2020, https://arxiv.org/abs/2001.08361, section 2.1; https://arxiv.org/abs/2106.09685,
section 4.2). Under FP8, torchao's ``Float8Linear`` computes the weight gradient whatever
the weight needs (``matmul_with_hp_or_float8_args.backward``): compiled, AOTAutograd drops
that unused GEMM and its casts; eager, it runs, and the model counts it. Each adapter
(``adapter_seconds``) adds six thin GEMMs, ``lora_A`` and ``lora_B`` forward and both
backward GEMMs of each, at the roofline of their FLOPs and the bytes they move (the adapted
input read by ``lora_A`` forward and by its weight gradient, the input gradient it writes,
the projection-wide output and gradient of ``lora_B``); the add of its scaled output, the
scaled gradient and the extra input-gradient sum (``ADAPTER_ELEMENTWISE``); its dropout, when
set, as its own term. QLoRA's NF4 base is dequantised by torchao's ``linear_nf4`` each time a
projection runs, forward and again backward (``NF4_DEQUANT_BYTES`` per weight each time).
Only the adapters' gradients are reduce-scattered and only their optimiser state is
stepped; FSDP still all-gathers the frozen weights (in NF4 under QLoRA).

Pure Python. The few free parameters live in ``catalog/performance.yaml``, fitted by
``make calibrate`` on published runs (``catalog/calibration.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from tiered_training.catalog import Instance, PerformanceModel, performance_model
from tiered_training.contract.architecture import Architecture, Lora
from tiered_training.planning.memory import frozen_layer_bytes

# The selective checkpointing policy saves attention and every other matmul output:
# backward recomputes about half of the forward matmul FLOPs, and every elementwise op.
SELECTIVE_RECOMPUTED_MATMULS = 0.5
# AdamW (fused) reads parameter, gradient and both moments and writes three of them
# (28 bytes of fp32 per element); gradient clipping reads and scales the gradient (12).
OPTIMIZER_BYTES_PER_ELEMENT = 40
# Chunked cross-entropy per token: BF16 logits upcast to fp32, log-sum-exp, softmax
# gradient, cast back (bytes per vocabulary entry).
LOSS_BYTES_PER_LOGIT = 24
# This container's loss (training/components/loss.py), bytes per logit: each chunk runs under a checkpoint, so
# backward runs the output head's GEMM and the loss's forward again. Forward, and again in backward: the upcast to
# fp32 (read 2, write 4) and log_softmax (4, 4); backward: nll_loss's zeroed gradient (write 4), log_softmax's
# (read 4 and 4, write 4) and the cast back (4, 2).
CONTAINER_LOSS_BYTES = (14, 14 + 22)
# This container's decoder run eagerly (training/models/decoder.py), op by op, each op one kernel that reads its
# inputs and writes its output at HBM: bytes per token and layer per element of the width named, (forward, backward),
# and kernels per layer. Compiled, Inductor fuses them into the bytes of ``step_time``'s count.
# - RMSNorm (per element of its width; in fp32 as transformers' LlamaRMSNorm): the upcast (read 2, write 4), pow
#   (4, 4), mean (read 4), times rsqrt (4, 4), the cast back (4, 2), times the weight (2, 2): 36 bytes, 8 kernels;
#   backward: the gradient times the weight (2, 2) and the weight's gradient (read 4, write 2, reduced 2), the upcast
#   (2, 4), times rsqrt (4, 4) and rsqrt's gradient (read 8, write 4, reduced 4), mean's expanded gradient (write
#   4), pow's (x.pow(1): 4, 4; times 2: 4, 4; times the gradient: 8, 4), the two gradients summed (8, 4), the cast
#   back (4, 2): 92 bytes, 14 kernels.
CONTAINER_NORM = ((36, 92), (8, 14))
# - rotary embedding (per element of Q and of K): times cos (2, 2), rotate_half's negated half (1, 1) and cat (2, 2),
#   times sin (2, 2), the sum (4, 2): 20 bytes, 5 kernels; backward: the gradient times cos and times sin (2, 2
#   each), the negation (1, 1), each half's slice_backward (zeros 2, copy 1 and 1), the three gradients summed
#   (4, 2 twice): 30 bytes, 9 kernels.
CONTAINER_ROPE = ((20, 30), (5, 9))
# - SwiGLU (per element of the FFN width): silu (2, 2), times up (4, 2): 10 bytes, 2 kernels; backward: the
#   product's two gradients (4, 2 each) and silu's (4, 2): 18 bytes, 3 kernels.
CONTAINER_SWIGLU = ((10, 18), (2, 3))
# - residuals (per element of the hidden size): two adds (4, 2 each); backward, the gradient summed where each
#   residual branches (4, 2 each): 12 bytes and 2 kernels each way.
CONTAINER_RESIDUAL = ((12, 12), (2, 2))
# - the attention output's layout copy to [batch, sequence, heads x head_dim] (per element of Q), and its
#   gradient's: 4 bytes and 1 kernel each way.
CONTAINER_LAYOUT = ((4, 4), (1, 1))
# FlexAttention's throughput as a share of FlashAttention-2's (https://pytorch.org/blog/flexattention/)
FLEX_FORWARD_SHARE = 0.90
FLEX_BACKWARD_SHARE = 0.85
# cuDNN's fused attention on Hopper over PyTorch SDPA's flash-attention 2 backend: 631 against
# 329 TFLOPS forward on H100 (tritonbench, batch 1, 24 heads, 4,608 tokens, head dim 128:
# https://github.com/pytorch/pytorch/issues/142132). PyTorch SDPA prefers cuDNN on sm90 and sm100
# once its bundled cuDNN is newer than 9.15, as in torch 2.11 (``check_prefer_cudnn_attention``
# in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; https://github.com/huggingface/transformers/pull/48163);
# before, it ran flash-attention 2 there (https://github.com/pytorch/pytorch/pull/128539).
CUDNN_OVER_FLASH2_HOPPER = 631.3 / 329.5
# FlashAttention in Triton (flash_attn_triton.py, MPT's attn_impl: triton) against flash-attention 2: "1.3-2.5x
# faster than FlashAttention in Triton" (FlashAttention-2, https://arxiv.org/abs/2307.08691, section 4.1), the
# geometric middle of that range.
FLASH2_OVER_TRITON = (1.3 * 2.5) ** 0.5
# torchao's float8 cast of one tensor without torch.compile, kernel by kernel
# (torchao/float8/float8_utils.py: tensor_to_amax, amax_to_scale, to_fp8_saturated;
# float8_training_tensor.py: _ToFloat8ConstrFunc): abs (reads 2 bytes per element, writes 2),
# max (reads 2), the upcast to fp32 (2, 4), the multiply by the scale (4, 4), the clamp
# (4, 4) and the cast to float8 (4, 1): 33 bytes per element; and four kernels on the
# scalar scale (to float64, clamp, divide, to float32).
EAGER_CAST_BYTES = 33
EAGER_CAST_KERNELS = 6 + 4
# One short kernel launched back to back costs a few microseconds whatever it moves
# (NVIDIA, "Getting Started with CUDA Graphs", https://developer.nvidia.com/blog/cuda-graphs/).
KERNEL_SECONDS = 4e-6
# Transformer Engine's float8 cast of one tensor under current scaling (tensorwise) or MXFP8: the amax pass (read 2
# bytes per element; MXFP8 computes each block's scale in the cast kernel instead) and one cast-transpose kernel
# that reads the BF16 tensor once and writes both FP8 layouts the GEMMs need (read 2, write 1 + 1)
# (transformer_engine/common/transpose/cast_transpose.cu; quantize in transformer_engine/pytorch/tensor).
TE_CAST_BYTES = {"tensorwise": 6, "mxfp8": 4}
# Context parallelism (PyTorch's ring attention, torch.distributed.tensor.experimental._attention, as torchtitan
# and this container run it: head-tail load balancing, fp32 merging, K/V all-gathered forward, dK/dV passed
# around the ring backward). Its memory-bound work, in bytes per element of the rank's attention output
# (``tokens x q_size``) or of its K/V (``tokens x K/V width``), each a separate kernel at HBM bandwidth:
# - forward, once: the first step's output upcast to fp32 (read 2, write 4) and the result cast back (4, 2);
RING_MERGE_ONCE_BYTES = 12
# - forward, each step past the first (``_SDPAMerger``): the block's output upcast (2, 4), ``out - block_out``
#   (8, 4), times the sigmoid of the log-sum-exp difference (4, 4), subtracted from the running output (8, 4):
#   38 bytes; a step on the tail half of the queries does that on half the output and rebuilds the whole buffer
#   (``_partial_update``: the copy into its chunk, 4 and 4 on half, and ``torch.cat``, 4 and 4): 31. Half the
#   steps are each kind: 34.5.
RING_MERGE_STEP_BYTES = 34.5
# - backward, each step past the first: dQ accumulated in fp32 (read 2 and 4, write 4) and the flash backward's
#   own pass over the step's dO and O and its fp32 dQ accumulator (read 4, write 4 and read 4, write 2 on the
#   three quarters of the queries a step past the first has on average): 10 + 10.5 per output element;
RING_GRAD_Q_BYTES = 20.5
#   dK and dV accumulated in fp32 (10 each) and concatenated into the buffer sent to the next rank (8 each),
#   and K and V concatenated for the exchange (4 each): per element of K/V width.
RING_GRAD_KV_BYTES = 2 * (10 + 8 + 4)
# Kernels per step past the first: the merge's six (forward), the accumulations' and concatenations' seven (backward).
RING_STEP_KERNELS = (6, 7)
# torchao's NF4 dequantisation of one weight (NF4Tensor.get_original_weight, eager), bytes per weight
# element: the two nibbles shifted and masked (read 0.5, write 0.5 each) and widened to int64 (read 0.5,
# write 4 each); each looked up in the 16-entry table (read 4, write 1 each); the block scales expanded
# (write 1); each half multiplied by its scale (read 2, write 1 each); the halves stacked (read 2, write 2).
# Ten kernels on the weight and four on the double-quantised scales.
NF4_DEQUANT_BYTES = 32
NF4_DEQUANT_KERNELS = 14
# An adapter's elementwise work per token, in elements of (fan-in, fan-out), forward and backward,
# besides its GEMMs. Compiled, Inductor fuses it into the neighbouring kernels: forward reads lora_B's
# output once more (the scaled add), backward writes the scaled output gradient and reads lora_A's
# input gradient once more (summed with the base's). Eager, each is its own kernel: the scale (read and
# write the output) and the add (read two, write one) forward, the scale backward and the input
# gradient's sum (read two, write one).
# {compiled: ((forward fan-in, fan-out), (backward fan-in, fan-out))}
ADAPTER_ELEMENTWISE = {True: ((0, 1), (1, 1)), False: ((0, 5), (3, 2))}


@dataclass(frozen=True)
class Hardware:
    """What the model needs of a machine: one GPU, its node and the network."""

    gpu: str
    gpus_per_node: int  # GPUs that share NVLink
    peak_bf16_flops: float
    peak_fp8_flops: float | None
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per GPU and direction
    network_bytes_per_s: float  # per node and direction (EFA)
    compute_factor: float = 1.0  # < 1 for power-limited GPUs
    # the best matmul's measured share of the datasheet peak (Maximum Achievable Matmul FLOPS), BF16 and FP8
    matmul_bf16_fraction: float = 1.0
    matmul_fp8_fraction: float = 1.0

    @classmethod
    def of(cls, instance: Instance) -> Hardware:
        """From a :class:`catalogs.Instance`."""
        return cls(
            gpu=instance.gpu,
            gpus_per_node=instance.gpus,
            peak_bf16_flops=instance.peak_bf16_tflops * 1e12,
            peak_fp8_flops=instance.peak_fp8_tflops * 1e12 if instance.peak_fp8_tflops else None,
            hbm_bytes_per_s=instance.hbm_tbps * 1e12,
            nvlink_bytes_per_s=instance.nvlink_gbytes_per_s * 1e9,
            network_bytes_per_s=instance.efa_gbps * 1e9 / 8,
            matmul_bf16_fraction=instance.matmul_bf16_fraction,
            matmul_fp8_fraction=instance.matmul_fp8_fraction,
        )


@dataclass(frozen=True)
class Setting:
    """One point of the planner's search: how a run is parallelised and computed."""

    precision: str  # bf16 | fp8 | fp32
    checkpointing: str  # none | selective | full
    micro_batch: int  # sequences per data-parallel rank (a context-parallel group)
    shard_group: int  # GPUs sharing one sharded copy of the state, context-parallel ranks included
    sharding: str = "full"  # full | hybrid | none
    fp8_recipe: str | None = None
    context_parallel: int = 1
    compile: bool = True
    fp8_all_gather: bool = True  # FSDP all-gathers float8 weights (tensorwise scaling only)
    # sdpa: this container's PyTorch SDPA (torch 2.11: cuDNN on Hopper and Blackwell, flash-attention 2 on Ampere);
    # sdpa-flash2: PyTorch SDPA before torch 2.11 (flash-attention 2 on Hopper); cudnn: Transformer Engine's
    # fused attention; flash2: the flash-attn 2 library
    attention_kernel: str = "sdpa"
    lora: Lora | None = None  # LoRA adapters on a frozen base
    document_mask: bool = False  # packed SFT examples: FlexAttention under a block mask
    repeat_kv: bool = False  # K/V heads repeated to the query heads before attention (torchtitan's Llama)
    rope: bool = True  # rotary positions on Q and K (False: positions inside the attention kernel, MPT's ALiBi)
    # the norms and activations run as one native kernel each (MPT's LayerNorm and GELU): eager moves the bytes
    # counted, where a Llama's RMSNorm, RoPE and SwiGLU run as chains of small kernels (eager_memory_factor)
    native_elementwise: bool = False
    # whose kernels cast to float8: torchao (this container) or te, Transformer Engine's fused casts (TE_CAST_BYTES)
    fp8_casts: str = "torchao"
    # the model code is this container's (training/models/decoder.py, training/components/loss.py): eager, its ops
    # move the bytes counted op by op (CONTAINER_*), not eager_memory_factor times the compiled count; its loss
    # chunks are checkpointed (CONTAINER_LOSS_BYTES, the head's GEMM again in backward). False: a published
    # framework's code (calibration.yaml's frameworks)
    container_code: bool = True


@dataclass(frozen=True)
class Parameters:
    """The model's free and fixed parameters (``catalog/performance.yaml``)."""

    gemm_efficiency: float  # large BF16 GEMMs, fraction of the BF16 peak
    fp8_gemm_efficiency: float  # large FP8 GEMMs, fraction of the FP8 peak
    gemm_overhead_seconds: float  # fixed cost of one GEMM (launch, tail, small-size inefficiency)
    fp8_cast_factor: float  # torchao's cast traffic, relative to the bytes counted
    fp8_eager_cast_factor: float  # torchao's eager casts, measured over the time counted (eager_fp8_casts)
    attention_efficiency: float  # flash attention, fraction of the BF16 peak
    # what the counted ring work leaves unexplained: each ring step past the first, as a share of the attention
    ring_step_overhead: float
    flash2_utilization_a100: float  # flash-attn 2's published peak utilisation of the BF16 peak, A100
    flash2_utilization_h100: float  # the same on H100 (and H200)
    eager_memory_factor: float  # bytes moved by eager elementwise ops, relative to compiled
    memory_efficiency: float  # fraction of HBM bandwidth that streaming kernels reach
    nvlink_efficiency: float  # NCCL bus bandwidth over NVLink, fraction of the link
    network_efficiency: float  # NCCL bus bandwidth over EFA, fraction of the link
    overlap: float  # fraction of compute time that FSDP prefetching can hide communication behind
    attention_half_length: float = (
        0.0  # query tokens per attention call at which it reaches half its long-sequence efficiency
    )
    fp8_recipe_efficiency: dict[str, float] = field(default_factory=dict)  # relative to tensorwise


@dataclass(frozen=True)
class Term:
    name: str
    seconds: float  # per optimiser step
    what: str


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimiser step, term by term, and the tokens each GPU processes in it."""

    gemm: float
    attention: float
    memory_bound: float
    recompute: float
    communication: float  # exposed
    optimizer: float
    communication_total: float  # before overlap
    tokens_per_gpu: float
    micro_batches: int
    # LoRA and QLoRA (0 without adapters): the adapters' GEMMs, their elementwise work, their dropout,
    # and the NF4 base's dequantisation; ``frozen``: the base runs no weight-gradient GEMM
    adapter_gemm: float = 0.0
    adapter_elementwise: float = 0.0
    adapter_dropout: float = 0.0
    dequantization: float = 0.0
    adapters: bool = False
    frozen: bool = False
    quantized: bool = False
    # context parallelism: the ring's merges and gradient accumulation (0 without it)
    ring: float = 0.0
    # this container's checkpointed loss chunks: the output head's GEMM and the loss's forward again in backward
    loss_recompute: float = 0.0
    # task dpo: the reference's forward per step, without gradient (planning/preference.py); 0 otherwise
    reference: float = 0.0
    reference_what: str = ""

    @property
    def seconds(self) -> float:
        return (
            self.gemm
            + self.attention
            + self.memory_bound
            + self.recompute
            + self.communication
            + self.optimizer
            + self.adapter_gemm
            + self.adapter_elementwise
            + self.adapter_dropout
            + self.dequantization
            + self.reference
            + self.ring
            + self.loss_recompute
        )

    @property
    def tokens_per_second_per_gpu(self) -> float:
        return self.tokens_per_gpu / self.seconds

    def terms(self) -> list[Term]:
        hidden = self.communication_total - self.communication
        if not self.adapters:
            gemms = "Linear layers and the output head, forward and backward, by shape"
        elif self.frozen:
            gemms = "frozen Linear layers and output head: forward and input-gradient GEMMs, no weight gradient"
        else:
            gemms = (
                "frozen Linear layers: forward and both backward GEMMs (eager FP8 computes the unused weight gradient)"
            )
        adapters = []
        if self.adapters:
            adapters = [
                Term(
                    "LoRA: adapter GEMMs",
                    self.adapter_gemm,
                    "lora_A and lora_B, forward and both backward GEMMs, at the roofline of FLOPs and bytes moved",
                ),
                Term(
                    "LoRA: adapter elementwise",
                    self.adapter_elementwise,
                    "the scaled add of lora_B's output, its scaled gradient, the input-gradient sum",
                ),
                Term("LoRA: adapter dropout", self.adapter_dropout, "each adapter's copy of its input and its mask"),
            ]
            if self.quantized:
                adapters.append(
                    Term(
                        "QLoRA: NF4 dequantisation",
                        self.dequantization,
                        "each projection's NF4 weight to bf16 when it runs, forward and backward (torchao linear_nf4)",
                    )
                )
        return [
            Term("compute: GEMMs", self.gemm, gemms),
            *adapters,
            Term("compute: attention", self.attention, "causal flash attention, forward and backward"),
            *(
                [
                    Term(
                        "compute: ring merge",
                        self.ring,
                        "context parallelism: each ring step's output merged by log-sum-exp, dQ/dK/dV summed, in fp32",
                    )
                ]
                if self.ring
                else []
            ),
            Term(
                "compute: memory-bound",
                self.memory_bound,
                "norms, RoPE, SwiGLU, residuals, loss (and FP8 casts): bytes over HBM bandwidth",
            ),
            Term("recomputation", self.recompute, "forward work that activation checkpointing repeats in backward"),
            *(
                [
                    Term(
                        "recomputation: loss chunks",
                        self.loss_recompute,
                        "each checkpointed loss chunk's output-head GEMM and loss forward, again in backward",
                    )
                ]
                if self.loss_recompute
                else []
            ),
            Term(
                "communication (exposed)",
                self.communication,
                f"of {self.communication_total:.3f} s in all; {max(0.0, hidden):.3f} s hidden behind compute",
            ),
            Term(
                "optimiser step",
                self.optimizer,
                "AdamW and gradient clipping over the "
                + ("adapters' sharded fp32 state" if self.adapters else "sharded fp32 state"),
            ),
            *([Term("DPO: reference forward", self.reference, self.reference_what)] if self.reference else []),
        ]


def _linears(arch: Architecture) -> list[tuple[int, int]]:
    """(K, N) of every Linear in one decoder layer."""
    return list(arch.projection_sizes().values())


@dataclass(frozen=True)
class _Counts:
    layer: int
    linear: int
    root: int
    total: int


@lru_cache(maxsize=64)
def _counts(arch: Architecture) -> _Counts:
    """Parameter counts the communication and optimiser terms need (computed once per model)."""
    return _Counts(arch.layer_parameters, sum(k * n for k, n in _linears(arch)), arch.root_parameters, arch.parameters)


@dataclass(frozen=True)
class LinearCost:
    """Time of one Linear layer (``M`` tokens, ``K`` in, ``N`` out): its three GEMMs and,
    in FP8, torchao's casts of input, weight and output gradient."""

    hw: Hardware
    precision: str
    fp8_recipe: str | None
    compile: bool
    params: Parameters
    casts: str = "torchao"  # or te: Transformer Engine's fused cast-transpose (TE_CAST_BYTES)

    def seconds(self, m: float, k: int, n: int, *, frozen: bool = False) -> tuple[float, float, float]:
        """(forward GEMM, the backward GEMMs, FP8 casts forward and backward). A ``frozen``
        weight has no weight-gradient GEMM: backward is the input gradient only."""
        p, hw = self.params, self.hw
        if self.precision == "fp8" and hw.peak_fp8_flops:
            peak = hw.peak_fp8_flops * hw.compute_factor * hw.matmul_fp8_fraction
            efficiency = p.fp8_gemm_efficiency * p.fp8_recipe_efficiency.get(self.fp8_recipe or "tensorwise", 1.0)
        else:
            peak = (
                hw.peak_bf16_flops
                * hw.compute_factor
                * hw.matmul_bf16_fraction
                / (2 if self.precision == "fp32" else 1)
            )
            efficiency = p.gemm_efficiency
        gemm = 2 * m * k * n / (peak * efficiency) + p.gemm_overhead_seconds
        casts = 0.0
        if self.precision == "fp8" and self.casts == "te":
            # input, weight and output gradient, each cast once into both layouts (a frozen weight: no
            # weight-gradient GEMM, the output gradient in one layout, the input's row layout kept from forward)
            per = TE_CAST_BYTES.get(self.fp8_recipe or "tensorwise", TE_CAST_BYTES["tensorwise"])
            casts = per * (m * k + k * n + m * n) / (hw.hbm_bytes_per_s * p.memory_efficiency)
        elif self.precision == "fp8" and self.compile:
            # An amax pass and a cast per tensor (about 3 bytes read, 1 written per element),
            # and the transposed copies backward needs: input, weight, output gradient. A frozen
            # weight's layer casts neither operand of the weight-gradient GEMM (compiled, it is dropped).
            moved = (4 * m * k + 3 * m * n if frozen else 8 * m * k + 5 * m * n) + 7 * k * n
            casts = p.fp8_cast_factor * moved / (hw.hbm_bytes_per_s * p.memory_efficiency)
        elif self.precision == "fp8":
            casts = p.fp8_eager_cast_factor * eager_fp8_casts(m, k, n, hw.hbm_bytes_per_s * p.memory_efficiency)
        return gemm, (1 if frozen else 2) * gemm, casts


def eager_fp8_casts(m: float, k: int, n: int, bandwidth: float) -> float:
    """Seconds of torchao's float8 casts of one Linear without torch.compile, forward and
    backward (torchao/float8/float8_linear.py, ``matmul_with_hp_or_float8_args``): forward
    casts the input and the weight; backward casts the output gradient twice (for the input
    gradient and for the weight gradient), the weight and the input again, each at
    ``EAGER_CAST_BYTES`` per element. ``preprocess_addmm`` (float8_ops.py) copies the
    operands that ``torch._scaled_mm`` needs in the other layout: the weight, and the
    output gradient and input of the weight-gradient GEMM (one byte read and one written
    per element). Every kernel also pays ``KERNEL_SECONDS``."""
    elements = m * k + k * n + m * n
    moved = 2 * EAGER_CAST_BYTES * elements + 2 * elements
    kernels = 6 * EAGER_CAST_KERNELS + 3
    return moved / bandwidth + kernels * KERNEL_SECONDS


@dataclass(frozen=True)
class AdapterCost:
    """Seconds of one decoder layer's adapters (and, under QLoRA, its NF4 dequantisation) per micro-batch."""

    gemm_fwd: float = 0.0
    gemm_bwd: float = 0.0
    elementwise_fwd: float = 0.0
    elementwise_bwd: float = 0.0
    dropout_fwd: float = 0.0
    dropout_bwd: float = 0.0
    dequant_fwd: float = 0.0
    dequant_bwd: float = 0.0


def thin_gemm_seconds(m: float, k: float, n: float, e: int, rate: float, bandwidth: float, overhead: float) -> float:
    """One GEMM (``M x K`` by ``K x N``) at the roofline: its FLOPs at ``rate`` or the bytes it reads and
    writes (both operands and the output, ``e`` bytes each) at ``bandwidth``, whichever is longer, plus
    the fixed cost. An adapter's GEMMs have one side of ``rank`` elements: the bytes bound them."""
    return max(2 * m * k * n / rate, e * (m * k + k * n + m * n) / bandwidth) + overhead


def adapter_seconds(
    arch: Architecture, hw: Hardware, setting: Setting, tokens: float, params: Parameters
) -> AdapterCost:
    """One layer's adapters on ``tokens`` tokens, per micro-batch (see the module docstring): for each
    target projection (``K`` in, ``N`` out, rank ``r``), forward ``x @ A`` (M x K x r) and ``h @ B``
    (M x r x N); backward ``g @ B`` and ``g^T h`` for lora_B, ``dh @ A`` and ``dh^T x`` for lora_A, in the high
    precision. Under QLoRA, each projection's NF4 weight dequantised forward and backward."""
    lora = setting.lora
    if lora is None:
        return AdapterCost()
    e = 4 if setting.precision == "fp32" else 2
    rate = hw.peak_bf16_flops * hw.compute_factor * hw.matmul_bf16_fraction * params.gemm_efficiency
    rate /= 2 if setting.precision == "fp32" else 1
    bw = hw.hbm_bytes_per_s * params.memory_efficiency
    fixed = params.gemm_overhead_seconds
    m, r = tokens, lora.rank
    (in_fwd, out_fwd), (in_bwd, out_bwd) = ADAPTER_ELEMENTWISE[setting.compile]
    gemm_fwd = gemm_bwd = elem_fwd = elem_bwd = dropout = dequant = 0.0
    for name in lora.targets:
        k, n = arch.projection_sizes()[name]
        gemm_fwd += thin_gemm_seconds(m, k, r, e, rate, bw, fixed) + thin_gemm_seconds(m, r, n, e, rate, bw, fixed)
        gemm_bwd += (
            thin_gemm_seconds(m, n, r, e, rate, bw, fixed)  # lora_B input gradient
            + thin_gemm_seconds(n, m, r, e, rate, bw, fixed)  # lora_B weight gradient
            + thin_gemm_seconds(m, r, k, e, rate, bw, fixed)  # lora_A input gradient
            + thin_gemm_seconds(r, m, k, e, rate, bw, fixed)  # lora_A weight gradient
        )
        elem_fwd += e * m * (in_fwd * k + out_fwd * n) / bw
        elem_bwd += e * m * (in_bwd * k + out_bwd * n) / bw
        if lora.dropout:  # forward: read x, write its copy and a one-byte mask; backward: read both, write
            dropout += (2 * e + 1) * m * k / bw + KERNEL_SECONDS
        if lora.quantized:
            dequant += NF4_DEQUANT_BYTES * k * n / bw + NF4_DEQUANT_KERNELS * KERNEL_SECONDS
    return AdapterCost(gemm_fwd, gemm_bwd, elem_fwd, elem_bwd, dropout, dropout, dequant, dequant)


def attention_efficiency(hw: Hardware, setting: Setting, params: Parameters) -> float:
    """Fraction of the BF16 peak that attention reaches. ``attention_efficiency`` is
    flash-attention 2's on Hopper, fitted. The same kernel (the flash-attn 2 library, or
    PyTorch SDPA's flash backend, which is its code) on Ampere: scaled by the library's
    published peak utilisation on A100 over H100's (it predates Hopper's asynchronous
    tensor cores). cuDNN's fused attention (this container's SDPA on torch 2.11,
    Transformer Engine's): ``CUDNN_OVER_FLASH2_HOPPER`` times it on Hopper; on Blackwell the
    same fraction of the peak (the B200 kernel benchmark behind ``attention_half_length``
    levels off there). This container's SDPA on Ampere runs flash-attention 2."""
    kernel = setting.attention_kernel
    if kernel not in ("sdpa", "sdpa-flash2", "cudnn", "flash2", "triton-flash"):
        raise ValueError(f"unknown attention kernel {kernel!r}")
    if kernel == "triton-flash":
        return attention_efficiency(hw, replace(setting, attention_kernel="flash2"), params) / FLASH2_OVER_TRITON
    ampere = hw.gpu.startswith("A100")
    if ampere:
        return params.attention_efficiency * params.flash2_utilization_a100 / params.flash2_utilization_h100
    hopper = hw.gpu.startswith(("H100", "H200"))
    if kernel in ("sdpa", "cudnn") and hopper:
        return params.attention_efficiency * CUDNN_OVER_FLASH2_HOPPER
    return params.attention_efficiency


def attention_length_factor(query_tokens: float, params: Parameters) -> float:
    """Share of its long-sequence efficiency that one attention call on ``query_tokens``
    query tokens reaches: ``L / (L + attention_half_length)``. Flash-attention kernels fill
    the GPU with blocks of queries per head and sequence; short calls leave more of each
    block, wave and pipeline idle (published kernel benchmarks rise with the length and
    level off past 8K: see ``catalog/performance.yaml``)."""
    return query_tokens / (query_tokens + params.attention_half_length)


def ring_cost(cp: int, params: Parameters) -> float:
    """Attention time of a context-parallel ring of degree ``cp``, relative to its kernels'
    counted time: ``1 + ring_step_overhead * (cp - 1)``. The fitted share is what the
    published ring runs take beyond the counted work (``ring_seconds``, the exposed K/V
    exchange); without ring runs in a fit it is 0."""
    return 1.0 + params.ring_step_overhead * (cp - 1)


def ring_seconds(arch: Architecture, setting: Setting, tokens: float, bandwidth: float) -> tuple[float, float]:
    """One layer's ring-attention work besides the attention kernels, forward and backward, on a
    context-parallel rank's ``tokens`` (the ``RING_*`` counts, at HBM ``bandwidth``, and their kernels)."""
    cp = setting.context_parallel
    if cp <= 1:
        return 0.0, 0.0
    out = tokens * arch.q_size  # elements of the rank's attention output
    kv = tokens * (arch.q_size if setting.repeat_kv else arch.kv_size)  # of its K (and of its V)
    steps = cp - 1
    fwd = (RING_MERGE_ONCE_BYTES + steps * RING_MERGE_STEP_BYTES) * out / bandwidth
    bwd = steps * (RING_GRAD_Q_BYTES * out + RING_GRAD_KV_BYTES * kv) / bandwidth
    return fwd + steps * RING_STEP_KERNELS[0] * KERNEL_SECONDS, bwd + steps * RING_STEP_KERNELS[1] * KERNEL_SECONDS


def container_eager(arch: Architecture, setting: Setting) -> tuple[tuple[float, float], tuple[int, int]]:
    """This container's decoder layer run eagerly, per token: bytes moved by its memory-bound ops, forward and
    backward, in BF16 activations, and their kernels per layer (``CONTAINER_*``)."""
    h, q, kv, f = arch.hidden_size, arch.q_size, arch.kv_size, arch.ffn_size
    rope = (q + kv) if setting.rope else 0
    widths = [
        (CONTAINER_NORM, 2 * h, 2),  # input_layernorm, post_attention_layernorm
        (CONTAINER_ROPE, rope, 2 if setting.rope else 0),  # Q and K
        (CONTAINER_SWIGLU, f, 1),
        (CONTAINER_RESIDUAL, h, 1),
        (CONTAINER_LAYOUT, q, 1),
    ]
    if arch.qk_norm:  # Qwen3's RMSNorm over each head of Q and K
        widths.append((CONTAINER_NORM, q + kv, 2))
    fwd = sum(op[0][0] * width for op, width, _ in widths)
    bwd = sum(op[0][1] * width for op, width, _ in widths)
    kernels = (sum(op[1][0] * n for op, _, n in widths), sum(op[1][1] * n for op, _, n in widths))
    return (fwd, bwd), kernels


def _collective_seconds(bytes_: float, ranks: int, bandwidth: float) -> float:
    """Ring all-gather or reduce-scatter: each rank moves (n-1)/n of the full buffer."""
    if ranks <= 1:
        return 0.0
    return bytes_ * (ranks - 1) / ranks / bandwidth


def step_time(
    arch: Architecture,
    hw: Hardware,
    setting: Setting,
    *,
    sequence_length: int,
    gpus: int,
    accum: int,
    params: Parameters,
) -> StepTime:
    """Predicted time of one optimiser step of ``accum`` micro-batches on each of ``gpus`` GPUs."""
    cp = setting.context_parallel
    tokens = setting.micro_batch * sequence_length / cp  # per GPU and micro-batch
    e = 4 if setting.precision == "fp32" else 2  # bytes per activation element
    peak_bf16 = hw.peak_bf16_flops * hw.compute_factor
    mem_bw = hw.hbm_bytes_per_s * params.memory_efficiency
    eager = 1.0 if setting.compile or setting.native_elementwise else params.eager_memory_factor
    counted_eager = not setting.compile and not setting.native_elementwise and setting.container_code

    # -- GEMMs --------------------------------------------------------------------------
    lora = setting.lora
    # A frozen base runs no weight-gradient GEMM, except eager FP8: torchao's backward computes it anyway.
    frozen = lora is not None and (setting.compile or setting.precision != "fp8")
    linear = LinearCost(hw, setting.precision, setting.fp8_recipe, setting.compile, params, setting.fp8_casts)
    layer = [linear.seconds(tokens, k, n, frozen=frozen) for k, n in _linears(arch)]
    high = LinearCost(hw, "fp32" if setting.precision == "fp32" else "bf16", None, setting.compile, params)
    adapter = adapter_seconds(arch, hw, setting, tokens, params)
    layer_gemm_fwd = sum(fwd for fwd, _, _ in layer)
    head_fwd, head_bwd, _ = high.seconds(
        tokens, arch.hidden_size, arch.vocab_size, frozen=lora is not None
    )  # lm_head stays high precision
    gemm = arch.layers * sum(fwd + bwd for fwd, bwd, _ in layer) + head_fwd + head_bwd

    # -- attention (causal, flash): forward 2*s^2*h per sequence, backward 2.5x ----------
    # Context parallelism runs attention as ``cp`` block calls per layer, one per ring step.
    # Head-tail load balancing gives every rank 1/cp of the causal work, and every step the
    # same share of it: the first the causal block of the rank's own two chunks, each later
    # one all of the rank's queries on the head half of a K/V block, or the tail half of its
    # queries on a whole block. Each call pays the fixed kernel time, and its queries (half
    # the rank's chunk on average) set how close the kernel comes to its efficiency. What the
    # ring adds besides its kernels is counted in ``ring_seconds`` and ``_communication``;
    # what the published ring runs take beyond that count is a fitted share per step (``ring_cost``).
    attn_fwd_flops = 2 * setting.micro_batch * sequence_length**2 * arch.q_size / cp
    query_tokens = sequence_length / cp if cp == 1 else sequence_length / cp / 2
    attn_rate = (
        peak_bf16
        * attention_efficiency(hw, setting, params)
        * attention_length_factor(query_tokens, params)
        / ring_cost(cp, params)
    )
    # packed examples: FlexAttention, at most the causal blocks (see the module docstring)
    fwd_share, bwd_share = (FLEX_FORWARD_SHARE, FLEX_BACKWARD_SHARE) if setting.document_mask else (1.0, 1.0)
    attn_fwd = attn_fwd_flops / (attn_rate * fwd_share) + cp * params.gemm_overhead_seconds
    attn_bwd = 2.5 * attn_fwd_flops / (attn_rate * bwd_share) + cp * params.gemm_overhead_seconds
    attention = arch.layers * (attn_fwd + attn_bwd)

    # -- memory-bound work ---------------------------------------------------------------
    h, kv, f = arch.hidden_size, arch.kv_size, arch.ffn_size
    # Per token and layer, forward: two RMSNorms (read and write h), RoPE on Q and K,
    # SiLU(gate) * up (read 2f, write f), two residual adds (read 2h, write h), the
    # attention output's layout copy (q wide); Qwen3's q/k norms read and write Q and K. Backward moves about
    # twice as much.
    q = arch.q_size
    qk_norms = 2 * (q + kv) if arch.qk_norm else 0
    rope = 2 * (q + kv) if setting.rope else 0
    layer_fwd_bytes = e * (4 * h + rope + 3 * f + 6 * h + 2 * q + qk_norms) * eager
    layer_bwd_bytes = 2 * layer_fwd_bytes
    kernels = (0, 0)
    if counted_eager:  # this container's decoder, eager: op by op (CONTAINER_*)
        (layer_fwd_bytes, layer_bwd_bytes), kernels = container_eager(arch, setting)
        layer_fwd_bytes *= e / 2
        layer_bwd_bytes *= e / 2
    casts = sum(cast for _, _, cast in layer)  # FP8 casts, forward and backward
    layer_fwd_mem = layer_fwd_bytes * tokens / mem_bw + casts / 3 + kernels[0] * KERNEL_SECONDS
    layer_bwd_mem = layer_bwd_bytes * tokens / mem_bw + 2 * casts / 3 + kernels[1] * KERNEL_SECONDS
    if setting.container_code:  # checkpointed chunks: the head's GEMM and the loss forward again in backward
        loss_mem = sum(CONTAINER_LOSS_BYTES) * arch.vocab_size * tokens / mem_bw
        loss_recompute = head_fwd + CONTAINER_LOSS_BYTES[0] * arch.vocab_size * tokens / mem_bw
    else:
        loss_mem = LOSS_BYTES_PER_LOGIT * arch.vocab_size * tokens / mem_bw
        loss_recompute = 0.0
    memory_bound = arch.layers * (layer_fwd_mem + layer_bwd_mem) + loss_mem
    # context parallelism: the ring's merges (forward) and fp32 accumulations (backward)
    ring_fwd, ring_bwd = ring_seconds(arch, setting, tokens, mem_bw)
    ring = arch.layers * (ring_fwd + ring_bwd)

    # -- the adapters (LoRA) and the NF4 base's dequantisation (QLoRA) ------------------------
    adapter_gemm = arch.layers * (adapter.gemm_fwd + adapter.gemm_bwd)
    adapter_elementwise = arch.layers * (adapter.elementwise_fwd + adapter.elementwise_bwd)
    adapter_dropout = arch.layers * (adapter.dropout_fwd + adapter.dropout_bwd)
    dequantization = arch.layers * (adapter.dequant_fwd + adapter.dequant_bwd)
    adapter_fwd = adapter.elementwise_fwd + adapter.dropout_fwd  # the adapters' forward besides GEMMs

    # -- recomputation ---------------------------------------------------------------------
    if setting.checkpointing == "full":
        recompute = arch.layers * (
            layer_gemm_fwd + attn_fwd + ring_fwd + layer_fwd_mem
            + adapter.gemm_fwd + adapter_fwd + adapter.dequant_fwd
        )  # fmt: skip
    elif setting.checkpointing == "selective":
        recompute = arch.layers * (
            SELECTIVE_RECOMPUTED_MATMULS * (layer_gemm_fwd + adapter.gemm_fwd + adapter.dequant_fwd)
            + layer_fwd_mem
            + adapter_fwd
        )
    else:
        recompute = 0.0

    compute = gemm + attention + memory_bound + recompute + adapter_gemm + adapter_elementwise + adapter_dropout
    compute += dequantization + ring + loss_recompute

    # -- communication -------------------------------------------------------------------
    comm, first_unit, cp_exposed = _communication(
        arch, hw, setting, gpus=gpus, params=params, attn_fwd=attn_fwd, tokens=tokens, e=e
    )
    exposed = max(0.0, comm - params.overlap * compute) + first_unit + cp_exposed
    # Replicas all-reduce once per step, in the last micro-batch's backward (parallel.sync_replicas).
    replicate = _replicate_all_reduce(arch, hw, setting, gpus=gpus, params=params)
    last = max(0.0, comm + replicate - params.overlap * compute) + first_unit + cp_exposed

    # -- optimiser step, once per step -------------------------------------------------------
    group = 1 if setting.sharding == "none" else setting.shard_group
    trained = _counts(arch).total if lora is None else lora.parameters(arch)
    optimizer = OPTIMIZER_BYTES_PER_ELEMENT * trained / group / mem_bw

    return StepTime(
        gemm=accum * gemm,
        attention=accum * attention,
        memory_bound=accum * memory_bound,
        recompute=accum * recompute,
        communication=(accum - 1) * exposed + last,
        optimizer=optimizer,
        communication_total=accum * (comm + first_unit + cp_exposed) + replicate,
        tokens_per_gpu=accum * tokens,
        micro_batches=accum,
        adapter_gemm=accum * adapter_gemm,
        adapter_elementwise=accum * adapter_elementwise,
        adapter_dropout=accum * adapter_dropout,
        dequantization=accum * dequantization,
        ring=accum * ring,
        loss_recompute=accum * loss_recompute,
        adapters=lora is not None,
        frozen=frozen,
        quantized=lora is not None and lora.quantized,
    )


def _communication(
    arch: Architecture,
    hw: Hardware,
    setting: Setting,
    *,
    gpus: int,
    params: Parameters,
    attn_fwd: float,
    tokens: float,
    e: int,
) -> tuple[float, float, float]:
    """FSDP (and context-parallel) communication per micro-batch and GPU:
    (overlappable seconds, the first unit's all-gather that nothing hides, exposed ring seconds)."""
    nvlink = hw.nvlink_bytes_per_s * params.nvlink_efficiency
    network = hw.network_bytes_per_s * params.network_efficiency

    def bandwidth(ranks: int) -> float:
        """Bus bandwidth per GPU of a ring over ``ranks`` GPUs. A ring that leaves the node
        runs one channel per GPU and NIC: each crosses the network once per node, so the
        node's EFA bandwidth is shared by its channels, not divided by its GPUs."""
        return nvlink if ranks <= hw.gpus_per_node else min(nvlink, network)

    group = 1 if setting.sharding == "none" else setting.shard_group
    param_bytes = 4 if setting.precision == "fp32" else 2
    counts = _counts(arch)
    layer_params, linear_params = counts.layer, counts.linear
    lora = setting.lora
    if lora is not None and lora.quantized:  # QLoRA: the adapted projections gathered in NF4
        gathered = frozen_layer_bytes(arch, setting.precision, quantized=lora.targets)
    elif setting.precision == "fp8" and setting.fp8_recipe == "tensorwise" and setting.fp8_all_gather and group > 1:
        gathered = linear_params * 1 + (layer_params - linear_params) * param_bytes  # float8 all-gather
    else:
        gathered = layer_params * param_bytes
    bw = bandwidth(group)
    adapters = lora.layer_elements(arch) if lora is not None else 0
    layer_ag = _collective_seconds(gathered + adapters * param_bytes, group, bw)
    # fp32 gradient reduction: every parameter's, or under LoRA the adapters' only
    layer_rs = _collective_seconds((layer_params if lora is None else adapters) * 4, group, bw)
    root_ag = _collective_seconds(counts.root * param_bytes, group, bw)
    root_rs = _collective_seconds(counts.root * 4, group, bw) if lora is None else 0.0
    # Forward gathers every layer; backward gathers them again (all but the last layer
    # were resharded) and reduce-scatters every gradient.
    fsdp = (2 * arch.layers - 1) * layer_ag + arch.layers * layer_rs + root_ag + root_rs

    ring = 0.0
    cp = setting.context_parallel
    if cp > 1:
        # PyTorch's ring all-gathers the other ranks' K and V (its default rotation), behind the
        # first step's attention, 1/cp of the rank's; backward gathers them again behind the first
        # step's backward, and passes the fp32 dK and dV around the ring, each behind one step's.
        width = arch.q_size if setting.repeat_kv else arch.kv_size
        kv_block = tokens * 2 * width * e
        step_fwd = attn_fwd / cp
        gather = kv_block * (cp - 1) / bandwidth(cp)
        grads = kv_block * 4 / e / bandwidth(cp)
        ring = arch.layers * (
            max(0.0, gather - step_fwd)
            + max(0.0, gather - 2.5 * step_fwd)
            + (cp - 1) * max(0.0, grads - 2.5 * step_fwd)
        )
        if setting.checkpointing == "full":  # the recomputed forward gathers them once more
            ring += arch.layers * max(0.0, gather - step_fwd)
    return fsdp, layer_ag + root_ag, ring


def _replicate_all_reduce(
    arch: Architecture, hw: Hardware, setting: Setting, *, gpus: int, params: Parameters
) -> float:
    """Hybrid (or no) sharding: the all-reduce of each shard's fp32 gradient across replicas,
    once per optimiser step. Every GPU of a node runs its own all-reduce at once: they share
    the node's EFA."""
    group = 1 if setting.sharding == "none" else setting.shard_group
    replicas = gpus // group
    if replicas <= 1:
        return 0.0
    nodes = max(1, -(-gpus // hw.gpus_per_node))
    nvlink = hw.nvlink_bytes_per_s * params.nvlink_efficiency
    network = hw.network_bytes_per_s * params.network_efficiency
    trained = _counts(arch).total if setting.lora is None else setting.lora.parameters(arch)
    shard_bytes = trained * 4 / group
    if nodes > 1 and group >= hw.gpus_per_node:
        across = network / hw.gpus_per_node
    else:
        across = nvlink if gpus <= hw.gpus_per_node else min(nvlink, network)  # _communication's bandwidth(gpus)
    return 2 * _collective_seconds(shard_bytes, replicas, across)


def parameters_of(model: PerformanceModel) -> Parameters:
    """The :class:`Parameters` of a performance model (its fitted and fixed values)."""
    # YAML: floats by name, and fp8_recipe_efficiency's mapping among the fitted ones.
    fitted: dict[str, Any] = model.fitted
    fixed: dict[str, Any] = model.fixed
    return Parameters(**fitted, **fixed)


@lru_cache(maxsize=1)
def stored_parameters() -> Parameters:
    """The planner's parameters: the fitted and fixed values of ``catalog/performance.yaml``."""
    return parameters_of(performance_model())
