"""The performance model and its calibration on published runs."""

from __future__ import annotations

import json

import pytest

from tiered_training import catalog as catalogs
from tiered_training.planning import calibration, perf
from tiered_training.planning.perf import Hardware, LinearCost, Setting, step_time

ARCH_8B = catalogs.models()["llama-3.1-8b"].architecture
P5 = Hardware.of(catalogs.instances()["ml.p5.48xlarge"])
B200 = Hardware.of(catalogs.instances()["ml.p6-b200.48xlarge"])


def speed(setting: Setting, hw: Hardware = B200, arch=ARCH_8B, sequence_length: int = 8192, gpus: int = 8, accum: int = 8):
    return step_time(arch, hw, setting, sequence_length=sequence_length, gpus=gpus, accum=accum, params=perf.stored_parameters())


@pytest.fixture(scope="module")
def cal():
    return calibration.load()  # the published rows and the committed GPU-check rows (bench/gpu)


# -- calibration ------------------------------------------------------------------------


def test_calibration_set_is_published_and_complete(cal):
    published = [r for r in cal.rows if r.framework != "tiered-training"]
    assert len(published) >= 45
    # The space the planner serves: model sizes from 1B to 70B, several GPU kinds, long context with CP.
    sizes = {round(r.architecture.parameters / 1e9) for r in published}
    assert min(sizes) <= 2 and max(sizes) >= 64 and len(sizes) >= 6, sorted(sizes)
    kinds = {calibration.hardware(r, cal, catalogs.performance_model().calibration_only)[0].gpu.split("-")[0] for r in published}
    assert {"A100", "H100", "H200", "B200"} <= kinds, kinds
    assert any(r.context_parallel > 1 and r.sequence_length >= 131072 for r in published)
    assert min(r.sequence_length for r in published) <= 2048
    for row in published:
        assert row.source.url.startswith("https://") and row.source.title, row.id
    for row in cal.rows:
        assert row.date and row.framework in cal.frameworks, row.id
        calibration.hardware(row, cal, catalogs.performance_model().calibration_only)  # resolvable
    # A framework with what the container lacks carries its own factor; the container's and torchtitan's do not.
    assert cal.frameworks["megatron-te"]["factor"].startswith("fit:")
    assert cal.frameworks["torchtitan"]["factor"] == 1.0
    # Every fitted compute factor stands for a stated power limit: no free factor for an unstated one.
    for name, system in cal.systems.items():
        if str(system.get("compute_factor", "")).startswith("fit:"):
            assert "W power limit" in system["source"], name
    assert len({calibration.source_key(r) for r in published}) >= 5


def test_stored_summary_counts_the_calibration_set_and_its_held_out_sources(cal):
    """performance.yaml's summary (what the planner quotes) is of this calibration set, and
    separates published rows from this container's own runs."""
    stored = catalogs.performance_model().summary
    assert stored.rows == len(cal.rows)
    assert stored.published_rows == sum(r.framework != "tiered-training" for r in cal.rows)
    assert stored.own_rows == sum(r.framework == "tiered-training" for r in cal.rows) >= 12
    assert stored.sources == len(calibration.sources(cal))
    assert stored.loso_median_error is not None and stored.loso_median_error <= stored.loso_worst_error


def test_a_refit_without_a_source_never_reads_that_source(cal):
    """Leave one source out: the parameters fitted without a source do not move when that
    source's published figures do, and a factor only that source informs stays neutral."""
    from dataclasses import replace

    key = next(k for k in calibration.sources(cal) if "Megatron-Bridge" in k)
    doubled = replace(cal, rows=[r.model_copy(update={"tokens_per_second_per_gpu": 2 * r.tokens_per_second_per_gpu})
                                 if calibration.source_key(r) == key else r for r in cal.rows], machines={})
    quick = {"iterations": 40}
    without, factors = calibration.fit(cal, without=key, **quick)
    assert calibration.fit(doubled, without=key, **quick) == (without, factors)
    assert factors["megatron_te"] == 1.0  # only Megatron's rows inform it
    assert calibration.fit(doubled, **quick) != calibration.fit(cal, **quick)


def test_fit_reproduces_the_stored_parameters(cal):
    params, factors = calibration.fit(cal)
    stored = perf.stored_parameters()
    for name in calibration.FITTED:
        assert getattr(params, name) == pytest.approx(getattr(stored, name), rel=0.03), name
    for name, value in catalogs.performance_model().calibration_only.items():
        assert factors[name] == pytest.approx(value, rel=0.03), name


