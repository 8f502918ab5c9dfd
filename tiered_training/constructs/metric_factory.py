"""TrainingMetricFactory: CloudWatch metrics of one recipe, from the shared catalogue.

Pure: it creates ``Metric`` and ``MathExpression`` objects (no constructs), so the
alarms and the dashboard build on the same definitions. Every name, unit and
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
            expression=f'SELECT {aggregate}("{metric_name}") FROM "{HOST_NAMESPACE}" GROUP BY Host',
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
