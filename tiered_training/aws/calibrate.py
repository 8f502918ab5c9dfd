"""``calibrate --from-runs``: the account's own runs as calibration (tiered_training/planning/overlay.py).

For each recipe, the full runs' steady-state throughput comes from the container's EMF metric
``TokensPerSecondPerGpu`` (namespace ``TieredTraining``, dimension ``Recipe``) through ``GetMetricData``: the
per-minute averages of the window, the first quarter left out (compile, warm-up), their median. The shipped
model's prediction for the same configuration is the recipe's plan without an overlay.

The probes add a point per candidate they measured: the recipe's executions of the window
(``ListPipelineExecutions``), each one's Probe job (``ListPipelineExecutionSteps``) and its per-candidate
tokens/s (``DescribeTrainingJob``'s FinalMetricDataList, aws/probe_runs.py), against that candidate's
prediction in the plan, in its own precision. A candidate that ran out of memory (0 tokens/s) is no point.

The overlay fitted on the given recipes is stored as each recipe's own, in its checkpoint store
(``s3://<store>/calibration/<recipe>/overlay.json``, the bucket of the recipe's deployed pipeline: only that recipe's
operators may write it), and cached locally (``planning.overlay.cache_path(recipe)``), where ``plan`` reads it.

Every AWS call goes through :func:`tiered_training.aws.session.aws_errors`: one line, no traceback.
"""

from __future__ import annotations

import json
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiered_training.aws.session import aws_errors
from tiered_training.contract import metrics as catalogue
from tiered_training.planning.overlay import Measurement, Overlay, cache_path, store_key

if TYPE_CHECKING:
    from tiered_training.planning.plan import Plan

WINDOW = timedelta(days=14)
MIN_POINTS = 4  # per-minute averages a run needs to count: fewer is no steady state


def steady_state(cw: Any, recipe_name: str, now: datetime | None = None) -> tuple[float | None, int]:
    """The median tokens/s per GPU of the recipe's metric over ``WINDOW`` after its first quarter, and the
    number of per-minute points it rests on (None with fewer than ``MIN_POINTS``)."""
    now = now or datetime.now(UTC)
    spec = catalogue.TOKENS_PER_SECOND_PER_GPU
    query = {
        "Id": "tps",
        "MetricStat": {
            "Metric": {
                "Namespace": catalogue.NAMESPACE,
                "MetricName": spec.name,
                "Dimensions": [{"Name": "Recipe", "Value": recipe_name}],
            },
            "Period": 60,
            "Stat": "Average",
        },
    }
    pairs: list[tuple[datetime, float]] = []
    token = None
    with aws_errors(f"read {spec.name} of {recipe_name}"):
        while True:
            extra: dict[str, str] = {"NextToken": token} if token else {}
            answer = cw.get_metric_data(MetricDataQueries=[query], StartTime=now - WINDOW, EndTime=now, **extra)
            for result in answer.get("MetricDataResults", []):
                pairs += zip(result.get("Timestamps", []), result.get("Values", []))
            token = answer.get("NextToken")
            if not token:
                break
    values = [float(v) for _, v in sorted(pairs, key=lambda p: p[0]) if v > 0]
    steady = values[len(values) // 4 :]
    if len(steady) < MIN_POINTS:
        return None, len(steady)
    return statistics.median(steady), len(steady)


def measurements(cw: Any, plans: list[Plan], now: datetime | None = None) -> tuple[list[Measurement], list[str]]:
    """One measurement per recipe with a steady state, and a line for each recipe left out."""
    found, skipped = [], []
    for plan in plans:
        if plan.estimates is None:
            skipped.append(f"{plan.name}: its plan has errors")
            continue
        measured, points = steady_state(cw, plan.name, now)
        if measured is None:
            skipped.append(f"{plan.name}: {points} per-minute points of {catalogue.TOKENS_PER_SECOND_PER_GPU.name}")
            continue
        found.append(
            Measurement(
                run=plan.name,
                instance_type=plan.instance.name,
                precision=plan.precision,
                measured=measured,
                predicted=plan.estimates.tokens_per_second_per_gpu,
            )
        )
    return found, skipped


MAX_EXECUTIONS = 20  # the newest executions of a recipe whose probes are read


def probe_measurements(
    sm: Any, plans: list[Plan], pipelines: list[str], now: datetime | None = None
) -> tuple[list[Measurement], list[str]]:
    """One measurement per candidate each recent probe measured, and a line for what could not be read."""
    from tiered_training.aws import probe_runs, runs
    from tiered_training.aws.session import StartError

    now = now or datetime.now(UTC)
    found: list[Measurement] = []
    skipped: list[str] = []
    for plan, pipeline in zip(plans, pipelines, strict=True):
        if plan.estimates is None:
            continue
        try:
            with aws_errors(f"list the executions of pipeline {pipeline}"):
                listed = sm.list_pipeline_executions(
                    PipelineName=pipeline,
                    CreatedAfter=now - WINDOW,
                    SortBy="CreationTime",
                    SortOrder="Descending",
                    MaxResults=MAX_EXECUTIONS,
                ).get("PipelineExecutionSummaries", [])
            for execution in listed:
                steps = [runs.step_summary(s) for s in runs.execution_steps(sm, execution["PipelineExecutionArn"])]
                probe, problem = probe_runs.read_for_steps(sm, steps)
                if problem is not None:
                    skipped.append(f"{plan.name}: {problem}")
                if probe is None:
                    continue
                for candidate in plan.candidates:
                    measured = probe.candidates.get(candidate.number)
                    tps = measured.tokens_per_second_per_gpu if measured else None
                    if not tps or tps <= 0:
                        continue
                    found.append(
                        Measurement(
                            run=f"{probe.training_job}#{candidate.number}",
                            instance_type=plan.instance.name,
                            precision=candidate.precision,
                            measured=tps,
                            predicted=candidate.tokens_per_second_per_gpu,
                            kind="probe",
                        )
                    )
        except StartError as error:
            skipped.append(f"{plan.name}: probes: {error}")
    return found, skipped


def store(s3: Any, bucket: str, recipe: str, overlay: Overlay, cache: Path | None = None) -> str:
    """Write the overlay as ``recipe``'s, to its store and the local cache; returns its S3 URI."""
    body = json.dumps(overlay.to_dict(), indent=1, sort_keys=True) + "\n"
    key = store_key(recipe)
    with aws_errors(f"write s3://{bucket}/{key}"):
        s3.put_object(Bucket=bucket, Key=key, Body=body.encode(), ContentType="application/json")
    path = cache or cache_path(recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(body)
    tmp.replace(path)
    return f"s3://{bucket}/{key}"


def fetch(s3: Any, bucket: str, recipe: str) -> Overlay | None:
    """The recipe's stored overlay, or None when there is none."""
    try:
        body = s3.get_object(Bucket=bucket, Key=store_key(recipe))["Body"].read()
    except Exception as exc:  # NoSuchKey, AccessDenied: no overlay to use
        if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404", "AccessDenied"):
            return None
        raise
    return Overlay.from_dict(json.loads(body))
