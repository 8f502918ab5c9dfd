"""Every template's synthesized alarms, evaluated as CloudWatch would on the EMF lines of simulated runs.

For each recipe in recipes/, the container's real metrics code (training/components/metrics.py, on a
fake clock) prints what a run at the plan's step time prints; the alarms are the
AWS::CloudWatch::Alarm resources of the synthesized template; tests/cloudwatch_alarms.py
evaluates them minute by minute. A healthy life (probe gap, spot interruption and wait,
a MaxSteps run, a finished run, checkpoint saves, validation) fires nothing; each failure
fires its alarm, alone, within the time the alarm states.
"""

from __future__ import annotations

import math

import pytest
from alarm_simulation import START_UP_SECONDS, Conditions, Simulation
from cdk_helpers import resources
from cloudwatch_alarms import Alarm
from support import RECIPES

from tiered_training.constructs.platform import stack_id
from tiered_training.planning import alarms as fitting

MINUTE = 60.0
HEALTHY_BEFORE = 35 * MINUTE  # of training before a failure starts


def template_alarms(template: dict) -> dict[str, Alarm]:
    out = {}
    for logical, resource in resources(template, "AWS::CloudWatch::Alarm").items():
        name = logical.removeprefix("Monitoring")[:-8]
        out[name] = Alarm(resource["Properties"], name=name)
    return out


def fired(sim: Simulation, alarms: dict[str, Alarm], end: float) -> dict[str, float]:
    """Alarm name -> first time it went to ALARM, evaluating every minute from the start to ``end``."""
    store = sim.store()
    out = {}
    for name, alarm in alarms.items():
        at = alarm.first_alarm(store, sim.start, end)
        if at is not None:
            out[name] = at
    return out


@pytest.fixture(scope="module")
def recipes(plans, templates, template_names):
    return {name: (plans[name], template_alarms(templates[stack_id(name)])) for name in template_names}


def test_every_template_has_its_alarms(recipes):
    assert len(recipes) == len(RECIPES)
    for plan, alarms in recipes.values():
        assert set(alarms) == set(fitting.fit_alarms(plan).alarms)


def test_a_healthy_life_fires_nothing(recipes):
    """Probe gap, a spot interruption and the wait, a resumed run ended by MaxSteps, a run that
    reaches its last step, with checkpoint saves and validation passes: no alarm."""
    for name, (plan, alarms) in recipes.items():
        sim = Simulation(plan)
        sim.wait(20 * MINUTE)  # the probe (it prints no EMF) and the gate
        sim.run_process(70 * MINUTE, end="stop")  # spot interruption: SIGTERM, final save
        sim.wait(40 * MINUTE)  # spot capacity wait
        sim.run_process(70 * MINUTE, end="return")  # resumed, shortened by MaxSteps
        sim.wait(30 * MINUTE)
        sim.step = plan.estimates.total_steps - math.ceil(20 * MINUTE / plan.estimates.step_time_seconds)
        sim.run_process(0, end="finish")  # the last steps of the plan; the run ends on its own
        sim.wait(60 * MINUTE)
        assert fired(sim, alarms, sim.now) == {}, name


def _steps_for(plan, seconds: float) -> int:
    """The plan's steps, or enough to train for ``seconds`` when its whole run is shorter (a short fine-tune)."""
    return max(plan.run_config().batch.total_steps, math.ceil(seconds / plan.estimates.step_time_seconds))


def _failure(plan, alarms, conditions_for, alarm_name, *, onset_offset: float = 0.0):
    """Train healthily, then fail from ``onset``; return (time to fire of alarm_name, every alarm fired)."""
    fit = fitting.fit_alarms(plan)
    after = fit[alarm_name].fires_within_seconds + 10 * MINUTE
    # A template whose whole run is shorter than the healthy start and the alarm's window (a short fine-tune)
    # is simulated as a longer run of the same plan: the same step time and alarms, more steps.
    seconds = HEALTHY_BEFORE + after
    sim = Simulation(plan, total_steps=_steps_for(plan, seconds))
    onset = sim.start + START_UP_SECONDS + HEALTHY_BEFORE
    sim.conditions = conditions_for(onset)
    sim.run_process(START_UP_SECONDS * 0 + HEALTHY_BEFORE + after, end="return")
    found = fired(sim, alarms, sim.now)
    condition_at = onset + onset_offset
    took = found[alarm_name] - condition_at if alarm_name in found else None
    return took, found, fit[alarm_name].fires_within_seconds


