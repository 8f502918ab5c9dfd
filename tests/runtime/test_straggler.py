"""Straggler scores: per-rank phase times gathered every few steps, the fastest rank's time over each rank's,
published as EMF by global rank 0 (training/components/straggler.py). The ranks are threads here, gathering through
a barrier as an all-gather would; the EMF lines are parsed as CloudWatch reads them."""

from __future__ import annotations

import io
import threading

import pytest

from tiered_training.contract import metrics as catalogue
from training.components.metrics import parse_emf_lines
from training.components.straggler import (
    GATHER_EVERY_STEPS,
    StragglerHook,
    relative_scores,
    score_ranks,
    slowdown,
)
from training.step_stats import StepStats

from .helpers import tiny_config
from .test_runtime_metrics import T0, Clock


class Gather:
    """An all-gather among ``n`` threads (one per rank)."""

    def __init__(self, n: int):
        self.slots: list = [None] * n
        self.barrier = threading.Barrier(n)

    def rank(self, index: int):
        gather = self

        class View:
            def _all(self, value):
                gather.slots[index] = value
                gather.barrier.wait()
                found = list(gather.slots)
                gather.barrier.wait()
                return found

            def floats(self, values):
                return [list(v) for v in self._all(list(values))]

            def objects(self, value):
                return self._all(value)

        return View()


def stats(step, fb, *, data=0.01, opt=0.02, save=None, total=1000):
    return StepStats(step=step, loss=2.0, grad_norm=1.0, lr=1e-4, tokens=4096, step_time_s=fb + data + opt,
                     data_wait_s=data, tokens_per_second=1.0, micro_batch_size=1, grad_accum_steps=1,
                     checkpoint_save_s=save, forward_backward_s=fb, optimizer_s=opt)


