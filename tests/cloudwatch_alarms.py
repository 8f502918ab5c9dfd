"""A CloudWatch metric-alarm evaluator, for tests: what an ``AWS::CloudWatch::Alarm`` would do with EMF data.

It reads the alarm's CloudFormation properties as synthesized and the EMF events the
container prints, and steps through time the way CloudWatch evaluates a
standard-resolution alarm. The semantics it implements, and where they are documented:

**Metrics from EMF** (CloudWatch user guide, "Specification: Embedded metric format"):
each event puts one observation of each listed metric, under each dimension set, at the
event's ``_aws.Timestamp``. A metric is identified by namespace, name and the *exact*
set of dimensions.

**Periods and evaluation** ("Using Amazon CloudWatch alarms", "Alarm evaluation"):
*Period* is the length of time over which the statistic makes one datapoint;
*Evaluation Periods* (N) is the number of most recent datapoints evaluated;
*Datapoints to Alarm* (M) is how many of them must breach ("M out of N"; they need not be
consecutive). A standard-resolution alarm is evaluated every minute; the datapoints of an
evaluation at minute ``t`` cover ``[t - (k+1)·Period, t - k·Period)``, windows that slide
with the evaluation minute (an alarm's state-reason data shows ``startDate`` and datapoint
timestamps on arbitrary minutes, not on multiples of the period). When ``Unit`` is given,
only observations with that unit count.

**Missing data** ("Configuring how CloudWatch alarms treat missing data", section "How
alarm state is evaluated when data is missing"): whatever TreatMissingData says,
CloudWatch retrieves more datapoints than N, its *evaluation range* (the guide's example:
the 5 most recent for N = 3; here ``N + extra_range``, default 2). Then:

1. none missing in the range: the N most recent datapoints are evaluated;
2. some missing, but at least N real ones in the range: the N most recent *real*
   datapoints are evaluated, and TreatMissingData is not used;
3. fewer than N real ones: the missing ones are filled as TreatMissingData says, as few
   times as possible, and every real datapoint in the range is included. ``breaching``
   fills count as breaching, ``notBreaching`` fills as not breaching; ``ignore`` keeps the
   current state; ``missing``: the alarm goes to ALARM when the oldest breaching datapoint
   of the range is at least M periods old and every more recent one is breaching or missing
   (AWS knowledge-center article "Why did my CloudWatch alarm send me a notification after
   a single breached data point?"), else it is evaluated on its real datapoints;
4. all missing: ``missing`` gives INSUFFICIENT_DATA, ``ignore`` keeps the state,
   ``breaching`` ALARM, ``notBreaching`` OK.

**Metric math** ("Using math expressions with CloudWatch metrics"): the expression is
computed per datapoint from its inputs' datapoints; an arithmetic or comparison with a
missing input has no datapoint; ``FILL(m, v)`` gives ``v`` where ``m`` has none;
``IF(c, a, b)`` gives ``a`` where ``c`` is non-zero, else ``b``; comparisons give 1 or 0;
``AND``/``OR`` are logical. Only these functions are known here: an alarm using another one
fails loudly instead of being evaluated wrongly.

**Metrics Insights** ("Metrics Insights query components and syntax"): ``SELECT
FUNC("metric") FROM SCHEMA("namespace", dim, ...) WHERE dim = 'value'`` matches the
metrics that have exactly those dimensions, and ``FUNC`` (AVG, MIN, MAX, SUM, COUNT)
aggregates *all their observations* in each period.

Not modelled: CloudWatch's ingestion latency (seconds to a minute on top of the times
measured here), high-resolution alarms, percentiles, anomaly detection.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

OK, ALARM, INSUFFICIENT = "OK", "ALARM", "INSUFFICIENT_DATA"
MINUTE = 60.0


# -- metric data -------------------------------------------------------------------------------


@dataclass
class _Series:
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    units: list[str] = field(default_factory=list)

    def add(self, t: float, value: float, unit: str) -> None:
        i = bisect.bisect_right(self.times, t)
        self.times.insert(i, t)
        self.values.insert(i, value)
        self.units.insert(i, unit)

    def between(self, start: float, end: float, unit: str | None = None) -> list[float]:
        lo, hi = bisect.bisect_left(self.times, start), bisect.bisect_left(self.times, end)
        if unit is None:
            return self.values[lo:hi]
        return [v for v, u in zip(self.values[lo:hi], self.units[lo:hi]) if u == unit]


class MetricStore:
    """Observations by (namespace, metric name, frozenset of dimension items)."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, frozenset], _Series] = {}

    def add_emf(self, event: dict) -> None:
        aws = event["_aws"]
        t = aws["Timestamp"] / 1000.0
        for directive in aws["CloudWatchMetrics"]:
            for dimension_set in directive["Dimensions"]:
                dims = frozenset((name, str(event[name])) for name in dimension_set)
                for metric in directive["Metrics"]:
                    key = (directive["Namespace"], metric["Name"], dims)
                    self.series.setdefault(key, _Series()).add(t, float(event[metric["Name"]]), metric.get("Unit", "None"))

    def add_emf_lines(self, text: str) -> int:
        count = 0
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{") and '"_aws"' in line:
                self.add_emf(json.loads(line))
                count += 1
        return count

    def observations(self, namespace: str, name: str, dims: dict[str, str], start: float, end: float,
                     unit: str | None = None) -> list[float]:
        series = self.series.get((namespace, name, frozenset(dims.items())))
        return series.between(start, end, unit) if series else []

    def matching(self, namespace: str, name: str, dim_keys: Iterable[str], where: dict[str, str]) -> list[_Series]:
        keys = frozenset(dim_keys)
        out = []
        for (ns, metric, dims), series in self.series.items():
            if ns != namespace or metric != name or frozenset(k for k, _ in dims) != keys:
                continue
            values = dict(dims)
            if all(values.get(k) == v for k, v in where.items()):
                out.append(series)
        return out


def statistic(name: str, values: list[float]) -> float | None:
    if not values:
        return None
    if name == "Average":
        return sum(values) / len(values)
    if name == "Sum":
        return sum(values)
    if name == "Minimum":
        return min(values)
    if name == "Maximum":
        return max(values)
    if name == "SampleCount":
        return float(len(values))
    raise NotImplementedError(f"statistic {name}")


# -- Metrics Insights ----------------------------------------------------------------------------

_INSIGHTS = re.compile(
    r'^SELECT\s+(?P<fn>AVG|MIN|MAX|SUM|COUNT)\("(?P<metric>[^"]+)"\)\s+FROM\s+SCHEMA\("(?P<ns>[^"]+)",\s*(?P<dims>[^)]*)\)'
    r"(?:\s+WHERE\s+(?P<where>.+?))?\s*$",
    re.IGNORECASE,
)


def insights(store: MetricStore, query: str, start: float, end: float) -> float | None:
    match = _INSIGHTS.match(query.strip())
    if not match:
        raise NotImplementedError(f"Metrics Insights query not understood (GROUP BY cannot feed an alarm): {query}")
    dims = [d.strip().strip('"') for d in match["dims"].split(",") if d.strip()]
    where: dict[str, str] = {}
    if match["where"]:
        for clause in re.split(r"\s+AND\s+", match["where"], flags=re.IGNORECASE):
            key, value = (part.strip() for part in clause.split("="))
            where[key.strip('"')] = value.strip("'")
    values = [v for s in store.matching(match["ns"], match["metric"], dims, where) for v in s.between(start, end)]
    fn = match["fn"].upper()
    if fn == "COUNT":
        return float(len(values)) if values else None
    return statistic({"AVG": "Average", "MIN": "Minimum", "MAX": "Maximum", "SUM": "Sum"}[fn], values)


# -- metric math ----------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>==|!=|>=|<=|[-+*/(),<>]))")


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise NotImplementedError(f"cannot parse metric math {text!r} at {text[pos:]!r}")
        out.append(match.group(match.lastgroup))
        pos = match.end()
    return out


class _Parser:
    """Recursive descent: OR < AND < comparison < + - < * / < unary < atom."""

    def __init__(self, text: str, env: dict[str, float | None]):
        self.tokens = _tokens(text)
        self.i = 0
        self.env = env

    def parse(self) -> float | None:
        value = self.or_()
        if self.i != len(self.tokens):
            raise NotImplementedError(f"trailing tokens {self.tokens[self.i:]}")
        return value

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.i]
        if expected is not None and token.upper() != expected:
            raise NotImplementedError(f"expected {expected}, got {token}")
        self.i += 1
        return token

    def or_(self):
        left = self.and_()
        while (self.peek() or "").upper() == "OR":
            self.take()
            right = self.and_()
            left = None if left is None or right is None else float(bool(left) or bool(right))
        return left

    def and_(self):
        left = self.comparison()
        while (self.peek() or "").upper() == "AND":
            self.take()
            right = self.comparison()
            left = None if left is None or right is None else float(bool(left) and bool(right))
        return left

    def comparison(self):
        left = self.sum_()
        ops = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, ">=": lambda a, b: a >= b,
               "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}
        while self.peek() in ops:
            op = ops[self.take()]
            right = self.sum_()
            left = None if left is None or right is None else float(op(left, right))
        return left

    def sum_(self):
        left = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.product()
            left = None if left is None or right is None else (left + right if op == "+" else left - right)
        return left

    def product(self):
        left = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.unary()
            if left is None or right is None or (op == "/" and right == 0):
                left = None
            else:
                left = left * right if op == "*" else left / right
        return left

    def unary(self):
        if self.peek() == "-":
            self.take()
            value = self.unary()
            return None if value is None else -value
        return self.atom()

    def atom(self):
        token = self.take()
        if token == "(":
            value = self.or_()
            self.take(")")
            return value
        if re.fullmatch(r"\d.*", token):
            return float(token)
        if self.peek() == "(":
            return self.call(token.upper())
        if token not in self.env:
            raise NotImplementedError(f"unknown metric id {token}")
        return self.env[token]

    def call(self, name: str):
        self.take("(")
        args = [self.or_()]
        while self.peek() == ",":
            self.take()
            args.append(self.or_())
        self.take(")")
        if name == "FILL" and len(args) == 2:
            return args[1] if args[0] is None else args[0]
        if name == "IF" and len(args) == 3:
            condition, yes, no = args
            if condition is None:
                return None
            return yes if condition else no
        raise NotImplementedError(f"metric math function {name} is not modelled")


