"""What a recipe needs of the account's SageMaker service quotas, and how to raise them.

The quotas are data (``catalog/quotas.yaml``: title, code, default, source). A recipe states
the account's applied values under ``compute.quotas``; anything it does not state is taken at
AWS's default. :func:`needs` lists every quota a recipe's pipeline uses with the value it
needs; :func:`findings` turns each need above the applied value into a planner warning that
names the quota, its code, the needed and applied values and the command that raises it.
``tiered-training preflight`` compares the same needs with the account's applied values.

Pure Python: no boto3, no aws_cdk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from tiered_training.catalog import Quota, quotas

if TYPE_CHECKING:
    from tiered_training.planning.plan import Finding, PlanResult
    from tiered_training.recipe import Recipe

FINDING_CODE = "quota-needed"
_PlanT = TypeVar("_PlanT", bound="PlanResult")


@dataclass(frozen=True)
class Need:
    """One quota a recipe's pipeline uses, the value it needs, and what uses it."""

    quota: Quota
    needed: float
    why: str
    field: str  # the recipe field the need comes from

    def applied(self, recipe: Recipe, account: Mapping[str, float] | None = None) -> float:
        """The recipe's stated value (compute.quotas), else the app's (``account``), else AWS's default."""
        return applied_values(recipe, account).get(self.quota.name, self.quota.default)


def applied_values(recipe: Recipe, account: Mapping[str, float] | None = None) -> dict[str, float]:
    """The applied quotas the plan may count on: the app's (``-c quotas=...``), the recipe's on top."""
    return {**(account or {}), **recipe.compute.quotas}


def runtime_need(recipe: Recipe) -> float:
    """Seconds one training job asks for: each segment's ``StoppingCondition.MaxRuntimeInSeconds``.

    The one place the runtime quota's need is computed. A run longer than that is split into
    segments (``segments.py``), so the need is one job's, never the whole run's.
    """
    from tiered_training.planning.segments import job_runtime_seconds

    return job_runtime_seconds(recipe)


def uses_warm_pool(recipe: Recipe) -> bool:
    """Whether an execution's Probe job keeps its instances in a warm pool: ``definition.training_arguments``
    sets ``KeepAlivePeriodInSeconds`` on the probe unless the job is managed spot (which warm pools do
    not support), and the probe runs by default unless ``probe.enabled`` is false."""
    return not recipe.compute.spot and recipe.probe.enabled


def processing_needs(recipe: Recipe, instances: int) -> list[Need]:
    """The Prepare job of ``data.sources``: ``instances`` hosts of its Processing instance type."""
    catalog = quotas()
    prepare = recipe.data.prepare
    kind = prepare.instance_type if prepare else "ml.m5.4xlarge"
    name = f"processing/{kind}"
    if name not in catalog:
        return []
    return [Need(catalog[name], instances, f"the Prepare job on {instances} x {kind}", "data.prepare.instance_count")]


def needs(recipe: Recipe, prepare_instances: int | None = None) -> list[Need]:
    """Every catalogued quota the recipe's pipeline uses, with the value it needs.

    The Probe and Train jobs run one after the other on ``compute.instance_count`` instances
    (Train reuses the probe's warm pool), so the instance needs are the count itself.
    """
    catalog = quotas()
    compute = recipe.compute
    count = compute.instance_count
    kind = "spot-training" if compute.spot else "training"
    spot = "spot " if compute.spot else ""
    out = [
        Need(
            catalog["training-job-max-runtime"],
            runtime_need(recipe),
            "a training job's MaxRuntimeInSeconds",
            "compute.max_runtime_hours",
        )
    ]

    def add(name: str, why: str) -> None:
        if name in catalog:
            out.append(Need(catalog[name], count, why, "compute.instance_count"))

    add(f"{kind}/{compute.instance_type}", f"a {spot}training job on {count} x {compute.instance_type}")
    add(f"{kind}-instances", f"a {spot}training job on {count} instances")
    add(f"{kind}-job-instances", f"a {spot}training job on {count} instances")
    if uses_warm_pool(recipe):
        add(
            f"warm-pool/{compute.instance_type}",
            f"the probe's warm pool (kept for the full run) of {count} x {compute.instance_type}",
        )
    if prepare_instances is not None:
        out += processing_needs(recipe, prepare_instances)
    return out


def shortfalls(
    recipe: Recipe, account: Mapping[str, float] | None = None, prepare_instances: int | None = None
) -> list[Need]:
    """The needs above the applied value (compute.quotas, else the app's, else AWS's default)."""
    return [need for need in needs(recipe, prepare_instances) if need.needed > need.applied(recipe, account)]