SCENARIOS = {
    # name: (alarm, conditions from the onset)
    "throughput at 50%": (fitting.THROUGHPUT, lambda onset: Conditions(slowdown=lambda t: 2.0 if t >= onset else 1.0)),
    "stall": (fitting.STALLED, lambda onset: Conditions(hang_at=onset)),
    "NaN loss": (fitting.LOSS, lambda onset: Conditions(loss=lambda t, loss: float("nan") if t >= onset else loss)),
    "idle GPU node": (fitting.GPU_UTILIZATION, None),
    # one GPU of the last node at 0.85 of the others' speed (the whole step waits for it: 1/0.86 as long)
    "a GPU at 0.85": (fitting.STRAGGLER, "slow"),
    "XID 79 on one GPU": (fitting.GPU_FAULT, "xid"),
    # one GPU held in a hardware thermal slowdown, at 0.95 of the others' speed (not slow enough to straggle)
    "a GPU in thermal slowdown": (fitting.GPU_SLOWDOWN, "hot"),
    "validation loss diverging": (
        fitting.VALIDATION, lambda onset: Conditions(validation_gap=lambda t: 1.0 if t >= onset else 0.03)
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_failure_fires_its_alarm_alone_within_the_stated_time(recipes, scenario):
    alarm_name, conditions = SCENARIOS[scenario]
    report = []
    for name, (plan, alarms) in recipes.items():
        last = plan.nodes - 1
        if conditions is None:  # the last node's GPUs idle
            make = lambda onset, last=last: Conditions(idle_node=lambda t: last if t >= onset else None)  # noqa: E731
        elif conditions == "xid":  # the last node's last GPU falls off the bus
            gpus = plan.instance.gpus
            make = lambda onset, last=last, gpus=gpus: Conditions(xid=(onset, last, gpus - 1, 79))  # noqa: E731
        elif conditions == "hot":
            gpus = plan.instance.gpus
            make = lambda onset, last=last, gpus=gpus: Conditions(  # noqa: E731
                thermal_gpu=lambda t: (last, gpus - 1) if t >= onset else None,
                slow_gpu=lambda t: (last, 0.95) if t >= onset else None,
                slowdown=lambda t: 1 / 0.955 if t >= onset else 1.0,
            )
        elif conditions == "slow":
            make = lambda onset, last=last: Conditions(  # noqa: E731
                slow_gpu=lambda t: (last, 0.85) if t >= onset else None,
                slowdown=lambda t: 1 / 0.86 if t >= onset else 1.0,
            )
        else:
            make = conditions
        took, found, stated = _failure(plan, alarms, make, alarm_name)
        assert took is not None, f"{name}: {alarm_name} did not fire; fired: {found}"
        report.append(f"{name}: {took / 60:.1f} min (stated {stated / 60:.0f})")
        assert 0 < took <= stated, f"{name}: {alarm_name} fired {took / 60:.1f} min after the condition, stated {stated / 60:.0f}"
        assert set(found) == {alarm_name}, f"{name}: one failure, one alarm; fired: {sorted(found)}"
    print(f"\n{scenario}: " + "; ".join(report))


def test_diverging_loss_fires_within_the_stated_time_of_crossing_the_ceiling(recipes):
    for name, (plan, alarms) in recipes.items():
        ceiling = fitting.loss_ceiling(plan)
        rise = 600.0  # the loss grows e-fold every 10 minutes
        crossing = {}

        def conditions(onset, ceiling=ceiling, rise=rise, crossing=crossing):
            def loss(t, healthy):
                if t < onset:
                    return healthy
                value = healthy * math.exp((t - onset) / rise)
                if value > ceiling and "at" not in crossing:
                    crossing["at"] = t
                return value

            return Conditions(loss=loss)

        fit = fitting.fit_alarms(plan)
        seconds = HEALTHY_BEFORE + 25 * MINUTE + fit[fitting.LOSS].fires_within_seconds
        sim = Simulation(plan, total_steps=_steps_for(plan, seconds))
        onset = sim.start + START_UP_SECONDS + HEALTHY_BEFORE
        sim.conditions = conditions(onset)
        sim.run_process(seconds, end="return")
        found = fired(sim, alarms, sim.now)
        assert fitting.LOSS in found, f"{name}: {found}"
        # The crossing is seen at the first step that ends above the ceiling.
        took = found[fitting.LOSS] - crossing["at"]
        assert took <= fit[fitting.LOSS].fires_within_seconds, f"{name}: {took / 60:.1f} min"
        assert set(found) == {fitting.LOSS}, f"{name}: {sorted(found)}"


def test_a_brief_thermal_excursion_fires_nothing(recipes):
    """A GPU slowed for two minutes (a hot spell the cooling catches up with) is shown, not alarmed on."""
    plan, alarms = recipes["llama3-1b-bf16"]
    gpus = plan.instance.gpus

    def make(onset):
        return Conditions(thermal_gpu=lambda t: (0, gpus - 1) if onset <= t < onset + 2 * MINUTE else None)

    _took, found, _stated = _failure(plan, alarms, make, fitting.GPU_SLOWDOWN)
    assert found == {}, found
