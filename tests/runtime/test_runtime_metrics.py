"""EMF emission: parse the printed lines as CloudWatch would, and prove the names come from the catalogue."""

from __future__ import annotations

import io
import math

import pytest

from tiered_training import metrics as catalogue
from training.metrics import MetricsHook, parse_emf_lines
from training.step_stats import StepStats

from .helpers import tiny_config

GIB = 1024**3


def Stats(step, **fields):
    """The trainer's real StepStats, with defaults for the fields a test does not care about."""
    values = dict(
        loss=2.5, grad_norm=1.25, lr=3e-4, tokens=4096, step_time_s=0.5, data_wait_s=0.05,
        tokens_per_second=8192.0, micro_batch_size=2, grad_accum_steps=1,
    )
    values.update(fields)
    return StepStats(step=step, **values)


def _run(hook, steps, **fields):
    for step in range(1, steps + 1):
        hook(Stats(step=step, **{k: (v(step) if callable(v) else v) for k, v in fields.items()}))


def _metrics(event):
    """{name: (value, unit)} of one EMF event, validated the way CloudWatch reads it."""
    directive = event["_aws"]["CloudWatchMetrics"]
    assert isinstance(event["_aws"]["Timestamp"], int)
    assert len(directive) == 1
    out = {}
    for definition in directive[0]["Metrics"]:
        value = event[definition["Name"]]
        assert isinstance(value, (int, float)) and math.isfinite(value)
        out[definition["Name"]] = (value, definition["Unit"])
    for dimension_set in directive[0]["Dimensions"]:
        for name in dimension_set:
            assert isinstance(event[name], str) and event[name]
    return out


def test_rank0_job_metrics_every_interval_on_cpu():
    cfg = tiny_config()  # interval 2, total 4 steps, 8 GPUs of 2.25 PFLOP/s
    out = io.StringIO()
    hook = MetricsHook(cfg, rank=0, local_rank=0, node="algo-1", stream=out, gpu_sampler=None)
    _run(hook, 4, checkpoint_save_s=lambda s: 1.5 if s == 3 else None, world_size=2)
    events = parse_emf_lines(out.getvalue())
    assert len(events) == 2  # steps 2 and 4; no GPU: no node event
    for event in events:
        directive = event["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == catalogue.NAMESPACE == cfg.metrics.namespace
        assert directive["Dimensions"] == [list(catalogue.DIMENSIONS)]
        assert event["Recipe"] == "tiny-test"
    first, last = (_metrics(e) for e in events)
    assert events[0]["Step"] == 2 and events[1]["Step"] == 4
    assert first["StepsCompleted"] == (2, "Count") and last["StepsCompleted"] == (4, "Count")
    assert first["TokensPerSecond"] == (pytest.approx(8192.0), "Count/Second")  # 2*4096 tokens / 2*0.5 s
    assert first["TokensPerSecondPerGpu"][0] == pytest.approx(4096.0)
    expected_mfu = 100 * cfg.model.flops_per_token(32) * 4096.0 / 2.25e15
    assert first["MFU"] == (pytest.approx(expected_mfu), "Percent")
    assert first["StepTime"] == (pytest.approx(0.5), "Seconds")
    assert first["DataWaitFraction"] == (pytest.approx(10.0), "Percent")
    assert first["Loss"] == (2.5, "None") and first["GradNorm"] == (1.25, "None")
    assert first["LearningRate"] == (pytest.approx(3e-4), "None")
    assert "CheckpointSaveTime" not in first
    assert last["CheckpointSaveTime"] == (1.5, "Seconds")
    for gpu_metric in ("PeakMemoryGiB", "PeakMemoryFraction", "GpuUtilization"):
        assert gpu_metric not in first and gpu_metric not in last
    readable = [line for line in out.getvalue().splitlines() if line.startswith("metrics: ")]
    assert len(readable) == 2 and "step 4/4" in readable[1] and "ckpt save 1.50s" in readable[1]


def test_node_metrics_with_gpu_on_local_rank0_of_second_node():
    cfg = tiny_config()
    out = io.StringIO()
    samples = iter([90.0, 100.0, 50.0, 70.0])
    hook = MetricsHook(
        cfg, rank=8, local_rank=0, world_size=16, node="algo-2", stream=out, gpu_sampler=lambda: next(samples)
    )
    _run(hook, 2, peak_memory_bytes=lambda s: int(s * 40 * GIB))
    events = parse_emf_lines(out.getvalue())
    assert len(events) == 1  # not rank 0: only the node event, no readable line
    event = events[0]
    assert event["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [list(catalogue.NODE_DIMENSIONS)]
    assert (event["Recipe"], event["Node"]) == ("tiny-test", "algo-2")
    values = _metrics(event)
    assert values["PeakMemoryGiB"] == (pytest.approx(80.0), "Gigabytes")
    assert values["PeakMemoryFraction"] == (pytest.approx(100 * 80 / 179), "Percent")
    assert values["GpuUtilization"] == (pytest.approx(95.0), "Percent")
    assert "metrics: " not in out.getvalue()


def test_other_ranks_print_nothing():
    out = io.StringIO()
    hook = MetricsHook(tiny_config(), rank=3, local_rank=3, world_size=8, stream=out, gpu_sampler=lambda: 1.0)
    _run(hook, 4, peak_memory_bytes=GIB)
    assert out.getvalue() == ""


def test_non_finite_loss_is_left_out_not_emitted_as_nan():
    out = io.StringIO()
    hook = MetricsHook(tiny_config(), rank=0, local_rank=0, world_size=1, stream=out, gpu_sampler=None)
    _run(hook, 2, loss=float("nan"))
    (event,) = parse_emf_lines(out.getvalue())
    assert "Loss" not in _metrics(event) and event["LossNonFinite"] == "nan"


def test_every_emitted_metric_comes_from_the_catalogue():
    """The container's names, units and dimensions are tiered_training.metrics' (which the alarms read)."""
    out = io.StringIO()
    rank0 = MetricsHook(tiny_config(), rank=0, local_rank=0, world_size=8, node="algo-1", stream=out, gpu_sampler=lambda: 99.0)
    _run(rank0, 4, peak_memory_bytes=100 * GIB, checkpoint_save_s=2.0)
    emitted = set()
    for event in parse_emf_lines(out.getvalue()):
        dims = event["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
        for name, (_, unit) in _metrics(event).items():
            spec = catalogue.BY_NAME[name]
            assert spec in catalogue.ALL
            assert unit == spec.unit
            assert tuple(dims) == spec.dimensions
            emitted.add(name)
    # With a GPU, a checkpoint save and a finite loss, every catalogued metric is emitted.
    assert emitted == {spec.name for spec in catalogue.ALL}


def test_default_namespace_is_the_catalogue_namespace():
    from tiered_training.runconfig import MetricsConfig

    assert MetricsConfig().namespace == catalogue.NAMESPACE


def test_nvml_absent_is_clean():
    from training.metrics import NvmlSampler

    sampler = NvmlSampler()  # no GPU here: not available, sample() is None
    if not sampler.available:
        assert sampler.sample() is None
