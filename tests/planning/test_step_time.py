"""The performance model term by term, against counts by hand (the formulas of
``tiered_training/planning/perf.py``'s docstring) on a small model and a made-up machine with round
numbers, so that each term shows alone: the GEMMs of each precision, the memory-bound bytes,
FSDP's collectives inside and across nodes, float8 all-gathers, hybrid replication, the
context-parallel ring, and the terms that ``explain`` prints.

The fitted parameters are replaced by round ones (no fixed GEMM cost, no overlap), so the
counts here do not move when ``make calibrate`` refits them.
"""

from __future__ import annotations

import dataclasses

import pytest

from tiered_training import catalog as catalogs
from tiered_training.contract.architecture import Architecture
from tiered_training.planning import perf

ARCH = Architecture(layers=4, hidden_size=256, attention_heads=8, kv_heads=2, ffn_size=688, vocab_size=512)
HW = perf.Hardware(gpu="H100", gpus_per_node=8, peak_bf16_flops=1e15, peak_fp8_flops=2e15, hbm_bytes_per_s=2e12,
                   nvlink_bytes_per_s=4e11, network_bytes_per_s=5e10)
SEQ = 1024


def params(**kw) -> perf.Parameters:
    round_ones = dict(gemm_efficiency=0.5, fp8_gemm_efficiency=0.25, gemm_overhead_seconds=0.0, fp8_cast_factor=1.0,
                      fp8_eager_cast_factor=3.0, attention_efficiency=0.4, attention_half_length=0.0,
                      ring_step_overhead=0.1, eager_memory_factor=2.0,
                      memory_efficiency=0.5, nvlink_efficiency=0.5, network_efficiency=0.8, overlap=0.0,
                      fp8_recipe_efficiency={"rowwise": 0.5})
    return dataclasses.replace(perf.stored_parameters(), **(round_ones | kw))


def step(setting, *, gpus=8, accum=1, p=None, hw=HW, arch=ARCH):
    return perf.step_time(arch, hw, setting, sequence_length=SEQ, gpus=gpus, accum=accum, params=p or params())


def setting(**kw):
    """A setting on flash-attention 2 (the fitted attention efficiency as it stands)."""
    base = {"precision": "bf16", "checkpointing": "none", "micro_batch": 2, "shard_group": 8,
            "attention_kernel": "sdpa-flash2"}
    return perf.Setting(**(base | kw))


H, KV, F, V, L = 256, 64, 688, 512, 4
LINEARS = [(H, H), (H, KV), (H, KV), (H, H), (H, F), (H, F), (F, H)]
LINEAR = sum(k * n for k, n in LINEARS)  # a layer's Linear weights


def collective(nbytes, ranks, bandwidth):
    """A ring all-gather or reduce-scatter: each rank moves (n - 1) / n of the buffer."""
    return nbytes * (ranks - 1) / ranks / bandwidth


# -- compute -------------------------------------------------------------------------------


@pytest.mark.parametrize("precision,layer_rate,head_rate", [
    ("bf16", 1e15 * 0.5, 1e15 * 0.5),
    ("fp32", 1e15 / 2 * 0.5, 1e15 / 2 * 0.5),  # TF32: half the BF16 peak, the head too
    ("fp8", 2e15 * 0.25, 1e15 * 0.5),  # the output head stays in BF16
])
def test_gemms_by_shape(precision, layer_rate, head_rate):
    t = 2 * SEQ
    got = step(setting(precision=precision, fp8_recipe="tensorwise" if precision == "fp8" else None))
    layer = sum(3 * 2 * t * k * n for k, n in LINEARS) / layer_rate  # forward and two backward GEMMs
    head = 3 * 2 * t * H * V / head_rate
    assert got.gemm == pytest.approx(L * layer + head, rel=1e-12)