def findings(
    recipe: Recipe,
    account: Mapping[str, float] | None = None,
    prepare_instances: int | None = None,
    only_processing: bool = False,
) -> list[Finding]:
    """A warning for each quota the plan needs beyond its applied value; ``prepare_instances``: the Prepare
    job's hosts (``data.sources``), whose Processing quota is counted too."""
    from tiered_training.planning.plan import Finding

    return [
        Finding(
            "account", FINDING_CODE, _message(recipe, need, account), raise_fix(need.quota, need.needed), need.field
        )
        for need in shortfalls(recipe, account, prepare_instances)
        if not only_processing or need.field == "data.prepare.instance_count"
    ]


def parse_account(value: object, where: str = "context quotas") -> dict[str, float]:
    """An app's applied quotas: a mapping, or its JSON text (``cdk synth -c quotas='{...}'``).

    Raises ValueError with one line naming the bad entry and what would be valid.
    """
    import json

    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(
                f"{where}: not JSON; give an object such as '{{\"training/ml.p5.48xlarge\": 2}}'"
            ) from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: must be an object of quota name to applied value")
    catalog = quotas()
    out = {}
    for name, number in value.items():
        if name not in catalog:
            from tiered_training.recipe.keys import suggest

            hint = suggest(name, catalog, "quotas", "tiered_training/catalog/quotas.yaml")
            raise ValueError(f"{where}: unknown quota {name!r}; {hint}")
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number) or number < 0:
            raise ValueError(f"{where}: {name}: {number!r} is not a number >= 0")
        hard_max = catalog[name].hard_max
        if hard_max is not None and number > hard_max:
            raise ValueError(
                f"{where}: {name}: {number:,.0f} is above AWS's hard limit of {hard_max:,.0f} {catalog[name].unit}"
            )
        out[name] = float(number)
    return out


def prepare_instances(plan: PlanResult) -> int | None:
    """The hosts of the plan's Prepare job over data.sources (its Processing quota's need), else None."""
    corpus = getattr(plan, "corpus", None)
    return corpus.prepare.instance_count if corpus is not None else None


def with_account(plan: _PlanT, account: Mapping[str, float]) -> _PlanT:
    """The plan with its quota findings recomputed against the app's applied quotas."""
    if not account:
        return plan
    kept = tuple(f for f in plan.findings if f.code != FINDING_CODE)
    return replace(plan, findings=kept + tuple(findings(plan.recipe, account, prepare_instances(plan))))


def amount(quota: Quota, value: float) -> str:
    if quota.unit == "seconds":
        return f"{value:,.0f} s ({value / 3600:,.4g} h)"
    return f"{value:,.0f}"


def label(quota: Quota) -> str:
    """The quota's title and code, as a person searches for it."""
    return f"'{quota.title}' ({quota.code or 'code not published'})"


def _message(recipe: Recipe, need: Need, account: Mapping[str, float] | None = None) -> str:
    quota = need.quota
    if quota.name in recipe.compute.quotas:
        applied = f"compute.quotas states {amount(quota, need.applied(recipe))}"
    elif account and quota.name in account:
        applied = f"the app's context quotas state {amount(quota, account[quota.name])}"
    else:
        applied = f"AWS's default is {amount(quota, quota.default)}" + (
            "" if quota.default_published else " (assumed; none published)"
        )
    return f"{need.why} needs {amount(quota, need.needed)} of the quota {label(quota)}; {applied}"


def desired_value(quota: Quota, needed: float) -> int:
    return int(math.ceil(needed))


def increase_command(quota: Quota, needed: float) -> str:
    """The AWS CLI command that requests the increase (``CODE`` where no code is published)."""
    return (
        f"aws service-quotas request-service-quota-increase --service-code {quota.service} "
        f"--quota-code {quota.code or 'CODE'} --desired-value {desired_value(quota, needed)}"
    )


def find_code_command(quota: Quota) -> str:
    return (
        f"aws service-quotas list-service-quotas --service-code {quota.service} "
        f"--query \"Quotas[?QuotaName=='{quota.title}'].QuotaCode\""
    )


def raise_fix(quota: Quota, needed: float) -> str:
    """How to raise a quota to ``needed`` (AWS CLI, or the Service Quotas console), and how to tell the planner."""
    find = "" if quota.code else f"find its CODE with `{find_code_command(quota)}`, then "
    value = desired_value(quota, needed)
    return (
        f"{find}request {value:,} with `{increase_command(quota, needed)}` (or in the Service Quotas console); "
        f"once applied, set compute.quotas: {{{quota.name}: {value}}} (or the app's context quotas)"
    )
