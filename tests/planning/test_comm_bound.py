"""A communication-bound step: Llama 3.1 8B on 8 ml.p4d.24xlarge nodes (64 A100s, 400 Gbit/s EFA each).

Every template and calibration row hides its communication behind compute; this one does not:
2,048-token sequences, one per GPU, no recomputation, the state sharded over all 64 GPUs. FSDP's
all-gathers and reduce-scatters cross EFA and take longer than the compute they overlap with.
"""

from __future__ import annotations

import dataclasses

import pytest

from tiered_training import catalog as catalogs
from tiered_training.planning import perf

SEQUENCE = 2048
GPUS = 64


@pytest.fixture(scope="module")
def model():
    arch = catalogs.models()["llama-3.1-8b"].architecture
    hw = perf.Hardware.of(catalogs.instances()["ml.p4d.24xlarge"])
    return arch, hw, perf.stored_parameters()


def step(model, setting, *, hw=None, gpus=GPUS, accum=1):
    arch, default_hw, params = model
    return perf.step_time(arch, hw or default_hw, setting, sequence_length=SEQUENCE, gpus=gpus, accum=accum, params=params)


def compute(t: perf.StepTime) -> float:
    return t.gemm + t.attention + t.memory_bound + t.recompute + t.ring + t.loss_recompute


FULL = perf.Setting(precision="bf16", checkpointing="none", micro_batch=1, shard_group=GPUS, sharding="full")
HYBRID = perf.Setting(precision="bf16", checkpointing="none", micro_batch=1, shard_group=8, sharding="hybrid")


def test_the_step_is_communication_bound(model):
    t = step(model, FULL)
    overlap = model[2].overlap
    assert 0 < overlap < 1
    # What prefetching cannot hide shows: at least the total less what overlaps with compute.
    assert t.communication >= t.communication_total - overlap * compute(t) - 1e-12
    assert t.communication > compute(t) > 0  # about 1.26 s exposed against 0.61 s of compute
    assert t.seconds == pytest.approx(compute(t) + t.communication + t.optimizer, rel=1e-12)
    assert t.tokens_per_second_per_gpu == pytest.approx(SEQUENCE / t.seconds, rel=1e-12)
    terms = {term.name: term.seconds for term in t.terms()}
    assert terms["communication (exposed)"] == t.communication
    assert sum(terms.values()) == pytest.approx(t.seconds, rel=1e-12)


def test_exposed_communication_scales_with_accumulation(model):
    one, four = step(model, FULL), step(model, FULL, accum=4)
    assert four.communication == pytest.approx(4 * one.communication, rel=1e-12)
    assert four.communication_total == pytest.approx(4 * one.communication_total, rel=1e-12)


def test_hybrid_replication_costs_its_ring_all_reduce(model):
    arch, hw, params = model
    # The same node-local shard group alone on one node, and replicated over 8 nodes: the
    # difference is the all-reduce of each GPU's fp32 gradient shard across the 8 replicas,
    # a ring reduce-scatter plus all-gather, 8 GPUs per node sharing the node's EFA.
    alone = step(model, HYBRID, gpus=8)
    replicated = step(model, HYBRID)
    replicas = GPUS // 8
    shard_bytes = arch.parameters * 4 / 8
    per_gpu = hw.network_bytes_per_s * params.network_efficiency / hw.gpus_per_node
    all_reduce = 2 * shard_bytes * (replicas - 1) / replicas / per_gpu
    assert replicated.communication_total - alone.communication_total == pytest.approx(all_reduce, rel=1e-9)
    assert all_reduce > 0.1  # seconds: a term that matters


def test_halving_efa_bandwidth_lowers_tokens_per_second(model):
    _, hw, _ = model
    slow = dataclasses.replace(hw, network_bytes_per_s=hw.network_bytes_per_s / 2)
    for setting in (FULL, HYBRID):
        fast_t, slow_t = step(model, setting), step(model, setting, hw=slow)
        assert slow_t.communication_total > 1.8 * fast_t.communication_total
        assert slow_t.tokens_per_second_per_gpu < 0.8 * fast_t.tokens_per_second_per_gpu, setting.sharding
    # Inside one node no collective crosses EFA: its bandwidth does not matter.
    node = dataclasses.replace(FULL, shard_group=8)
    assert step(model, node, gpus=8, hw=slow) == step(model, node, gpus=8)
