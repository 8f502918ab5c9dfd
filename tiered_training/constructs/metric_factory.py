"""TrainingMetricFactory: the CloudWatch metrics of one recipe, from the shared catalogue.

Pure, in the manner of cdk-monitoring-constructs' metric factories: it makes
``cloudwatch.Metric`` and ``cloudwatch.MathExpression`` objects and no construct, so
alarms, dashboards and users' own widgets are built on the same definitions. Every
name, unit and dimension comes from :mod:`tiered_training.contract.metrics`; the ``Recipe``
dimension is the recipe name, which is stable, unlike generated training-job names.

Per-node metrics (``NODE_DIMENSIONS``: Recipe and Node=algo-N) are read through
CloudWatch Metrics Insights queries, which aggregate over however many nodes an
execution runs (``InstanceCount`` is a pipeline parameter). No expression here is a
SEARCH: CloudWatch rejects SEARCH in alarms at deploy time.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from tiered_training.contract import metrics as catalogue
from tiered_training.contract.container import LOG_GROUP
from tiered_training.contract.metrics import MetricSpec
from tiered_training.planning.alarms import NAN_LOSS

PIPELINE_NAMESPACE = "AWS/Sagemaker/ModelBuildingPipeline"
PIPELINE_DIMENSION = "PipelineName"
HOST_NAMESPACE = LOG_GROUP  # the per-host EMF metrics land in the log group's namespace
DEFAULT_PERIOD = Duration.minutes(5)


def unit_of(spec: MetricSpec) -> cloudwatch.Unit:
    """The CDK unit of a catalogue unit name ("Count/Second" is ``Unit.COUNT_PER_SECOND``)."""
    return getattr(cloudwatch.Unit, spec.unit.replace("/", "_PER_").upper())


class TrainingMetricFactory:
    """Metrics of one recipe and its pipeline.

    :param recipe_name: the value of the ``Recipe`` dimension.
    :param pipeline_name: the ``PipelineName`` dimension of SageMaker's pipeline metrics;
        default the recipe name.
    :param period: the default period of every metric; default 5 minutes.
    """

    def __init__(
        self, recipe_name: str, *, pipeline_name: str | None = None, period: Duration = DEFAULT_PERIOD
    ) -> None:
        self.recipe_name = recipe_name
        self.pipeline_name = pipeline_name or recipe_name
        self.period = period
        self.namespace = catalogue.NAMESPACE

    # -- building blocks -------------------------------------------------------------------

    def metric(
        self, spec: MetricSpec, *, statistic: str = "Average", period: Duration | None = None, label: str | None = None
    ) -> cloudwatch.Metric:
        """A job-wide metric (dimension Recipe), with the catalogue's unit."""
        if spec.dimensions != catalogue.DIMENSIONS:
            raise ValueError(f"{spec.name} has dimensions {spec.dimensions}; use insights() for per-node metrics")
        return cloudwatch.Metric(
            namespace=self.namespace,
            metric_name=spec.name,
            dimensions_map={catalogue.DIMENSIONS[0]: self.recipe_name},
            unit=unit_of(spec),
            statistic=statistic,
            period=period or self.period,
            label=label or spec.name,
        )

    def metric_named(self, name: str, **kwargs) -> cloudwatch.Metric:
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
        self,
        spec: MetricSpec,
        aggregate: str = "AVG",
        *,
        group_by_node: bool = False,
        period: Duration | None = None,
        label: str | None = None,
    ) -> cloudwatch.MathExpression:
        """A Metrics Insights query as a MathExpression (``aggregate`` over every observation of every node)."""
        return cloudwatch.MathExpression(
            expression=self.insights_query(spec, aggregate, group_by_node=group_by_node),
            using_metrics={},
            period=period or self.period,
            label=label or f"{spec.name} ({aggregate.lower()} over nodes)",
        )

    def pipeline_metric(
        self, name: str, *, statistic: str = "Sum", period: Duration | None = None
    ) -> cloudwatch.Metric:
        """A metric SageMaker publishes for the pipeline (ExecutionFailed, ExecutionSucceeded, ...)."""
        return cloudwatch.Metric(
            namespace=PIPELINE_NAMESPACE,
            metric_name=name,
            dimensions_map={PIPELINE_DIMENSION: self.pipeline_name},
            statistic=statistic,
            period=period or self.period,
        )

    def host_insights_query(self, metric_name: str, aggregate: str = "AVG") -> str:
        return f'SELECT {aggregate}("{metric_name}") FROM "{HOST_NAMESPACE}" GROUP BY Host'

    def host_insights(
        self, metric_name: str, aggregate: str = "AVG", *, period: Duration | None = None
    ) -> cloudwatch.MathExpression:
        """SageMaker's built-in host metrics (GPUUtilization, ...) of every training job, per host.

        Their dimension is Host=<job>/algo-N, a generated name, so only a query can find them.
        """
        return cloudwatch.MathExpression(
            expression=self.host_insights_query(metric_name, aggregate),
            using_metrics={},
            period=period or self.period,
            label=f"{metric_name} by host",
        )

    # -- what the alarms watch ---------------------------------------------------------------

    def tokens_per_second_per_gpu(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        return self.metric(catalogue.TOKENS_PER_SECOND_PER_GPU, period=period)

    def least_gpu_utilization(self, *, period: Duration | None = None) -> cloudwatch.MathExpression:
        """The lowest node GPU utilisation reported in the period (MIN over every node's observations)."""
        return self.insights(catalogue.GPU_UTILIZATION, "MIN", period=period, label="GPU utilisation, least busy node")

    def gpu_xid_events(self, *, period: Duration | None = None) -> cloudwatch.MathExpression:
        """The most critical XID events any one GPU reported in an event of the period."""
        return self.insights(catalogue.GPU_XID, "MAX", period=period, label="XID events, any GPU")

    def most_memory(self, *, period: Duration | None = None) -> cloudwatch.MathExpression:
        """The highest node peak-memory fraction reported in the period."""
        return self.insights(catalogue.PEAK_MEMORY_FRACTION, "MAX", period=period, label="peak memory, fullest node")

    def loss_or_nan(self, *, period: Duration | None = None) -> cloudwatch.MathExpression:
        """The period's highest loss, or 1e9 when a step's loss was not finite (the container
        leaves NaN out of the Loss metric, which CloudWatch would reject, and counts it)."""
        return cloudwatch.MathExpression(
            expression=f"FILL(loss, 0) + {NAN_LOSS:.0f} * nonfinite",
            using_metrics={
                "loss": self.metric(catalogue.LOSS, statistic="Maximum", period=period),
                "nonfinite": self.metric(catalogue.NON_FINITE_LOSS, statistic="Sum", period=period),
            },
            period=period or self.period,
            label="loss (1e9 = not finite)",
        )

    def stalled(self, min_reports: int, *, period: Duration | None = None) -> cloudwatch.MathExpression:
        """1 when the period holds at least ``min_reports`` progress reports (the run was alive:
        the heartbeat sends one a minute) and all of them carry the same step count."""
        return cloudwatch.MathExpression(
            expression=f"IF(reports >= {min_reports} AND last - first == 0, 1, 0)",
            using_metrics={
                "reports": self.metric(catalogue.PROGRESS, statistic="SampleCount", period=period),
                "last": self.metric(catalogue.PROGRESS, statistic="Maximum", period=period),
                "first": self.metric(catalogue.PROGRESS, statistic="Minimum", period=period),
            },
            period=period or self.period,
            label="stalled (1 = alive without progress)",
        )

    def validation_gap(self, *, period: Duration | None = None) -> cloudwatch.MathExpression:
        """Validation loss minus the mean training loss of the same period."""
        return cloudwatch.MathExpression(
            expression="validation - training",
            using_metrics={
                "validation": self.metric(catalogue.VALIDATION_LOSS, statistic="Maximum", period=period),
                "training": self.metric(catalogue.LOSS, statistic="Average", period=period),
            },
            period=period or self.period,
            label="validation loss - training loss",
        )

    def execution_failed(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        return self.pipeline_metric("ExecutionFailed", period=period)