def test_gpu_check_rows_are_read_as_this_containers_own_runs(tmp_path, capsys):
    row = {
        "id": "gpu-check-h200-1b-bf16", "source": "training/tools/gpu_check.sh on the device machine", "date": "2026-12-01",
        "hardware": "ml.p5en.48xlarge", "gpus": 1, "framework": "tiered-training", "model": "llama-3.2-1b",
        "sequence_length": 4096, "micro_batch_size": 2, "precision": "bf16", "fp8_recipe": None,
        "activation_checkpointing": "selective", "sharding": "full", "shard_group_size": 1, "context_parallel": 1,
        "compile": True, "tokens_per_second_per_gpu": 25000.0, "peak_memory_gib_allocated": 30.1,
        "peak_memory_gib_reserved": 32.5, "notes": "", "mfu": 0.41,
    }
    (tmp_path / "h200.json").write_text(json.dumps({"rows": [row]}))
    loaded = calibration.load(gpu_dir=tmp_path)
    extra = [r for r in loaded.rows if r.id == row["id"]]
    assert len(extra) == 1 and extra[0].source_key == calibration.OWN_RUNS and not extra[0].published
    assert calibration.main(["--no-fit", "--no-loso", "--gpu-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert row["id"] in out and "plus 1 run of this container" in out


def test_single_linear_speedups_match_torchao(cal):
    model = catalogs.performance_model()
    for row in cal.linear_rows:
        predicted = calibration.predict_speedup(row, cal, perf.parameters_of(model), dict(model.calibration_only))
        assert predicted == pytest.approx(row.speedup, rel=0.1), row.id


# -- the model's terms ---------------------------------------------------------------------


def test_recomputation_costs_what_checkpointing_repeats():
    times = {ac: speed(Setting("fp8", ac, 2, 8, fp8_recipe="tensorwise")) for ac in ("none", "selective", "full")}
    assert times["none"].recompute == 0
    assert 0 < times["selective"].recompute < times["full"].recompute
    assert times["none"].tokens_per_second_per_gpu > times["selective"].tokens_per_second_per_gpu > times["full"].tokens_per_second_per_gpu


def test_bigger_micro_batches_amortise_collectives_and_kernel_overheads():
    one = speed(Setting("bf16", "none", 1, 8), accum=8)
    four = speed(Setting("bf16", "none", 4, 8), accum=2)
    assert one.tokens_per_gpu == four.tokens_per_gpu
    assert four.communication_total < one.communication_total
    assert four.tokens_per_second_per_gpu > one.tokens_per_second_per_gpu


def test_fsdp_across_nodes_exposes_communication_that_nvlink_hides():
    # P4de: 400 Gbit/s of EFA per node against 300 GB/s of NVLink per GPU.
    p4de = Hardware.of(catalogs.instances()["ml.p4de.24xlarge"])
    node = speed(Setting("bf16", "selective", 1, 8), hw=p4de, gpus=8)
    across = speed(Setting("bf16", "selective", 1, 32), hw=p4de, gpus=32)
    assert across.communication_total > 3 * node.communication_total
    assert node.communication < across.communication
    # Hybrid sharding gathers inside the node but all-reduces the gradients across nodes.
    hybrid = speed(Setting("bf16", "selective", 1, 8, sharding="hybrid"), hw=p4de, gpus=32)
    assert hybrid.communication_total > node.communication_total


def test_hybrid_sharding_all_reduces_across_replicas_once_per_step():
    p4de = Hardware.of(catalogs.instances()["ml.p4de.24xlarge"])
    hybrid = Setting("bf16", "selective", 1, 8, sharding="hybrid")
    one, four = speed(hybrid, hw=p4de, gpus=32, accum=1), speed(hybrid, hw=p4de, gpus=32, accum=4)
    full_one, full_four = (speed(Setting("bf16", "selective", 1, 8), hw=p4de, gpus=8, accum=a) for a in (1, 4))
    assert full_four.communication_total == pytest.approx(4 * full_one.communication_total)  # all per micro-batch
    # one, four = per-micro-batch FSDP work c and the replicas' all-reduce r: c + r and 4c + r
    all_reduce = (4 * one.communication_total - four.communication_total) / 3
    assert all_reduce > 0.1 * one.communication_total  # counted per micro-batch, it would be 0


def test_fp8_gain_grows_with_gemm_size():
    def gain(model: str) -> float:
        arch = catalogs.models()[model].architecture
        bf16 = speed(Setting("bf16", "none", 1, 8), arch=arch).tokens_per_second_per_gpu
        return speed(Setting("fp8", "none", 1, 8, fp8_recipe="tensorwise"), arch=arch).tokens_per_second_per_gpu / bf16

    assert gain("llama-3.2-1b") < gain("llama-3.1-8b") < gain("llama-3.1-70b")
    small = LinearCost(P5, "fp8", "tensorwise", True, perf.stored_parameters())
    large_m = sum(small.seconds(16384, 8192, 8192))
    tiny_m = sum(small.seconds(256, 1024, 1024))
    bf16 = LinearCost(P5, "bf16", None, True, perf.stored_parameters())
    assert sum(bf16.seconds(16384, 8192, 8192)) / large_m > 1.2
    assert sum(bf16.seconds(256, 1024, 1024)) / tiny_m < 1.0


def test_attention_dominates_long_context_and_context_parallelism_splits_it():
    whole = speed(Setting("bf16", "full", 1, 8), sequence_length=131072, accum=1)
    split = speed(Setting("bf16", "full", 1, 8, context_parallel=4), sequence_length=131072, accum=1)
    assert whole.attention > 0.5 * whole.seconds
    # Per token, a context-parallel rank does the same attention work (its share of every
    # sequence), in block calls that cost the fitted ring overhead per step past the first.
    per_token = lambda t: t.attention / t.tokens_per_gpu  # noqa: E731
    params = perf.stored_parameters()
    ring = 1 / perf.ring_cost(4, params)
    assert 0.2 < ring < 1.0
    assert per_token(split) == pytest.approx(per_token(whole) / ring, rel=0.05)


def test_context_parallel_attention_costs_more_per_token_as_the_degree_grows():
    """torchtitan's ring runs at CP 2, 4 and 8 with the same 32K chunk per rank: per token,
    attention costs more with each ring step, so CP 2 with full checkpointing can beat CP 8
    with selective (one constant efficiency made every degree cost the same)."""
    per_token = {}
    for cp in (1, 2, 4, 8):
        t = speed(Setting("fp8", "full", 1, 8, fp8_recipe="tensorwise", context_parallel=cp), hw=P5, sequence_length=32768 * cp, accum=1)
        per_token[cp] = t.attention / t.tokens_per_gpu / (32768 * cp)  # per token and unit of context
    assert per_token[1] < per_token[2] < per_token[4] < per_token[8]
    assert per_token[8] / per_token[2] == pytest.approx(perf.ring_cost(8, perf.stored_parameters()) / perf.ring_cost(2, perf.stored_parameters()), rel=0.02)


def test_b200_is_faster_than_h100_but_not_by_more_than_its_peak():
    h100 = speed(Setting("fp8", "none", 1, 8, fp8_recipe="tensorwise"), hw=P5).tokens_per_second_per_gpu
    b200 = speed(Setting("fp8", "none", 1, 8, fp8_recipe="tensorwise"), hw=B200).tokens_per_second_per_gpu
    assert 1.5 < b200 / h100 < B200.peak_fp8_flops / P5.peak_fp8_flops * 1.1


def test_planner_memory_holds_against_the_h200_gpu_check(cal):
    """Every committed GPU-check run (one H200, one micro-batch per step): the planner's
    allocated and reserved peaks for that very setting are never below what the GPU held,
    and at most 15% above it. A plan that under-predicts fails on the instance."""
    from tiered_training.planning import memory

    rows = [r for r in cal.rows if r.framework == "tiered-training"]
    assert len(rows) >= 12 and all(r.grad_accum_steps == 1 for r in rows)
    for row in rows:
        predicted = calibration.predict_memory(row, cal, catalogs.performance_model().calibration_only)
        for got, measured in ((predicted.allocated, row.peak_memory_gib_allocated), (predicted.reserved, row.peak_memory_gib_reserved)):
            assert -0.01 <= got / memory.GIB / measured - 1 <= 0.15, (row.id, got / memory.GIB, measured)


def test_predict_charges_the_optimiser_step_once_per_optimiser_step(cal):
    """A published run with gradient accumulation spreads one optimiser step over its
    micro-batches; ``predict`` follows the row's ``grad_accum_steps``."""
    model = catalogs.performance_model()
    row = next(r for r in cal.rows if r.id == "megatron-dgx-b200-8b-fp8cs")
    assert row.grad_accum_steps == 8  # GBS 128 over 8 data-parallel ranks of micro-batch 2
    params, factors = perf.parameters_of(model), dict(model.calibration_only)
    once = calibration.predict(row.model_copy(update={"grad_accum_steps": 1}), cal, params, factors)
    eight = calibration.predict(row, cal, params, factors)
    hw, _ = calibration.hardware(row, cal, factors)
    step = step_time(row.architecture, hw, calibration.run_setting(row, cal), sequence_length=row.sequence_length, gpus=row.gpus, accum=8, params=params)
    assert eight > once * 1.05  # DDP's unsharded AdamW step is a large share of one micro-batch
    assert eight == pytest.approx(step.tokens_per_second_per_gpu * factors["megatron_te"])
    assert step.optimizer == step_time(row.architecture, hw, row.setting, sequence_length=row.sequence_length, gpus=row.gpus,
                                       accum=1, params=params).optimizer


def test_no_configuration_that_ran_is_predicted_to_exceed_its_gpu(cal):
    """Every calibration row ran: the planner's memory for it, fixed reserve included, fits
    in the GPU's memory (rows of a framework whose memory layout the model describes)."""
    factors = catalogs.performance_model().calibration_only
    modelled = [r for r in cal.rows if cal.frameworks[r.framework].get("memory_model", True)]
    assert {r.framework for r in modelled} == {"torchtitan", "tiered-training"}
    for row in modelled:
        predicted = calibration.predict_memory(row, cal, factors)
        _, usable = calibration.hardware(row, cal, factors)
        assert predicted.total / calibration.GIB <= usable, (row.id, predicted.total / calibration.GIB, usable)


def test_causal_flops_count_half_the_attention():
    s = 65536
    full, causal = ARCH_8B.flops_per_token(s), ARCH_8B.flops_per_token(s, causal=True)
    attention = 12 * ARCH_8B.layers * ARCH_8B.hidden_size * s
    assert full - causal == pytest.approx(attention / 2)
    assert causal / full < 0.7  # at 64K, 64% MFU counted with full attention is 42% causal for Llama 3.1 8B
