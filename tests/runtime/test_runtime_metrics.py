"""EMF emission on a wall-clock cadence: parse the printed lines as CloudWatch would, with a fake clock."""

from __future__ import annotations

import io
import math
import time

import pytest

from tiered_training.contract import metrics as catalogue
from training.components.metrics import MetricsHook, parse_emf_lines
from training.step_stats import StepStats

from .helpers import tiny_config

GIB = 1024**3
T0 = float(int(time.time()) // 60 * 60 - 86_400)  # EMF timestamps must lie within the last two weeks


class Clock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def Stats(step, **fields):
    """The trainer's real StepStats, with defaults for the fields a test does not care about."""
    values = dict(
        loss=2.5, grad_norm=1.25, lr=3e-4, tokens=4096, step_time_s=20.0, data_wait_s=2.0,
        tokens_per_second=204.8, micro_batch_size=2, grad_accum_steps=1,
    )
    values.update(fields)
    return StepStats(step=step, **values)


def _train(hook, clock, steps, *, step_s=20.0, tick_s=5.0, first=1, **fields):
    """Steps of ``step_s`` seconds of wall clock, the heartbeat ticking every ``tick_s``."""
    for step in range(first, first + steps):
        end = clock.now + step_s
        while clock.now + tick_s < end:
            clock.now += tick_s
            hook.tick()
        clock.now = end
        values = {k: (v(step) if callable(v) else v) for k, v in fields.items()}
        hook(Stats(step=step, step_time_s=step_s, **values))


def _wait(hook, clock, seconds, tick_s=5.0):
    end = clock.now + seconds
    while clock.now + tick_s <= end:
        clock.now += tick_s
        hook.tick()
    clock.now = end


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


def _times(events):
    return [(e["_aws"]["Timestamp"] / 1000 - T0) for e in events]


def test_job_metrics_aggregate_the_steps_of_each_minute():
    cfg = tiny_config(batch__total_steps=100)  # 8 GPUs of 2.25 PFLOP/s, interval 60 s
    out, clock = io.StringIO(), Clock()
    hook = MetricsHook(cfg, rank=0, local_rank=0, node="algo-1", stream=out, gpu_sampler=None, clock=clock,
                       world_size=2)
    _train(hook, clock, 6, step_s=20.0, checkpoint_save_s=lambda s: 1.5 if s == 5 else None)
    events = parse_emf_lines(out.getvalue())
    assert _times(events) == [60.0, 120.0]  # steps 1-3 and 4-6; no GPU: no node event
    for event in events:
        directive = event["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == catalogue.NAMESPACE == cfg.metrics.namespace
        assert directive["Dimensions"] == [list(catalogue.DIMENSIONS)]
        assert event["Recipe"] == "tiny-test"
    first, second = (_metrics(e) for e in events)
    assert first["StepsCompleted"] == (3, "Count") and second["StepsCompleted"] == (6, "Count")
    # Step 1 (start-up, compile) is left out of throughput: steps 2-3 = 8192 tokens in 40 s.
    assert first["TokensPerSecond"] == (pytest.approx(204.8), "Count/Second")
    assert first["TokensPerSecondPerGpu"][0] == pytest.approx(102.4)
    assert first["MFU"] == (pytest.approx(100 * cfg.model.flops_per_token(32) * 102.4 / 2.25e15), "Percent")
    assert first["StepTime"] == (pytest.approx(20.0), "Seconds")
    assert first["DataWaitFraction"] == (pytest.approx(10.0), "Percent")
    assert first["Loss"] == (2.5, "None") and first["GradNorm"] == (1.25, "None")
    assert first["NonFiniteLossSteps"] == (0, "Count")
    assert "CheckpointSaveTime" not in first and second["CheckpointSaveTime"] == (1.5, "Seconds")
    readable = [line for line in out.getvalue().splitlines() if line.startswith("metrics: ")]
    assert len(readable) == 2 and "step 6/100" in readable[1] and "ckpt save 1.50s" in readable[1]
    # MFU is labelled: full attention (the metric) and causal, 6N + 6*L*h*s over 6N + 12*L*h*s
    full, causal = (cfg.model.flops_per_token(32, causal=c) * 102.4 / 2.25e15 * 100 for c in (False, True))
    assert f"MFU {full:.1f}% full attention ({causal:.1f}% causal)" in readable[0]


def test_a_step_longer_than_the_interval_reports_at_its_end_with_a_heartbeat_meanwhile():
    out, clock = io.StringIO(), Clock()
    hook = MetricsHook(tiny_config(batch__total_steps=100), rank=0, local_rank=0, stream=out, gpu_sampler=None,
                       clock=clock, world_size=1)
    _train(hook, clock, 3, step_s=150.0)
    events = parse_emf_lines(out.getvalue())
    steps = [e for e in events if "Heartbeat" not in e]
    beats = [e for e in events if e.get("Heartbeat")]
    assert _times(steps) == [150.0, 300.0, 450.0]  # each step at its end
    # No heartbeat before the first step; then one a minute while step 2 and 3 run.
    assert _times(beats) == [210.0, 270.0, 360.0, 420.0]
    assert [_metrics(e) for e in beats][0] == {"StepsCompleted": (1, "Count")}
    assert beats[0]["SecondsSinceStep"] == 60.0


def test_heartbeat_goes_on_during_a_save_and_stops_when_the_run_ends():
    out, clock = io.StringIO(), Clock()
    hook = MetricsHook(tiny_config(batch__total_steps=100), rank=0, local_rank=0, stream=out, gpu_sampler=None,
                       clock=clock, world_size=1)
    _train(hook, clock, 3, step_s=20.0)
    _wait(hook, clock, 200)  # a long checkpoint save or a data wait: the run is alive, no step ends
    beats = [e for e in parse_emf_lines(out.getvalue()) if e.get("Heartbeat")]
    assert len(beats) == 3 and {_metrics(e)["StepsCompleted"][0] for e in beats} == {3}
    hook.close()  # the run returned (MaxSteps, SIGTERM, an error): silence from now on
    before = out.getvalue()
    _wait(hook, clock, 600)
    hook(Stats(step=4))
    assert out.getvalue() == before


def test_the_last_step_sends_its_interval_and_ends_the_heartbeat():
    out, clock = io.StringIO(), Clock()
    hook = MetricsHook(tiny_config(), rank=0, local_rank=0, stream=out, gpu_sampler=None, clock=clock, world_size=1)
    _train(hook, clock, 4, step_s=5.0)  # total_steps 4, well inside one interval
    _wait(hook, clock, 600)
    events = parse_emf_lines(out.getvalue())
    assert len(events) == 1 and events[0]["Step"] == 4 and not events[0].get("Heartbeat")


def test_node_utilisation_counts_samples_taken_during_steps_only():
    cfg = tiny_config(batch__total_steps=100)
    out, clock = io.StringIO(), Clock()
    busy = {"value": 90.0}
    hook = MetricsHook(cfg, rank=8, local_rank=0, world_size=16, node="algo-2", stream=out, clock=clock,
                       gpu_sampler=lambda: busy["value"])
    _train(hook, clock, 2, step_s=20.0, peak_memory_bytes=lambda s: int(s * 40 * GIB))
    busy["value"] = 0.0  # a checkpoint save: the GPUs idle
    _wait(hook, clock, 30)
    busy["value"] = 90.0
    _train(hook, clock, 1, step_s=40.0, first=3, peak_memory_bytes=80 * GIB, checkpoint_save_s=None)
    events = parse_emf_lines(out.getvalue())
    assert len(events) == 1  # not rank 0: the node event only, no heartbeat, no readable line
    event = events[0]
    assert event["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [list(catalogue.NODE_DIMENSIONS)]
    assert (event["Recipe"], event["Node"]) == ("tiny-test", "algo-2")
    values = _metrics(event)
    assert values["PeakMemoryGiB"] == (pytest.approx(80.0), "Gigabytes")
    assert values["PeakMemoryFraction"] == (pytest.approx(100 * 80 / 179), "Percent")
    assert values["GpuUtilization"] == (pytest.approx(90.0), "Percent")  # the idle save is not in it
    assert "metrics: " not in out.getvalue()


def test_other_ranks_print_nothing():
    out, clock = io.StringIO(), Clock()
    hook = MetricsHook(tiny_config(), rank=3, local_rank=3, world_size=8, stream=out, gpu_sampler=lambda: 1.0, clock=clock)
    _train(hook, clock, 4, peak_memory_bytes=GIB)
    assert out.getvalue() == ""


def test_non_finite_loss_is_counted_not_emitted_as_nan():
    out, clock = io.StringIO(), Clock()
    hook = MetricsHook(tiny_config(batch__total_steps=100), rank=0, local_rank=0, world_size=1, stream=out,
                       gpu_sampler=None, clock=clock)
    _train(hook, clock, 4, step_s=15.0, loss=lambda s: float("nan") if s >= 3 else 3.0)
    (event,) = parse_emf_lines(out.getvalue())
    values = _metrics(event)
    assert values["Loss"] == (3.0, "None") and values["NonFiniteLossSteps"] == (2, "Count")
    assert event["LossNonFinite"] == "nan"


def test_a_step_skipped_for_a_non_finite_gradient_norm_is_counted_and_its_loss_left_out():
    out, clock = io.StringIO(), Clock()
    hook = MetricsHook(tiny_config(batch__total_steps=100), rank=0, local_rank=0, world_size=1, stream=out,
                       gpu_sampler=None, clock=clock)
    # the third step's loss is finite, its gradient norm is not: the trainer skipped its update
    _train(hook, clock, 4, step_s=15.0, loss=lambda s: 9.0 if s == 3 else 3.0,
           grad_norm=lambda s: float("inf") if s == 3 else 1.0, skipped=lambda s: s == 3)
    (event,) = parse_emf_lines(out.getvalue())
    values = _metrics(event)
    assert values["Loss"] == (3.0, "None") and values["NonFiniteLossSteps"] == (1, "Count")


def test_every_emitted_metric_comes_from_the_catalogue():
    """The container's names, units and dimensions are tiered_training.contract.metrics' (which the alarms read)."""
    out, clock = io.StringIO(), Clock()
    rank0 = MetricsHook(tiny_config(batch__total_steps=100), rank=0, local_rank=0, world_size=8, node="algo-1",
                        stream=out, gpu_sampler=lambda: 99.0, clock=clock)
    _train(rank0, clock, 2, peak_memory_bytes=100 * GIB, checkpoint_save_s=2.0)
    rank0.record_validation(2.75)
    _train(rank0, clock, 2, first=3, peak_memory_bytes=100 * GIB, checkpoint_save_s=2.0)
    emitted = set()
    for event in parse_emf_lines(out.getvalue()):
        dims = event["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
        for name, (_, unit) in _metrics(event).items():
            spec = catalogue.BY_NAME[name]
            assert unit == spec.unit
            assert tuple(dims) == spec.dimensions
            emitted.add(name)
    # With a GPU, a checkpoint save, a validation pass and a finite loss, every catalogued metric is emitted.
    assert emitted == {spec.name for spec in catalogue.ALL}


def test_heartbeat_thread_ticks_in_real_time():
    cfg = tiny_config(batch__total_steps=100, metrics__interval_seconds=0.05)
    out = io.StringIO()
    hook = MetricsHook(cfg, rank=0, local_rank=0, world_size=1, stream=out, gpu_sampler=None).start(0.01)
    hook(Stats(step=1))
    time.sleep(0.3)
    hook.close()
    beats = [e for e in parse_emf_lines(out.getvalue()) if e.get("Heartbeat")]
    assert len(beats) >= 2
    assert not hook._heartbeat.is_alive() or hook._heartbeat.join(1) is None


def test_default_namespace_and_cadence_are_the_catalogue_ones():
    from tiered_training.contract.runconfig import MetricsConfig

    assert MetricsConfig().namespace == catalogue.NAMESPACE
    assert MetricsConfig().interval_seconds == catalogue.DEFAULT_INTERVAL_SECONDS


def test_nvml_absent_is_clean():
    from training.components.metrics import NvmlSampler

    sampler = NvmlSampler()  # no GPU here: not available, sample() is None
    if not sampler.available:
        assert sampler.sample() is None


def test_a_dpo_steps_metrics_reach_the_sinks_under_trls_names_from_rank_0_only():
    class Sink:
        def __init__(self):
            self.logged = []

        def log_metrics(self, step, values):
            self.logged.append((step, dict(values)))

    values = {"rewards/chosen": 0.3, "rewards/rejected": -0.1, "rewards/margins": 0.4, "rewards/accuracies": 0.75}
    for rank, expected in ((0, [(7, values)]), (1, [])):
        sink = Sink()
        hook = MetricsHook(tiny_config(), rank=rank, local_rank=rank, stream=io.StringIO(), gpu_sampler=None,
                           clock=Clock(), world_size=2, sinks=[sink])
        hook.record_preference(7, values)
        assert sink.logged == expected
