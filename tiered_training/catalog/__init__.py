"""The catalogues: instances, models, tiers and the performance model's parameters, loaded from ``catalog/*.yaml``.

The YAML files are the single source of these facts; each carries its sources and
the date it was checked. Loading is lazy and cached.
"""

import math
import os
import re
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from tiered_training.catalog import parsed
from tiered_training.contract.architecture import Architecture

CATALOG_DIR = Path(__file__).parent
GIB = 1024**3


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Instance(_Entry):
    name: str
    gpu: str
    gpus: int
    usable_hbm_gib: float
    peak_bf16_tflops: float
    peak_fp8_tflops: float | None
    mxfp8: bool
    hbm_tbps: float = Field(gt=0, description="HBM bandwidth per GPU, TB/s")
    nvlink_gbytes_per_s: float = Field(gt=0, description="NVLink bandwidth per GPU and direction, GB/s")
    matmul_bf16_fraction: float = Field(
        default=1.0, gt=0, le=1, description="the best BF16 matmul's measured TFLOPS over the datasheet peak (MAMF)"
    )
    matmul_fp8_fraction: float = Field(
        default=1.0, gt=0, le=1, description="the best FP8 matmul's measured TFLOPS over the datasheet peak (MAMF)"
    )
    efa_gbps: int = Field(description="EFA bandwidth per instance, Gbit/s")
    rdma: bool
    family: str
    spot_discount: float = Field(
        default=0.0, ge=0, lt=1, description="expected saving of managed spot over on-demand (an estimate)"
    )
    spot_source: str = ""

    @property
    def fp8(self) -> bool:
        return self.peak_fp8_tflops is not None

    @property
    def hbm_bytes(self) -> int:
        return int(self.usable_hbm_gib * GIB)

    @property
    def peak_bf16_flops(self) -> float:
        return self.peak_bf16_tflops * 1e12

    def price(
        self, override: float | None = None, *, spot: bool = False, region: str | None = None
    ) -> tuple[float | None, str]:
        """Price per node-hour and where it came from, in this order: the recipe's
        ``compute.price_per_hour``, the environment's ``TIERED_TRAINING_PRICE_<INSTANCE>``, the
        user's cache of AWS's price list (``tiered-training prices``), the price catalogue.

        Where none has a price, the price is None and the source says how to get one. A bad
        environment value raises :class:`PriceError`. With ``spot``, an on-demand price is cut by
        the catalogue's expected spot discount, and the source says it is an estimate. A recipe's
        own ``compute.price_per_hour`` is taken as the price paid.
        """
        if override is not None:
            return override, "recipe compute.price_per_hour"
        price, source = self.on_demand_price(region)
        if spot and price is not None:
            price *= 1 - self.spot_discount
            source += f"; spot: expected {self.spot_discount:.0%} below on-demand (estimate)"
        return price, source

    def on_demand_price(self, region: str | None = None) -> tuple[float | None, str]:
        """The on-demand price per node-hour in ``region`` and its source: environment, cache or catalogue."""
        from tiered_training.catalog import price_cache

        table = prices()
        region = region or table.default_region
        var = price_variable(self.name)
        if var in os.environ:
            return environment_price(var), f"environment {var}"
        cached, problem = price_cache.lookup(region, self.name)
        if cached is not None:
            return cached.price_per_hour, cached.source()
        price = table.regions.get(region, {}).get(self.name)
        if price is not None:
            return price, f"SageMaker training, {region}, checked {table.checked}, {table.source}"
        cache = problem or "nor in the price cache"
        return None, (
            f"no published SageMaker training price for {self.name} in {region} in the catalogue "
            f"(checked {table.checked}), {cache}; run `tiered-training prices --region {region}` to read "
            f"AWS's price list, or set compute.price_per_hour or {var}"
        )

    def spot_range(self, on_demand: float) -> tuple[float, float]:
        """Spot's price per node-hour as a range: ``on_demand`` less the catalogue's smallest and largest
        expected spot saving (:func:`spot_savings`). An estimate."""
        low, high = spot_savings()
        return on_demand * (1 - high), on_demand * (1 - low)


