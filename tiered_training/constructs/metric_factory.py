"""TrainingMetricFactory: CloudWatch metrics of one recipe, from the shared catalogue.

Pure: it creates ``Metric`` and ``MathExpression`` objects (no constructs) for
users of the library, and the same definitions as plain CloudFormation dicts
(``*_query`` / ``*_graph`` methods, no jsii call at all), which the alarms and the
dashboard of :class:`TrainingMonitoring` are built from. Every name, unit and
dimension comes from :mod:`tiered_training.metrics`; the ``Recipe`` dimension is
the recipe name, which is stable, unlike generated training-job names.

Per-node metrics (``NODE_DIMENSIONS``: Recipe and Node=algo-N) are read through
CloudWatch Metrics Insights queries, which aggregate over however many nodes an
execution runs (``InstanceCount`` is a pipeline parameter).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from .. import metrics as catalogue
from ..metrics import MetricSpec

PIPELINE_NAMESPACE = "AWS/Sagemaker/ModelBuildingPipeline"
PIPELINE_DIMENSION = "PipelineName"
HOST_NAMESPACE = "/aws/sagemaker/TrainingJobs"
DEFAULT_PERIOD = Duration.minutes(5)
DEFAULT_PERIOD_SECONDS = 300  # CloudWatch's default period: dashboards leave it out

def _unit(spec: MetricSpec) -> cloudwatch.Unit:
    # Catalogue units are CloudWatch unit names ("Count/Second", "Gigabytes", ...);
    # the CDK enum member of "Count/Second" is COUNT_PER_SECOND.
    return getattr(cloudwatch.Unit, spec.unit.replace("/", "_PER_").upper())


class TrainingMetricFactory:
    """Metrics of one recipe (and its pipeline).

    - ``recipe_name``: the value of the ``Recipe`` dimension.
    - ``pipeline_name``: the ``PipelineName`` dimension of the pipeline metrics; default the recipe name.
    - ``period``: default 5 minutes.
    """

    def __init__(self, recipe_name: str, *, pipeline_name: str | None = None, period: Duration = DEFAULT_PERIOD) -> None:
        self.recipe_name = recipe_name
        self.pipeline_name = pipeline_name or recipe_name
        self.period = period
        # One jsii call here; the plain-dict methods below then need none.
        self.period_seconds = DEFAULT_PERIOD_SECONDS if period is DEFAULT_PERIOD else int(period.to_seconds())
        self.namespace = catalogue.NAMESPACE

    def dimensions(self, spec: MetricSpec) -> dict[str, str]:
        if spec.dimensions != catalogue.DIMENSIONS:
            raise ValueError(
                f"{spec.name} has dimensions {spec.dimensions}; use insights() for per-node metrics"
            )
        return {catalogue.DIMENSIONS[0]: self.recipe_name}

    def metric(
        self, spec: MetricSpec, *, statistic: str = "Average", period: Duration | None = None, label: str | None = None
    ) -> cloudwatch.Metric:
        """A job-wide metric (dimension Recipe)."""
        return cloudwatch.Metric(
            namespace=self.namespace,
            metric_name=spec.name,
            dimensions_map=self.dimensions(spec),
            unit=_unit(spec),
            statistic=statistic,
            period=period or self.period,
            label=label or spec.name,
        )

    def metric_named(self, name: str, **kwargs: Any) -> cloudwatch.Metric:
        return self.metric(catalogue.BY_NAME[name], **kwargs)

    def insights_query(self, spec: MetricSpec, aggregate: str = "AVG", *, group_by_node: bool = False) -> str:
        """A Metrics Insights query over every node of this recipe."""
        dims = ", ".join(spec.dimensions)
        query = (
            f'SELECT {aggregate}("{spec.name}") FROM SCHEMA("{self.namespace}", {dims}) '
            f"WHERE {catalogue.DIMENSIONS[0]} = '{self.recipe_name}'"
        )
        if group_by_node and "Node" in spec.dimensions:
            query += " GROUP BY Node"
        return query

    def insights(
        self, spec: MetricSpec, aggregate: str = "AVG", *, group_by_node: bool = False, period: Duration | None = None,
        label: str | None = None,
    ) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression=self.insights_query(spec, aggregate, group_by_node=group_by_node),
            period=period or self.period,
            label=label or f"{spec.name} ({aggregate.lower()} over nodes)",
        )

    def pipeline_metric(self, name: str, *, statistic: str = "Sum", period: Duration | None = None) -> cloudwatch.Metric:
        """A metric SageMaker publishes for the pipeline (ExecutionFailed, ExecutionSucceeded, ...)."""
        return cloudwatch.Metric(
            namespace=PIPELINE_NAMESPACE,
            metric_name=name,
            dimensions_map={PIPELINE_DIMENSION: self.pipeline_name},
            statistic=statistic,
            period=period or self.period,
        )

    def host_insights(self, metric_name: str, aggregate: str = "AVG", *, period: Duration | None = None) -> cloudwatch.MathExpression:
        """SageMaker's built-in host metrics (GPUUtilization, GPUMemoryUtilization, ...), per host.

        Their dimension is Host=<job>/algo-N, a generated name, so only a query can find them.
        """
        return cloudwatch.MathExpression(
            expression=self.host_insights_query(metric_name, aggregate),
            period=period or self.period,
            label=f"{metric_name} by host",
        )

    # -- the ones alarms use ------------------------------------------------------------------

    def tokens_per_second_per_gpu(self, **kwargs: Any) -> cloudwatch.Metric:
        return self.metric(catalogue.TOKENS_PER_SECOND_PER_GPU, **kwargs)

    def progress(self, statistic: str = "Maximum", **kwargs: Any) -> cloudwatch.Metric:
        return self.metric(catalogue.PROGRESS, statistic=statistic, **kwargs)

    def loss(self, statistic: str = "Maximum", **kwargs: Any) -> cloudwatch.Metric:
        return self.metric(catalogue.LOSS, statistic=statistic, **kwargs)

    def gpu_utilization(self, aggregate: str = "MIN", **kwargs: Any) -> cloudwatch.MathExpression:
        return self.insights(catalogue.GPU_UTILIZATION, aggregate, **kwargs)

    def peak_memory_fraction(self, aggregate: str = "MAX", **kwargs: Any) -> cloudwatch.MathExpression:
        return self.insights(catalogue.PEAK_MEMORY_FRACTION, aggregate, **kwargs)

    # -- plain CloudFormation / dashboard JSON (pure Python) ------------------------------------
    #
    # The same metrics as above, rendered as AWS::CloudWatch::Alarm ``Metrics`` entries
    # (MetricDataQuery) and as dashboard graph-widget metric arrays, exactly as CDK's
    # Alarm and GraphWidget render the objects above.

    def metric_stat(
        self, spec: MetricSpec, *, statistic: str = "Average", period_seconds: int | None = None
    ) -> dict[str, Any]:
        """A MetricStat (CloudFormation) of a job-wide metric (dimension Recipe)."""
        dims = self.dimensions(spec)
        return {
            "Metric": {
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "MetricName": spec.name,
                "Namespace": self.namespace,
            },
            "Period": period_seconds or self.period_seconds,
            "Stat": statistic,
            "Unit": spec.unit,
        }

    def metric_query(
        self, spec: MetricSpec, *, statistic: str = "Average", period_seconds: int | None = None,
        query_id: str = "m1", label: str | None = None, return_data: bool = True,
    ) -> dict[str, Any]:
        """A MetricDataQuery (CloudFormation) that reads one job-wide metric."""
        return {
            "Id": query_id,
            "Label": label or spec.name,
            "MetricStat": self.metric_stat(spec, statistic=statistic, period_seconds=period_seconds),
            "ReturnData": return_data,
        }

    def expression_query(
        self, expression: str, using: dict[str, dict[str, Any]] | None = None, *, label: str | None = None,
        period_seconds: int | None = None, query_id: str = "expr_1",
    ) -> list[dict[str, Any]]:
        """Alarm ``Metrics`` for a math expression (or Metrics Insights query) over ``using``
        (query ID -> :meth:`metric_query` with ``return_data=False``). A query with no
        metrics carries its own period; an expression over metrics takes theirs."""
        query: dict[str, Any] = {"Expression": expression, "Id": query_id}
        if label:
            query["Label"] = label
        if not using:
            query["Period"] = period_seconds or self.period_seconds
        query["ReturnData"] = True
        return [query] + [{**q, "Id": qid, "ReturnData": False} for qid, q in (using or {}).items()]

    def insights_alarm_query(self, spec: MetricSpec, aggregate: str = "AVG", *, label: str | None = None) -> list[dict[str, Any]]:
        """Alarm ``Metrics`` for a Metrics Insights query over every node of this recipe."""
        return self.expression_query(
            self.insights_query(spec, aggregate), label=label or f"{spec.name} ({aggregate.lower()} over nodes)"
        )

    def pipeline_alarm_metric(self, name: str, *, statistic: str = "Sum", period_seconds: int | None = None) -> dict[str, Any]:
        """Top-level alarm properties (MetricName, Namespace, ...) of a pipeline metric."""
        return {
            "Dimensions": [{"Name": PIPELINE_DIMENSION, "Value": self.pipeline_name}],
            "MetricName": name,
            "Namespace": PIPELINE_NAMESPACE,
            "Period": period_seconds or self.period_seconds,
            "Statistic": statistic,
        }

    def graph_metric(
        self, spec: MetricSpec, *, statistic: str = "Average", label: str | None = None, right: bool = False
    ) -> list[Any]:
        """A graph widget's metric array: namespace, name, dimension pairs, then options."""
        row: list[Any] = [self.namespace, spec.name]
        for key, value in self.dimensions(spec).items():
            row += [key, value]
        options: dict[str, Any] = {"label": label or spec.name}
        if right:
            options["yAxis"] = "right"
        if statistic != "Average":
            options["stat"] = statistic
        if self.period_seconds != DEFAULT_PERIOD_SECONDS:
            options["period"] = self.period_seconds
        return row + [options]

    def graph_expression(self, expression: str, *, label: str) -> list[Any]:
        """A graph widget's metric array for a math expression or Metrics Insights query."""
        options: dict[str, Any] = {"label": label, "expression": expression}
        if self.period_seconds != DEFAULT_PERIOD_SECONDS:
            options["period"] = self.period_seconds
        return [options]

    def graph_insights(self, spec: MetricSpec, aggregate: str = "AVG", *, group_by_node: bool = False, label: str) -> list[Any]:
        return self.graph_expression(self.insights_query(spec, aggregate, group_by_node=group_by_node), label=label)

    def host_insights_query(self, metric_name: str, aggregate: str = "AVG") -> str:
        """The Metrics Insights query of :meth:`host_insights`."""
        return f'SELECT {aggregate}("{metric_name}") FROM "{HOST_NAMESPACE}" GROUP BY Host'