def run_ranks(hosts=2, gpus=2, steps=40, step_s=10.0, fb=lambda host, gpu, step: 1.0, total=1000, interval=60.0):
    """``hosts`` x ``gpus`` ranks in threads, ``steps`` steps of ``step_s`` s of (shared, fake) clock each; the rank-0
    hook and its output."""
    cfg = tiny_config(batch__total_steps=total, metrics__interval_seconds=interval)
    n = hosts * gpus
    gather, clock, out = Gather(n), Clock(T0), io.StringIO()
    hooks = [StragglerHook(cfg, rank=r, local_rank=r % gpus, node=f"algo-{r // gpus + 1}", gather=gather.rank(r),
                           stream=out if r == 0 else io.StringIO(), clock=clock) for r in range(n)]
    step_done = threading.Barrier(n, action=lambda: setattr(clock, "now", clock.now + step_s))
    errors = []

    def rank(r):
        try:
            for step in range(1, steps + 1):
                hooks[r](stats(step, fb(r // gpus + 1, r % gpus, step), total=total))
                step_done.wait()
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
            step_done.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return hooks[0], out.getvalue()


def test_relative_score_is_the_fastest_time_over_the_ranks_own():
    assert relative_scores([[1.0, 2.0, 0.0], [2.0, 2.0, 0.0], [4.0, 1.0, 0.0]]) == [
        [1.0, 0.5, 1.0], [0.5, 0.5, 1.0], [0.25, 1.0, 1.0]]
    ranks = score_ranks([[0.1, 1.0, 0.1, 0.0], [0.1, 1.25, 0.1, 0.0]], ["algo-1", "algo-2"], [0, 0])
    assert ranks[0].step == 1.0 and ranks[1].step == pytest.approx(1.2 / 1.45)
    assert ranks[1].slow_phase == "forward_backward" and ranks[1].phases["forward_backward"] == pytest.approx(0.8)


def test_a_slow_gpu_is_named_with_its_host_phase_and_how_long():
    slow = lambda host, gpu, step: 1.25 if (host, gpu) == (2, 1) else 1.0  # noqa: E731 - 0.8 of the others
    hook, out = run_ranks(fb=slow, steps=100)
    events = parse_emf_lines(out)
    job = [e for e in events if "StragglerScore" in e]
    assert job, out[-2000:]
    last = job[-1]
    assert last["StragglerHost"] == "algo-2" and last["StragglerGpu"] == 1
    assert last["StragglerPhase"] == "forward/backward"
    assert last["StragglerScore"] == pytest.approx(1.03 / 1.28, abs=1e-3)  # the step's own time, all phases
    assert last["StragglerPhaseScore"] == pytest.approx(0.8, abs=1e-3)
    host = {e["Node"]: e["HostStragglerScore"] for e in events if "HostStragglerScore" in e}
    assert host["algo-1"] == 1.0 and host["algo-2"] < 0.85
    gpus = {(e["Node"], e["Gpu"]): e["GpuStragglerScore"] for e in events if "GpuStragglerScore" in e}
    assert set(gpus) == {("algo-1", "0"), ("algo-1", "1"), ("algo-2", "0"), ("algo-2", "1")}
    assert min(gpus, key=gpus.get) == ("algo-2", "1")
    lines = [line for line in out.splitlines() if line.startswith("straggler:")]
    # 100 steps of 10 s: published every minute; slow from the first interval to the last
    assert lines[-1].startswith("straggler: algo-2 GPU 1: 0.80 of the fastest rank in forward/backward for 16 minutes")
    assert "hosts: algo-1 1.00, algo-2 0.80" in lines[-1]


def test_healthy_ranks_name_no_straggler():
    jitter = lambda host, gpu, step: 1.0 + 0.02 * ((host * 7 + gpu * 3 + step) % 3)  # noqa: E731 - a few percent
    hook, out = run_ranks(fb=jitter, steps=60)
    lines = [line for line in out.splitlines() if line.startswith("straggler:")]
    assert lines and all(line.startswith("straggler: none (slowest") for line in lines), lines
    assert all(e["StragglerScore"] >= 0.95 for e in parse_emf_lines(out) if "StragglerScore" in e)


def test_gathers_every_few_steps_and_at_the_last_step():
    calls = []

    class Counting:
        def floats(self, values):
            calls.append(values)
            return [values]

        def objects(self, value):
            return [value]

    cfg = tiny_config(batch__total_steps=12, metrics__interval_seconds=3600.0)
    out = io.StringIO()
    hook = StragglerHook(cfg, rank=0, local_rank=0, node="algo-1", gather=Counting(), stream=out, clock=Clock())
    for step in range(1, 13):
        hook(stats(step, 1.0, total=12))
    assert len(calls) == 12 // GATHER_EVERY_STEPS + 1  # steps 5, 10 and the last
    assert calls[0][-1] == GATHER_EVERY_STEPS - 1  # the process's first step is left out
    assert "straggler: none" in out.getvalue()  # the last step publishes, whatever the cadence


def test_every_straggler_metric_comes_from_the_catalogue():
    hook, out = run_ranks(steps=12)
    seen = set()
    for event in parse_emf_lines(out):
        directive = event["_aws"]["CloudWatchMetrics"][0]
        for metric in directive["Metrics"]:
            spec = catalogue.BY_NAME[metric["Name"]]
            assert metric["Unit"] == spec.unit and tuple(directive["Dimensions"][0]) == spec.dimensions
            seen.add(spec)
    assert seen == set(catalogue.STRAGGLER)


def test_slow_host_variable():
    assert slowdown({"TIERED_TRAINING_SLOW_HOST": "algo-2:0.8"}, "algo-2") == 0.8
    assert slowdown({"TIERED_TRAINING_SLOW_HOST": "algo-2:0.8"}, "algo-1") == 1.0
    assert slowdown({}, "algo-1") == 1.0
    for bad in ("algo-2:fast", "algo-2:0", "algo-2:1.5", ":0.5"):
        with pytest.raises(ValueError, match="HOST\\[:FACTOR\\]"):
            slowdown({"TIERED_TRAINING_SLOW_HOST": bad}, "algo-2")