MAX_PRICE = 100_000  # the bound of compute.price_per_hour


class PriceError(ValueError):
    """A ``TIERED_TRAINING_PRICE_<INSTANCE>`` value that is not a price."""

    def __init__(self, variable: str, value: str):
        self.variable, self.value = variable, value
        super().__init__(
            f"environment {variable}={value[:40]!r}: not a price; give US dollars per instance-hour, "
            f"a number above 0 and at most {MAX_PRICE:,} (like 98.5), or unset it"
        )


def environment_price(variable: str) -> float:
    """The price in the environment variable ``variable``; :class:`PriceError` for one that is not a price."""
    text = os.environ[variable]
    try:
        value = float(text)
    except ValueError:
        raise PriceError(variable, text) from None
    if not (math.isfinite(value) and 0 < value <= MAX_PRICE):
        raise PriceError(variable, text)
    return value


def spot_savings() -> tuple[float, float]:
    """The smallest and the largest expected spot saving in the instance catalogue (estimates)."""
    discounts = [i.spot_discount for i in instances().values() if i.spot_discount > 0]
    return (min(discounts), max(discounts)) if discounts else (0.0, 0.0)


SPOT_RANGE_SOURCE = (
    "an estimate: on-demand less {low:.0%}-{high:.0%}, the instance catalogue's expected spot savings "
    "(tiered_training/catalog/instances.yaml; AWS quotes up to 90% for managed spot training)"
)


def price_variable(instance_type: str) -> str:
    return "TIERED_TRAINING_PRICE_" + re.sub(r"[^A-Z0-9]", "_", instance_type.upper())


class Prices(_Entry):
    """SageMaker training prices by region (``catalog/prices.yaml``), with their source and the date read."""

    source: str
    checked: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    default_region: str
    regions: dict[str, dict[str, Annotated[float, Field(gt=0)]]]


class CatalogModel(_Entry):
    id: str
    display_name: str
    source: str
    published_parameters: float
    architecture: Architecture
    hf_id: str | None = None  # the Hugging Face id of the published checkpoint (the source's model card)


class Tier(_Entry):
    name: str
    max_parameters: float
    min_parameters: float = 0.0
    precision: Literal["bf16", "fp8", "fp32"]
    precision_why: str
    activation_checkpointing: Literal["none", "selective", "full"]
    checkpointing_why: str
    batch: Literal["largest"]
    batch_why: str
    batch_ramp: bool
    memory_headroom: float = Field(gt=0, le=1)
    min_nodes: int
    distribution: str
    fine_tuning: Literal["full", "lora"] = Field(default="full", description="task sft: the default of tuning.adapter")
    fine_tuning_why: str = ""
    lora_min_nodes: int | None = Field(default=None, description="nodes a LoRA run needs; default min_nodes")

    def min_nodes_for(self, lora: bool) -> int:
        return (self.lora_min_nodes or self.min_nodes) if lora else self.min_nodes


class Quota(_Entry):
    """A service quota that decides whether a plan can run (``catalog/quotas.yaml``)."""

    name: str
    code: str | None = Field(
        pattern=r"^L-[0-9A-F]{8}$", description="the Service Quotas code; None where no public page names it"
    )
    service: str
    title: str = Field(description="the quota's name as the Service Quotas console and API spell it")
    unit: Literal["seconds", "instances", "count"]
    instance_type: str | None = Field(default=None, description="the instance type a per-type quota counts")
    default: float = Field(ge=0)
    default_published: bool = Field(default=True, description="False where AWS publishes no default and 0 is assumed")
    hard_max: float | None = Field(default=None, description="a limit no quota raise lifts (an API bound)")
    adjustable: bool
    source: str
    note: str = ""


