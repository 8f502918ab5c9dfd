"""Pretraining from raw corpora (``data.sources``): each source's share of the budget and the epochs it implies,
and the Prepare job's size, wall time and cost.

The Prepare job tokenizes every source in full on ``instance_count`` Processing hosts. Its time is the corpus's
tokens over the catalogue's tokenization rate per vCPU (``catalog/processing.yaml``, the one place of that rate)
times the hosts' vCPUs. With ``data.prepare.instance_count: auto`` the planner takes the fewest hosts that keep
Prepare within ``max_share`` of the training's wall time.

Repeating a source more than ``max_epochs`` (default 4) is a warning: Muennighoff et al. 2023, "Scaling
Data-Constrained Language Models" (NeurIPS 2023, https://arxiv.org/abs/2305.16264) find up to about 4 epochs of
repeated data almost as good as unique data, and quickly less beyond.

Pure Python: no boto3, no aws_cdk.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tiered_training.catalog import processing
from tiered_training.recipe import AUTO

if TYPE_CHECKING:
    from tiered_training.planning.plan import Finding
    from tiered_training.recipe import Recipe

MAX_PREPARE_INSTANCES = 100  # ProcessingClusterConfig.InstanceCount's maximum (botocore's service model)
EPOCHS_SOURCE = (
    'Muennighoff et al. 2023, "Scaling Data-Constrained Language Models" (NeurIPS 2023): up to about 4 epochs '
    "of repeated data are almost as good as unique data"
)


@dataclass(frozen=True)
class SourcePlan:
    """One source: its share of the budget, the tokens it holds and the epochs that share implies."""

    name: str
    share: float  # of the budget
    budget_tokens: int  # the tokens the run takes from it
    held_tokens: int | None  # the tokens it holds (estimated); None: unknown until preflight samples it
    held_source: str
    epochs: float | None
    max_epochs: float


@dataclass(frozen=True)
class PreparePlan:
    """The Prepare job: hosts, the tokens it tokenizes and how long and how much."""

    instance_type: str
    instance_count: int
    count_reason: str
    vcpus: int  # per host
    tokens: int  # the tokens it tokenizes (every source in full, or its budget share where its size is unknown)
    tokens_per_vcpu_second: float
    rate_source: str
    hours: float
    price_per_hour: float | None  # per host
    cost_usd: float | None


@dataclass(frozen=True)
class CorpusPlan:
    sources: tuple[SourcePlan, ...]
    prepare: PreparePlan

    def to_dict(self) -> dict[str, Any]:
        return {"sources": [asdict(s) for s in self.sources], "prepare": asdict(self.prepare)}


def source_plans(recipe: Recipe) -> list[SourcePlan]:
    """Each source's share of ``budget.total_tokens`` (its weight over the weights' sum, or its tokens)."""
    sources = recipe.data.sources or []
    total = recipe.budget.total_tokens
    weights = [float(s.tokens) if s.tokens is not None else float(s.weight or 0) for s in sources]
    out = []
    for source, weight in zip(sources, weights, strict=True):
        share = weight / sum(weights)
        taken = round(share * total)
        held = source.tokens_estimate
        out.append(
            SourcePlan(
                name=source.name,
                share=share,
                budget_tokens=taken,
                held_tokens=held,
                held_source="the recipe's tokens_estimate" if held else "unknown: preflight estimates it from a sample",
                epochs=taken / held if held else None,
                max_epochs=source.max_epochs,
            )
        )
    return out


def prepare_plan(recipe: Recipe, sources: list[SourcePlan], training_hours: float) -> PreparePlan | str:
    """The Prepare job's size, time and cost; a message where its instance type is not in the catalogue."""
    prepare = recipe.data.prepare
    catalogue = processing()
    instance_type = prepare.instance_type if prepare else "ml.m5.4xlarge"
    instance = catalogue.instances.get(instance_type)
    if instance is None:
        return (
            f"data.prepare.instance_type {instance_type} is not a Processing instance of the catalogue "
            f"(tiered_training/catalog/processing.yaml): {', '.join(sorted(catalogue.instances))}"
        )
    tokens = sum(s.held_tokens or s.budget_tokens for s in sources)
    rate = catalogue.tokens_per_vcpu_second
    host_hours = tokens / (rate * instance.vcpus) / 3600  # one host's
    pinned = prepare.instance_count if prepare else AUTO
    if pinned != AUTO:
        count = int(pinned)
        reason = "the recipe's data.prepare.instance_count"
    else:
        share = prepare.max_share if prepare else 0.1
        allowed = share * training_hours
        count = max(1, math.ceil(host_hours / allowed)) if allowed > 0 else 1
        count = min(count, MAX_PREPARE_INSTANCES)
        reason = (
            f"the fewest hosts that tokenize {tokens:,} tokens within {share:.0%} of the training's "
            f"{training_hours:,.1f} h, at {rate / 1e6:.2f} M tokens per vCPU-second x {instance.vcpus} vCPUs"
        )
    hours = host_hours / count
    price = instance.price_per_hour
    return PreparePlan(
        instance_type=instance_type,
        instance_count=count,
        count_reason=reason,
        vcpus=instance.vcpus,
        tokens=tokens,
        tokens_per_vcpu_second=rate,
        rate_source=catalogue.rate_source,
        hours=hours,
        price_per_hour=price,
        cost_usd=None if price is None else hours * count * price,
    )


def corpus_findings(recipe: Recipe, plan: CorpusPlan) -> list[Finding]:
    """Epochs above a source's max_epochs, sizes unknown, and a Prepare job above its share or its runtime."""
    from tiered_training.planning.plan import Finding

    out = []
    for index, source in enumerate(plan.sources):
        where = f"data.sources.{index}"
        if source.epochs is None:
            out.append(
                Finding(
                    "info",
                    "source-size-unknown",
                    f"source {source.name}: the tokens it holds are unknown, so are its epochs; Prepare is sized on "
                    f"its budget share ({source.budget_tokens:,} tokens)",
                    field=where,
                )
            )
        elif source.epochs > source.max_epochs:
            out.append(
                Finding(
                    "warning",
                    "source-epochs",
                    f"source {source.name}: its share, {source.budget_tokens:,} tokens, repeats its "
                    f"{source.held_tokens:,} tokens {source.epochs:.1f} times, above max_epochs "
                    f"{source.max_epochs:g} ({EPOCHS_SOURCE}, and fall off beyond)",
                    "lower its weight, add data, or raise max_epochs to accept the repetition",
                    f"{where}.weight",
                )
            )
    prepare = plan.prepare
    limit = recipe.data.prepare.max_runtime_hours if recipe.data.prepare else 24.0
    if prepare.hours > limit:
        out.append(
            Finding(
                "error",
                "prepare-runtime",
                f"Prepare tokenizes {prepare.tokens:,} tokens in {prepare.hours:,.1f} h on {prepare.instance_count} "
                f"x {prepare.instance_type}, above data.prepare.max_runtime_hours {limit:g}",
                "raise data.prepare.instance_count, choose an instance with more vCPUs, or raise max_runtime_hours",
                "data.prepare.instance_count",
            )
        )
    return out