def test_an_fp8_recipe_without_a_fitted_efficiency_runs_at_the_tensorwise_rate():
    t = 2 * SEQ
    head = 3 * 2 * t * H * V / (1e15 * 0.5)
    for recipe, share in (("rowwise", 0.5), ("tensorwise", 1.0), ("mxfp8", 1.0), (None, 1.0)):
        got = step(setting(precision="fp8", fp8_recipe=recipe))
        layer = sum(3 * 2 * t * k * n for k, n in LINEARS) / (2e15 * 0.25 * share)
        assert got.gemm == pytest.approx(L * layer + head, rel=1e-12), recipe


@pytest.mark.parametrize("precision,e", [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("compiled,eager", [(True, 1.0), (False, 2.0)])
def test_memory_bound_bytes(precision, e, compiled, eager):
    """A published framework's Llama: the compiled count, eager_memory_factor times it eager; its loss once."""
    t = 2 * SEQ
    bandwidth = 2e12 * 0.5
    per_token_forward = e * (4 * H + 2 * (H + KV) + 3 * F + 6 * H + 2 * H) * eager  # norms, RoPE, SwiGLU, residuals, copy
    loss = 24 * V * t / bandwidth
    got = step(setting(precision=precision, compile=compiled, container_code=False))
    assert got.memory_bound == pytest.approx(L * 3 * per_token_forward * t / bandwidth + loss, rel=1e-12)
    assert got.loss_recompute == 0


@pytest.mark.parametrize("eager_factor", [1.0, 3.0])
def test_this_containers_eager_decoder_moves_the_bytes_of_its_ops(eager_factor):
    """This container's decoder run eagerly: each op of its RMSNorm (fp32 upcast), rotate_half RoPE, SwiGLU, residual
    adds and attention layout copy reads and writes at HBM, one kernel each, whatever eager_memory_factor is; its
    checkpointed loss chunks move 14 bytes per logit forward, 14 again and 22 backward, and run the head's GEMM again."""
    t = 2 * SEQ
    bandwidth = 2e12 * 0.5
    forward = 2 * 36 * H + 20 * (H + KV) + 10 * F + 12 * H + 4 * H
    backward = 2 * 92 * H + 30 * (H + KV) + 18 * F + 12 * H + 4 * H
    kernels = (2 * 8 + 2 * 5 + 2 + 2 + 1, 2 * 14 + 2 * 9 + 3 + 2 + 1)
    loss = (14 + 14 + 22) * V * t / bandwidth
    p = params(eager_memory_factor=eager_factor)
    got = step(setting(compile=False), p=p)
    expected = L * ((forward + backward) * t / bandwidth + sum(kernels) * perf.KERNEL_SECONDS) + loss
    assert got.memory_bound == pytest.approx(expected, rel=1e-12)
    # selective checkpointing runs the forward's ops again
    selective = step(setting(compile=False, checkpointing="selective"), p=p)
    forward_ops = L * (forward * t / bandwidth + kernels[0] * perf.KERNEL_SECONDS)
    assert selective.recompute - forward_ops == pytest.approx(step(setting(checkpointing="selective"), p=p).recompute
                                                              - L * 2 * (4 * H + 2 * (H + KV) + 3 * F + 6 * H + 2 * H) * t / bandwidth, rel=1e-9)
    head_forward = perf.LinearCost(HW, "bf16", None, False, p).seconds(t, H, V)[0]
    assert got.loss_recompute == pytest.approx(head_forward + 14 * V * t / bandwidth, rel=1e-12)
    # compiled, the same loss; the layers' bytes are the fused count
    compiled = step(setting(), p=p)
    assert compiled.loss_recompute == got.loss_recompute
    assert "recomputation: loss chunks" in [term.name for term in got.terms()]


def test_full_recomputation_repeats_the_forward():
    base, full = step(setting()), step(setting(checkpointing="full"))
    t = 2 * SEQ
    forward_gemms = sum(2 * t * k * n for k, n in LINEARS) / (1e15 * 0.5)
    attention_forward = 2 * 2 * SEQ**2 * H / (1e15 * 0.4)
    forward_bytes = 2 * (4 * H + 2 * (H + KV) + 3 * F + 6 * H + 2 * H) * t / (2e12 * 0.5)
    assert base.recompute == 0
    assert full.recompute == pytest.approx(L * (forward_gemms + attention_forward + forward_bytes), rel=1e-12)
    assert full.seconds - base.seconds == pytest.approx(full.recompute, rel=1e-12)


# -- FSDP communication --------------------------------------------------------------------


def fsdp(param_bytes, gathered, group, bandwidth):
    """Forward gathers every layer, backward all but the last again and reduce-scatters each
    fp32 gradient; the root (embedding, final norm, head) once each way."""
    layer, root = ARCH.layer_parameters, ARCH.root_parameters
    ag, rs = collective(gathered, group, bandwidth), collective(layer * 4, group, bandwidth)
    return (2 * L - 1) * ag + L * rs + collective(root * param_bytes, group, bandwidth) + collective(root * 4, group, bandwidth)


def first_unit(param_bytes, gathered, group, bandwidth):
    return collective(gathered, group, bandwidth) + collective(ARCH.root_parameters * param_bytes, group, bandwidth)


NVLINK = 4e11 * 0.5
ACROSS = min(NVLINK, 5e10 * 0.8)


@pytest.mark.parametrize("precision,p_bytes", [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("group,bandwidth", [(2, NVLINK), (8, NVLINK), (16, ACROSS)])
def test_fsdp_collectives_inside_and_across_nodes(precision, p_bytes, group, bandwidth):
    got = step(setting(precision=precision, shard_group=group), gpus=group)
    gathered = ARCH.layer_parameters * p_bytes
    total = fsdp(p_bytes, gathered, group, bandwidth)
    first = first_unit(p_bytes, gathered, group, bandwidth)
    assert got.communication_total == pytest.approx(total + first, rel=1e-12)
    # No overlap: everything shows; the first unit's gather is never hidden.
    assert got.communication == pytest.approx(total + first, rel=1e-12)


@pytest.mark.parametrize("recipe,all_gather,group,float8", [
    ("tensorwise", True, 8, True), ("tensorwise", True, 2, True), ("tensorwise", False, 8, False),
    ("rowwise", True, 8, False), ("tensorwise", True, 1, False),
])
def test_float8_all_gather(recipe, all_gather, group, float8):
    """torchao's float8 all-gather (tensorwise scaling) moves one byte per Linear weight."""
    got = step(setting(precision="fp8", fp8_recipe=recipe, fp8_all_gather=all_gather, shard_group=group), gpus=group)
    layer = ARCH.layer_parameters
    gathered = LINEAR * 1 + (layer - LINEAR) * 2 if float8 else layer * 2
    expected = fsdp(2, gathered, group, NVLINK) + first_unit(2, gathered, group, NVLINK) if group > 1 else 0.0
    assert got.communication_total == pytest.approx(expected, rel=1e-12)


def test_a_bf16_run_never_gathers_in_float8():
    assert step(setting(fp8_recipe="tensorwise")).communication_total == step(setting()).communication_total


def test_overlap_hides_communication_behind_all_compute_recomputation_included():
    p = params(overlap=0.5)
    slow = dataclasses.replace(HW, nvlink_bytes_per_s=4e8)
    got = step(setting(checkpointing="full"), p=p, hw=slow)
    compute = got.gemm + got.attention + got.memory_bound + got.recompute + got.loss_recompute
    layer = ARCH.layer_parameters
    bw = 4e8 * 0.5
    total = fsdp(2, layer * 2, 8, bw)
    first = first_unit(2, layer * 2, 8, bw)
    assert total > 0.5 * compute
    assert got.communication == pytest.approx(total - 0.5 * compute + first, rel=1e-12)
    assert got.terms()[5].what == f"of {got.communication_total:.3f} s in all; {0.5 * compute:.3f} s hidden behind compute"


# -- replication ----------------------------------------------------------------------------


def test_no_sharding_all_reduces_the_whole_state_and_steps_it_all():
    got = step(setting(sharding="none", shard_group=1), gpus=8)
    total = ARCH.parameters
    assert got.communication_total == pytest.approx(2 * collective(total * 4, 8, NVLINK), rel=1e-12)
    assert got.optimizer == pytest.approx(40 * total / (2e12 * 0.5), rel=1e-12)
    sharded = step(setting(sharding="full", shard_group=8), gpus=8)
    assert sharded.optimizer == pytest.approx(got.optimizer / 8, rel=1e-12)


@pytest.mark.parametrize("group,gpus,across", [
    (8, 16, 5e10 * 0.8 / 8),  # a node per shard group: each GPU's all-reduce shares the node's EFA
    (4, 16, ACROSS),  # shard groups inside a node, replicas across nodes
    (2, 8, NVLINK),  # one node
])
def test_hybrid_replicas_all_reduce_once_per_step(group, gpus, across):
    one = step(setting(sharding="hybrid", shard_group=group), gpus=gpus)
    four = step(setting(sharding="hybrid", shard_group=group), gpus=gpus, accum=4)
    inside = NVLINK if group <= 8 else ACROSS
    per_micro_batch = fsdp(2, ARCH.layer_parameters * 2, group, inside) + first_unit(2, ARCH.layer_parameters * 2, group, inside)
    replicate = 2 * collective(ARCH.parameters * 4 / group, gpus // group, across)
    assert one.communication_total == pytest.approx(per_micro_batch + replicate, rel=1e-12)
    assert four.communication_total == pytest.approx(4 * per_micro_batch + replicate, rel=1e-12)
    assert four.communication == pytest.approx(4 * per_micro_batch + replicate, rel=1e-12)


# -- context parallelism ----------------------------------------------------------------------


def ring_exchange(cp, tokens, attn_fwd, bw, width=KV, full=False):
    """PyTorch's ring by hand: the other ranks' K/V all-gathered behind the first step's
    forward (1/cp of the attention) and again behind its backward, the fp32 dK/dV passed on
    behind each later step's backward; full checkpointing gathers once more."""
    block = tokens * 2 * width * 2  # K and V of the rank's tokens, BF16
    gather = block * (cp - 1) / bw
    step_fwd = attn_fwd / cp
    grads = block * 2 / bw  # the same elements in fp32
    per_layer = max(0.0, gather - step_fwd) + max(0.0, gather - 2.5 * step_fwd) + (cp - 1) * max(0.0, grads - 2.5 * step_fwd)
    return L * (per_layer + (max(0.0, gather - step_fwd) if full else 0.0))


def test_the_ring_passes_kv_blocks_and_shows_what_attention_cannot_hide():
    slow = dataclasses.replace(HW, nvlink_bytes_per_s=4e9)
    cp, micro_batch = 2, 1
    p = params()
    got = step(setting(context_parallel=cp, micro_batch=micro_batch, shard_group=2), gpus=2, hw=slow, accum=2, p=p)
    tokens = micro_batch * SEQ / cp
    bw = 4e9 * 0.5
    attn_fwd = 2 * micro_batch * SEQ**2 * H / cp / (1e15 * 0.4 / (1 + 0.1 * (cp - 1)))
    ring = ring_exchange(cp, tokens, attn_fwd, bw)
    assert ring > 0
    per_micro_batch = fsdp(2, ARCH.layer_parameters * 2, 2, bw) + first_unit(2, ARCH.layer_parameters * 2, 2, bw) + ring
    assert got.communication_total == pytest.approx(2 * per_micro_batch, rel=1e-12)
    assert got.communication == pytest.approx(2 * per_micro_batch, rel=1e-12)


def test_the_ring_of_four_moves_three_blocks():
    slow = dataclasses.replace(HW, nvlink_bytes_per_s=4e9)
    got = step(setting(context_parallel=4, micro_batch=1, shard_group=4), gpus=4, hw=slow)
    tokens, bw = SEQ / 4, 4e9 * 0.5
    attn_fwd = 2 * SEQ**2 * H / 4 / (1e15 * 0.4 / (1 + 0.1 * 3))
    ring = ring_exchange(4, tokens, attn_fwd, bw)
    fsdp_part = fsdp(2, ARCH.layer_parameters * 2, 4, bw) + first_unit(2, ARCH.layer_parameters * 2, 4, bw)
    assert got.communication_total == pytest.approx(fsdp_part + ring, rel=1e-12)
    # K/V repeated to the query heads before attention (torchtitan's Llama) move four times the bytes here
    wide = step(setting(context_parallel=4, micro_batch=1, shard_group=4, repeat_kv=True), gpus=4, hw=slow)
    assert wide.communication_total == pytest.approx(fsdp_part + ring_exchange(4, tokens, attn_fwd, bw, width=H), rel=1e-12)


def test_the_ring_merges_and_accumulates_in_fp32_at_hbm_bandwidth():
    """Each ring step past the first: the output merged by its log-sum-exp (34.5 bytes per element
    in fp32), dQ accumulated (20.5), dK and dV accumulated and concatenated (44 per K/V element);
    once per layer the output's upcast and downcast (12)."""
    bw = 2e12 * 0.5
    for cp, width, repeat in ((2, KV, False), (4, KV, False), (4, H, True)):
        tokens = SEQ / cp
        out, kv = tokens * H, tokens * width
        fwd = (12 + (cp - 1) * 34.5) * out / bw + (cp - 1) * 6 * perf.KERNEL_SECONDS
        bwd = (cp - 1) * (20.5 * out + 44 * kv) / bw + (cp - 1) * 7 * perf.KERNEL_SECONDS
        s = setting(context_parallel=cp, micro_batch=1, shard_group=cp, repeat_kv=repeat)
        got = step(s, gpus=cp)
        assert got.ring == pytest.approx(L * (fwd + bwd), rel=1e-12)
        assert "compute: ring merge" in [t.name for t in got.terms()]
    assert "compute: ring merge" not in [t.name for t in step(setting()).terms()]


# -- what explain prints -------------------------------------------------------------------


def test_the_terms_explain_prints():
    got = step(setting(checkpointing="full", shard_group=16), gpus=16, accum=2)
    names = [(t.name, t.what) for t in got.terms()]
    assert names[:5] + names[6:] == [
        ("compute: GEMMs", "Linear layers and the output head, forward and backward, by shape"),
        ("compute: attention", "causal flash attention, forward and backward"),
        ("compute: memory-bound", "norms, RoPE, SwiGLU, residuals, loss (and FP8 casts): bytes over HBM bandwidth"),
        ("recomputation", "forward work that activation checkpointing repeats in backward"),
        ("recomputation: loss chunks", "each checkpointed loss chunk's output-head GEMM and loss forward, again in backward"),
        ("optimiser step", "AdamW and gradient clipping over the sharded fp32 state"),
    ]
    assert names[5][0] == "communication (exposed)"
    assert [t.seconds for t in got.terms()] == [got.gemm, got.attention, got.memory_bound, got.recompute, got.loss_recompute,
                                                 got.communication, got.optimizer]
    assert sum(t.seconds for t in got.terms()) == pytest.approx(got.seconds)
    assert got.micro_batches == 2 and got.tokens_per_gpu == 2 * 2 * SEQ


def test_hardware_from_the_catalogue():
    instance = catalogs.instances()["ml.p5.48xlarge"]
    hw = perf.Hardware.of(instance)
    assert hw.gpu == instance.gpu == "H100"
    assert hw.gpus_per_node == instance.gpus
    assert hw.peak_bf16_flops == instance.peak_bf16_tflops * 10**12
    assert hw.peak_fp8_flops == instance.peak_fp8_tflops * 10**12
    assert hw.hbm_bytes_per_s == instance.hbm_tbps * 10**12
    assert hw.nvlink_bytes_per_s == instance.nvlink_gbytes_per_s * 10**9
    assert hw.network_bytes_per_s == instance.efa_gbps * 10**9 / 8  # Gbit/s to bytes/s


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_each_attention_call_pays_the_fixed_kernel_time(cp):
    """Context parallelism runs attention as cp block calls per layer, each with the fixed cost."""
    overhead = 1e-5
    got = step(setting(context_parallel=cp, micro_batch=1, shard_group=cp), gpus=cp, p=params(gemm_overhead_seconds=overhead))
    flops = 2 * SEQ**2 * H / cp
    rate = 1e15 * 0.4 / (1 + 0.1 * (cp - 1))
    assert got.attention == pytest.approx(L * (3.5 * flops / rate + 2 * cp * overhead), rel=1e-12)


def test_an_unknown_attention_kernel_is_named():
    with pytest.raises(ValueError, match="unknown attention kernel 'xformers'"):
        step(setting(attention_kernel="xformers"))


def test_fp8_casts_are_bytes_over_hbm():
    """torchao's compiled casts per Linear (M tokens, K in, N out): amax and cast of the input
    (8MK), the output gradient (5MN) and the weight with its transposed copy (7KN)."""
    t = 2 * SEQ
    bandwidth = 2e12 * 0.5
    fp8 = step(setting(precision="fp8", fp8_recipe="tensorwise"))
    bf16 = step(setting())
    casts = sum(8 * t * k + 5 * t * n + 7 * k * n for k, n in LINEARS) / bandwidth  # fp8_cast_factor 1
    assert fp8.memory_bound - bf16.memory_bound == pytest.approx(L * casts, rel=1e-9)
    doubled = step(setting(precision="fp8", fp8_recipe="tensorwise"), p=params(fp8_cast_factor=2.0))
    assert doubled.memory_bound - bf16.memory_bound == pytest.approx(2 * L * casts, rel=1e-9)


@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_eager_fp8_casts_are_torchaos_kernels_counted(factor):
    """Without torch.compile each of the six casts per Linear (input, weight, output gradient
    forward and backward) runs abs, max, upcast, scale, clamp and cast: 33 bytes per element;
    three operand copies move 2 bytes per element; 63 kernels pay 4 us each. The fitted factor
    scales the count; fp8_cast_factor (compiled) plays no part."""
    t = 2 * SEQ
    bandwidth = 2e12 * 0.5
    p = params(fp8_eager_cast_factor=factor, fp8_cast_factor=7.0)
    fp8 = step(setting(precision="fp8", fp8_recipe="tensorwise", compile=False), p=p)
    bf16 = step(setting(compile=False), p=p)
    per_linear = [68 * (t * k + k * n + t * n) / bandwidth + 63 * 4e-6 for k, n in LINEARS]
    assert fp8.memory_bound - bf16.memory_bound == pytest.approx(L * factor * sum(per_linear), rel=1e-9)


def test_this_containers_sdpa_runs_cudnn_attention_on_hopper():
    """torch 2.11's SDPA picks cuDNN on H100 and H200: attention at 631/329.5 of flash-attention
    2's rate; on A100 it is flash-attention 2, as is SDPA before torch 2.11 anywhere, at the
    library's published utilisation on A100 over H100's."""
    flash2, cudnn = step(setting()), step(setting(attention_kernel="sdpa"))
    assert flash2.attention / cudnn.attention == pytest.approx(631.3 / 329.5, rel=1e-12)  # params: no fixed kernel time
    assert step(setting(attention_kernel="cudnn")).attention == cudnn.attention  # Transformer Engine's
    a100 = dataclasses.replace(HW, gpu="A100-80GB")
    assert step(setting(attention_kernel="sdpa"), hw=a100).attention == step(setting(), hw=a100).attention
    assert flash2.attention / step(setting(attention_kernel="flash2"), hw=a100).attention == pytest.approx(0.73 / 0.35)


def test_a_recipe_left_unnamed_is_tensorwise():
    p = params(fp8_recipe_efficiency={"tensorwise": 0.5})
    assert step(setting(precision="fp8", fp8_recipe=None), p=p).gemm == step(setting(precision="fp8", fp8_recipe="tensorwise"), p=p).gemm
    assert step(setting(precision="fp8", fp8_recipe=None), p=p).gemm > step(setting(precision="fp8", fp8_recipe="rowwise"), p=p).gemm


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_the_ring_merge_is_its_own_term_and_full_recomputation_runs_it_again(cp, checkpointing):
    """The ring's merges and accumulations are the ring term, not the per-token memory-bound
    work (which is per token alike with and without context parallelism); full recomputation
    runs the forward's merges again."""
    bandwidth = 2e12 * 0.5
    got = step(setting(context_parallel=cp, micro_batch=1, shard_group=cp, checkpointing=checkpointing), gpus=cp)
    whole = step(setting(micro_batch=1, shard_group=cp, checkpointing=checkpointing), gpus=cp)
    tokens = SEQ / cp
    merge = (12 + (cp - 1) * 34.5) * tokens * H / bandwidth + (cp - 1) * 6 * perf.KERNEL_SECONDS
    per_token_forward = 2 * (4 * H + 2 * (H + KV) + 3 * F + 6 * H + 2 * H)
    loss = 14 + 14 + 22  # this container's checkpointed loss chunks, bytes per logit
    streamed = L * 3 * per_token_forward * tokens / bandwidth + loss * V * tokens / bandwidth
    assert got.memory_bound == pytest.approx(streamed, rel=1e-12)
    assert whole.memory_bound == pytest.approx(L * 3 * per_token_forward * SEQ / bandwidth + loss * V * SEQ / bandwidth, rel=1e-12)
    assert whole.ring == 0 and got.ring > L * merge
    if checkpointing == "full":
        gemms = sum(2 * tokens * k * n for k, n in LINEARS) / (1e15 * 0.5)
        attention = 2 * SEQ**2 * H / cp / (1e15 * 0.4 / (1 + 0.1 * (cp - 1)))
        assert got.recompute == pytest.approx(L * (gemms + attention + merge + per_token_forward * tokens / bandwidth), rel=1e-12)


def test_native_elementwise_kernels_move_the_bytes_counted_eager_and_alibi_has_no_rope():
    """MPT (llm-foundry): LayerNorm and GELU are one native kernel each, so eager moves what the
    compiled count says, not eager_memory_factor times it; ALiBi lives in the attention kernel,
    so no RoPE pass over Q and K (2 * (q + kv) elements read and written, forward, twice backward)."""
    bandwidth = 2e12 * 0.5
    compiled = step(setting(micro_batch=1))
    eager = step(setting(micro_batch=1, compile=False))
    native = step(setting(micro_batch=1, compile=False, native_elementwise=True))
    assert eager.memory_bound > compiled.memory_bound
    assert native.memory_bound == pytest.approx(compiled.memory_bound, rel=1e-12)
    no_rope = step(setting(micro_batch=1, rope=False))
    rope_bytes = L * 3 * 2 * 2 * (H + KV) * SEQ / bandwidth
    assert compiled.memory_bound - no_rope.memory_bound == pytest.approx(rope_bytes, rel=1e-12)


@pytest.mark.parametrize("recipe,per_element", [("tensorwise", 6), ("mxfp8", 4)])
def test_transformer_engine_casts_each_operand_once_into_both_layouts(recipe, per_element):
    """Transformer Engine (Megatron's FP8): an amax pass where the recipe needs one (read 2 bytes)
    and one cast-transpose (read 2, write 1 + 1) per operand, at HBM bandwidth, whatever
    torchao's fitted cast factor is."""
    m, k, n = 8192, 256, 688
    for factor in (1.0, 3.0):
        p = params(fp8_cast_factor=factor)
        te = perf.LinearCost(HW, "fp8", recipe, True, p, "te")
        _, _, casts = te.seconds(m, k, n)
        assert casts == pytest.approx(per_element * (m * k + k * n + m * n) / (2e12 * 0.5), rel=1e-12)
    torchao = perf.LinearCost(HW, "fp8", recipe, True, params(fp8_cast_factor=3.0))
    assert torchao.seconds(m, k, n)[2] > casts