class PerformanceSummary(_Entry):
    """How well the model predicts: each source's rows predicted by the model refitted without it."""

    rows: int
    published_rows: int
    own_rows: int  # this container's GPU-check runs
    sources: int
    loso_median_error: float | None
    loso_worst_error: float | None
    loso_memory_median_error: float | None = None
    loso_memory_worst_error: float | None = None
    loso_published_median_error: float | None = None  # throughput, the published sources' rows
    loso_published_worst_error: float | None = None
    loso_own_median_error: float | None = None  # throughput, this container's own runs
    loso_own_worst_error: float | None = None
    # {dimension: {value: {rows, median, worst, low, high}}}: the held-out errors by kind of run
    # (planning/uncertainty.py), which the plan's ranges come from
    loso_by_kind: dict[str, dict[str, dict[str, int | float]]] = {}
    loso_runs: list[dict[str, str | float]] = []  # each held-out run: its kind of run and its error

    @property
    def published_sources(self) -> int:
        return self.sources - (self.own_rows > 0)

    def wording(self) -> str:
        """What the model is calibrated on, published runs apart from this container's own."""
        text = f"calibrated on {self.published_rows} published runs from {self.published_sources} sources"
        if self.own_rows:
            text += f", plus {self.own_rows} run{'s' * (self.own_rows != 1)} of this container (its GPU checks)"
        if self.loso_published_median_error is not None:
            text += (
                f"; each source predicted by the model fitted without it: published runs within "
                f"{self.loso_published_median_error:.0%} (median, worst {self.loso_published_worst_error:.0%})"
            )
            if self.loso_own_median_error is not None:
                text += (
                    f", this container's runs within {self.loso_own_median_error:.0%} "
                    f"(median, worst {self.loso_own_worst_error:.0%})"
                )
        return text


class PerformanceModel(_Entry):
    """``catalog/performance.yaml``: the performance model's parameters and how well they predict."""

    fitted: dict
    calibration_only: dict[str, float]
    fixed: dict[str, float]
    summary: PerformanceSummary


def _load(name: str) -> dict:
    return parsed.load(CATALOG_DIR / name)


@cache
def instances() -> dict[str, Instance]:
    return {name: Instance(name=name, **entry) for name, entry in _load("instances.yaml").items()}


@cache
def prices() -> "Prices":
    return Prices(**_load("prices.yaml"))


@cache
def models() -> dict[str, CatalogModel]:
    return {name: CatalogModel(id=name, **entry) for name, entry in _load("models.yaml").items()}


@cache
def tiers() -> tuple[Tier, ...]:
    """Tiers in ascending size order."""
    loaded = [Tier(name=name, **entry) for name, entry in _load("tiers.yaml").items()]
    return tuple(sorted(loaded, key=lambda tier: tier.max_parameters))


@cache
def quotas() -> dict[str, Quota]:
    return {name: Quota(name=name, **entry) for name, entry in _load("quotas.yaml").items()}


@cache
def performance_model() -> "PerformanceModel":
    return PerformanceModel(**_load("performance.yaml"))


def tier_for(parameters: int) -> tuple[Tier, bool]:
    """The tier for a parameter count, and whether the count lies inside the tiers' range."""
    ordered = tiers()
    inside = ordered[0].min_parameters <= parameters <= ordered[-1].max_parameters
    for tier in ordered:
        if parameters <= tier.max_parameters:
            return tier, inside
    return ordered[-1], inside


class ProcessingInstance(_Entry):
    """A CPU instance of the Prepare step's Processing job (``catalog/processing.yaml``)."""

    name: str
    vcpus: int = Field(ge=1)
    memory_gib: float = Field(gt=0)
    price_per_hour: float | None = Field(default=None, gt=0, description="us-east-1 on-demand; None: not recorded")


class Processing(_Entry):
    tokens_per_vcpu_second: float = Field(gt=0)
    rate_source: str
    bytes_per_token: float = Field(gt=0)
    bytes_per_token_source: str
    instances: dict[str, ProcessingInstance]


@cache
def processing() -> "Processing":
    """The Prepare step's instances and the one tokenization rate the planner sizes it with."""
    data = _load("processing.yaml")
    data["instances"] = {name: {"name": name, **entry} for name, entry in data["instances"].items()}
    return Processing(**data)
