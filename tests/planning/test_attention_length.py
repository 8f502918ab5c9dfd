"""Attention efficiency by call length, from a published kernel benchmark."""

from __future__ import annotations

from dataclasses import replace

from tiered_training import catalog as catalogs
from tiered_training.planning import perf
from tiered_training.planning.perf import Hardware, Setting, step_time

# PyTorch SDPA forward on B200, head dim 128, 32 heads, batch 4, fp16, TFLOPS at 1K-8K tokens
# (https://github.com/facebookexperimental/triton/pull/1189), as catalog/performance.yaml cites it.
PUBLISHED = {1024: 457.0, 2048: 591.0, 4096: 658.0, 8192: 703.0}


def test_the_length_term_reproduces_the_published_kernel_curve():
    params = perf.stored_parameters()

    def seconds(n, level):  # the model's time for the benchmark's forward call
        flops = 4 * 4 * 32 * 128 * n**2  # two matmuls of 2*n*n*d FLOPs, batch 4, 32 heads
        return flops / (level * perf.attention_length_factor(n, params)) + params.gemm_overhead_seconds

    # One level for the whole curve (from its longest point): every point within 2%.
    flops_8k = 4 * 4 * 32 * 128 * 8192**2
    level = flops_8k / perf.attention_length_factor(8192, params) / (flops_8k / (PUBLISHED[8192] * 1e12) - params.gemm_overhead_seconds)
    for n, tflops in PUBLISHED.items():
        modelled = 4 * 4 * 32 * 128 * n**2 / seconds(n, level) / 1e12
        assert abs(modelled / tflops - 1) <= 0.02, (n, modelled, tflops)
    assert perf.attention_length_factor(131072, params) > 0.99  # long sequences reach the fitted efficiency


def test_short_calls_pay_more_attention_time_per_flop():
    params = perf.stored_parameters()
    arch = catalogs.models()["llama-3.1-8b"].architecture
    hw = Hardware.of(catalogs.instances()["ml.p6-b200.48xlarge"])
    setting = Setting(precision="bf16", checkpointing="full", micro_batch=1, shard_group=8)
    flat = replace(params, attention_half_length=0.0)

    def attention_per_flop(seq, p, cp=1):
        s = replace(setting, context_parallel=cp)
        t = step_time(arch, hw, s, sequence_length=seq, gpus=8, accum=1, params=p)
        return t.attention / (seq**2 / cp)

    # Short calls cost more per FLOP than long ones, beyond what the fixed kernel time
    # alone charges.
    flat_ratio = attention_per_flop(2048, flat) / attention_per_flop(32768, flat)
    ratio = attention_per_flop(2048, params) / attention_per_flop(32768, params)
    assert ratio / flat_ratio > 1.1
    # Context parallelism shortens each call to half the rank's chunk: at 128K and CP 8 the
    # calls are 8K long and pay that length's efficiency.
    with_term = attention_per_flop(131072, params, cp=8) / attention_per_flop(131072, flat, cp=8)
    assert abs(with_term - 1 / perf.attention_length_factor(8192, params)) < 0.02