def math_expression(expression: str, env: dict[str, float | None]) -> float | None:
    return _Parser(expression, env).parse()


# -- the alarm ------------------------------------------------------------------------------------

_COMPARE = {
    "GreaterThanThreshold": lambda v, t: v > t,
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}


@dataclass
class Transition:
    at: float
    state: str
    datapoints: list[float | None]


@dataclass
class Alarm:
    """An ``AWS::CloudWatch::Alarm`` (its CloudFormation properties) that can be evaluated on a MetricStore."""

    props: dict[str, Any]
    name: str = ""
    extra_range: int = 2
    state: str = INSUFFICIENT
    history: list[Transition] = field(default_factory=list)

    def __post_init__(self) -> None:
        p = self.props
        self.n = int(p["EvaluationPeriods"])
        self.m = int(p.get("DatapointsToAlarm", self.n))
        self.threshold = float(p["Threshold"])
        self.compare = _COMPARE[p["ComparisonOperator"]]
        self.treat = p.get("TreatMissingData", "missing")
        if "Metrics" in p:
            self.queries = {q["Id"]: q for q in p["Metrics"]}
            (self.result,) = [q["Id"] for q in p["Metrics"] if q.get("ReturnData", True)]
            periods = {q.get("Period") or q.get("MetricStat", {}).get("Period") for q in p["Metrics"]} - {None}
            (self.period,) = periods  # one period for the alarm's datapoints
        else:
            self.queries = {"m": {"Id": "m", "MetricStat": {
                "Metric": {"Namespace": p["Namespace"], "MetricName": p["MetricName"], "Dimensions": p.get("Dimensions", [])},
                "Period": p["Period"], "Stat": p["Statistic"], **({"Unit": p["Unit"]} if "Unit" in p else {}),
            }}}
            self.result, self.period = "m", p["Period"]
        self.period = float(self.period)

    def datapoint(self, store: MetricStore, end: float) -> float | None:
        """The alarm's datapoint for the period ending at ``end``."""
        start = end - self.period
        values: dict[str, float | None] = {}

        def value_of(query_id: str) -> float | None:
            if query_id in values:
                return values[query_id]
            query = self.queries[query_id]
            if "MetricStat" in query:
                stat = query["MetricStat"]
                metric = stat["Metric"]
                dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
                obs = store.observations(metric["Namespace"], metric["MetricName"], dims, start, end, stat.get("Unit"))
                result = statistic(stat["Stat"], obs)
            elif query["Expression"].lstrip().upper().startswith("SELECT"):
                result = insights(store, query["Expression"], start, end)
            else:
                env = {qid: value_of(qid) for qid in self.queries if qid != query_id and qid in query["Expression"]}
                result = math_expression(query["Expression"], env)
            values[query_id] = result
            return result

        return value_of(self.result)

    def breaching(self, value: float) -> bool:
        return self.compare(value, self.threshold)

    def evaluate(self, store: MetricStore, now: float) -> str:
        """Evaluate at ``now`` (a whole minute) and return the new state."""
        points = [self.datapoint(store, now - k * self.period) for k in range(self.n + self.extra_range)]
        real = [p for p in points if p is not None]
        if len(real) >= self.n:
            breaches = sum(self.breaching(p) for p in real[: self.n])
            new = ALARM if breaches >= self.m else OK
        elif not real:
            new = {"missing": INSUFFICIENT, "ignore": self.state, "breaching": ALARM, "notBreaching": OK}[self.treat]
        else:
            fills = self.n - len(real)
            breaches = sum(self.breaching(p) for p in real)
            if self.treat == "breaching":
                new = ALARM if breaches + fills >= self.m else OK
            elif self.treat == "notBreaching":
                new = ALARM if breaches >= self.m else OK
            elif self.treat == "ignore":
                new = self.state
            else:  # missing
                new = ALARM if self._oldest_breach_rule(points) else (ALARM if breaches >= self.m else OK)
        if new != self.state:
            self.history.append(Transition(now, new, points))
            self.state = new
        return new

    def _oldest_breach_rule(self, points: list[float | None]) -> bool:
        """ALARM when the oldest breaching datapoint is at least M periods old and all newer are breaching or missing."""
        ages = [age for age, p in enumerate(points, start=1) if p is not None and self.breaching(p)]
        if not ages or max(ages) < self.m:
            return False
        return all(p is None or self.breaching(p) for p in points[: max(ages) - 1])

    def run(self, store: MetricStore, start: float, end: float) -> list[Transition]:
        """Evaluate every minute from ``start`` to ``end``; the transitions that happened."""
        t = float(int(start // MINUTE) * MINUTE)
        before = len(self.history)
        while t <= end:
            self.evaluate(store, t)
            t += MINUTE
        return self.history[before:]

    def first_alarm(self, store: MetricStore, start: float, end: float) -> float | None:
        for transition in self.run(store, start, end):
            if transition.state == ALARM:
                return transition.at
        return None
