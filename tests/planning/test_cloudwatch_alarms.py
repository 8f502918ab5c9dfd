"""The alarm evaluator itself, against the behaviour the CloudWatch user guide documents."""

from __future__ import annotations

import pytest
from cloudwatch_alarms import ALARM, INSUFFICIENT, OK, Alarm, MetricStore, math_expression

T0 = 1_000_000_020.0 // 60 * 60
P = 60.0


def _store(points: str) -> MetricStore:
    """Datapoints oldest first: '0' not breaching (value 0), 'X' breaching (value 10), '-' missing; one per minute."""
    store = MetricStore()
    for i, mark in enumerate(points.split()):
        if mark != "-":
            store.add_emf({
                "_aws": {"Timestamp": int((T0 + i * P + 1) * 1000), "CloudWatchMetrics": [
                    {"Namespace": "N", "Dimensions": [["D"]], "Metrics": [{"Name": "M", "Unit": "Count"}]}]},
                "D": "d", "M": 10.0 if mark == "X" else 0.0,
            })
    return store


def _alarm(treat: str, n: int = 3, m: int = 3, state: str = OK) -> Alarm:
    props = {
        "Namespace": "N", "MetricName": "M", "Dimensions": [{"Name": "D", "Value": "d"}], "Period": 60,
        "Statistic": "Maximum", "EvaluationPeriods": n, "DatapointsToAlarm": m, "Threshold": 5,
        "ComparisonOperator": "GreaterThanThreshold", "TreatMissingData": treat,
    }
    return Alarm(props, state=state)


def _state(points: str, treat: str, **kwargs) -> str:
    alarm = _alarm(treat, **kwargs)
    now = T0 + len(points.split()) * P  # the newest datapoint ends now
    return alarm.evaluate(_store(points), now)


@pytest.mark.parametrize("treat", ["missing", "ignore", "breaching", "notBreaching"])
def test_enough_real_datapoints_in_the_range_ignore_the_missing_data_setting(treat):
    # 3 of 3 with an evaluation range of 5: the 3 most recent *real* datapoints are evaluated.
    assert _state("0 - X - X", treat) == OK  # 0, X, X
    assert _state("0 X X - X", treat) == ALARM  # X, X, X


def test_all_missing():
    assert _state("- - - - -", "missing") == INSUFFICIENT
    assert _state("- - - - -", "ignore") == OK and _state("- - - - -", "ignore", state=ALARM) == ALARM
    assert _state("- - - - -", "breaching") == ALARM
    assert _state("- - - - -", "notBreaching") == OK


def test_fewer_real_datapoints_than_evaluation_periods_are_filled():
    assert _state("- - - - 0", "breaching") == OK  # 0 + two breaching fills: 2 of 3
    assert _state("- - - X X", "breaching") == ALARM  # X X + one breaching fill
    assert _state("- - - X X", "notBreaching") == OK
    assert _state("- - - X X", "notBreaching", m=2) == ALARM  # M of N: 2 real breaches are enough
    assert _state("- - X - -", "ignore", state=OK) == OK
    # One breaching datapoint, then only missing ones: ALARM even when missing data is 'missing',
    # once the breach is at least M periods old (the knowledge-center article's case).
    assert _state("- - X - -", "missing") == ALARM
    assert _state("- - - X -", "missing") == OK
    assert _state("- - X - -", "notBreaching") == OK


def test_windows_slide_with_the_evaluation_minute_and_the_range_keeps_old_datapoints():
    alarm = _alarm("notBreaching", n=1, m=1)
    alarm.props["Period"] = 300
    alarm.__post_init__()
    store = _store("- - X")  # one breaching observation, 2 minutes after T0
    transitions = alarm.run(store, T0, T0 + 30 * P)
    # The first 5-minute window that holds it ends at minute 3 (windows end on every minute, not on
    # multiples of 5). Once newer windows are empty, the most recent *real* datapoint of the
    # evaluation range (3 periods here) is still evaluated: the alarm stays until minute 18.
    assert [(t.state, (t.at - T0) / P) for t in transitions] == [(ALARM, 3.0), (OK, 18.0)]


def test_metric_math():
    env = {"a": 2.0, "b": None, "c": 0.0}
    assert math_expression("FILL(b, 0) + 1000000000 * c", env) == 0.0
    assert math_expression("FILL(a, 0) + 1000000000 * a", env) == 2_000_000_002.0
    assert math_expression("a + b", env) is None
    assert math_expression("IF(a >= 2 AND a - a == 0, 1, 0)", env) == 1.0
    assert math_expression("IF(c > 0 OR a < 1, 1, 0)", env) == 0.0
    assert math_expression("IF(b > 0, 1, 0)", env) is None
    with pytest.raises(NotImplementedError):
        math_expression("RATE(a)", env)


def test_insights_aggregates_every_observation_of_matching_metrics():
    from cloudwatch_alarms import insights

    store = MetricStore()
    for node, values in (("algo-1", [90.0, 95.0]), ("algo-2", [10.0, 97.0])):
        for i, value in enumerate(values):
            store.add_emf({
                "_aws": {"Timestamp": int((T0 + i * 30) * 1000), "CloudWatchMetrics": [
                    {"Namespace": "TT", "Dimensions": [["Recipe", "Node"]], "Metrics": [{"Name": "U", "Unit": "Percent"}]}]},
                "Recipe": "r", "Node": node, "U": value,
            })
    query = "SELECT MIN(\"U\") FROM SCHEMA(\"TT\", Recipe, Node) WHERE Recipe = 'r'"
    assert insights(store, query, T0, T0 + 60) == 10.0
    assert insights(store, query.replace("MIN", "AVG"), T0, T0 + 60) == pytest.approx(73.0)
    assert insights(store, query.replace("'r'", "'other'"), T0, T0 + 60) is None
    assert insights(store, query.replace("Recipe, Node", "Recipe"), T0, T0 + 60) is None  # exact dimension set
