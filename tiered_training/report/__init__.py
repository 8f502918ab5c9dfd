"""Render plans for people and machines: text tables, markdown for pull requests, stable JSON, diffs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tiered_training import catalog as catalogs
from tiered_training.planning import preference
from tiered_training.planning.plan import Finding, Plan, finding_place, format_finding
from tiered_training.planning.plan import finding_line as finding_line  # the JSON and its tests read it here
from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.report.render import Hang

GIB = 1024**3
SCHEMA_VERSION = 3  # 2: estimates.throughput_source and step_terms, departures, alternatives, tuning.context_parallel
# 3: every command's JSON has ok, exit_code and errors, in one shape per command (cli/output.py)


def _hours(hours: float) -> str:
    return f"{hours / 24:,.1f} d" if hours >= 48 else f"{hours:,.1f} h"


def summary_row(plan: Plan) -> dict[str, str]:
    """One plan as a row of short strings (shared by the text and markdown tables)."""
    if not plan.ok or plan.memory is None or plan.estimates is None:
        return {
            "recipe": plan.name,
            "model": plan.model_name,
            "tier": plan.tier.name if plan.tier else "-",
            "compute": f"{plan.nodes}x {plan.recipe.compute.instance_type}",
            "status": _status(plan),
        }
    est = plan.estimates
    precision = plan.precision + (f"/{plan.fp8_recipe}" if plan.fp8_recipe else "")
    task = {"none": ", SFT", "lora": ", LoRA"}.get(plan.adapter or "", "")
    return {
        "recipe": plan.name,
        "model": f"{plan.model_name} ({plan.parameters / 1e9:.1f}B{task})",
        "tier": plan.tier.name,
        "compute": f"{plan.nodes}x {plan.instance.name.removeprefix('ml.')}",
        "precision": precision,
        "AC": plan.activation_checkpointing,
        "sharding": f"{plan.sharding}/{plan.shard_group_size}"
        + (f" cp{plan.context_parallel}" if plan.context_parallel > 1 else ""),
        "mb x accum": f"{plan.micro_batch_size} x {plan.grad_accum_steps}",
        "GiB/GPU": f"{plan.memory.total / GIB:,.1f} ({plan.memory.fraction:.0%})",
        "tok/s/GPU": f"{est.tokens_per_second_per_gpu:,.0f}",
        "range": _relative(est.tokens_per_second_per_gpu_range, est.tokens_per_second_per_gpu),
        "MFU full/causal": f"{est.mfu:.1%}/{est.mfu_causal:.1%}",
        "time": _hours(plan.total_hours),  # the Prepare job's included (data.sources)
        "cost": _table_cost(plan),
        "probe": str(len(plan.candidates)) if plan.recipe.probe.enabled else "off",
        "status": _status(plan),
        "quotas": str(len(plan.account_findings)) if plan.account_findings else "",
    }


def _relative(pair: tuple[float, float] | None, point: float) -> str:
    """A range around ``point`` as two shares of it: ``-10%/+16%``."""
    if pair is None or point <= 0:
        return "-"
    low, high = (round(100 * (v / point - 1)) + 0 for v in pair)  # + 0: no "-0"
    return f"{low:+d}%/{high:+d}%"


def _status(plan: Plan) -> str:
    if not plan.ok:
        return f"{len(plan.errors)} error(s)"
    return "ok" + (f", {len(plan.warnings)} warning(s)" if plan.warnings else "")


def _table_cost(plan: Plan) -> str:
    est = plan.estimates
    if est is None or est.cost_usd is None:
        return NO_PRICE
    prepare = plan.corpus.prepare.cost_usd if plan.corpus is not None else 0.0
    if prepare is None:
        return NO_PRICE
    if est.spot_cost_usd_range is not None:
        low, high = est.spot_cost_usd_range
        return f"${low + prepare:,.0f}-${high + prepare:,.0f} spot est."
    return f"${est.cost_usd + prepare:,.0f}" + (" spot est." if plan.recipe.compute.spot else "")


NO_PRICE = "-"


def price_lines(plans: list[Plan]) -> list[str]:
    """Where the costs of a table come from, with their dates: one line per source, naming its recipes;
    where there is no price (the cost column's "-"), how to get one."""
    by_source: dict[tuple[bool, str], list[str]] = {}
    for plan in plans:
        est = plan.estimates if plan.ok else None
        if est is None:
            continue
        priced = est.cost_usd is not None and est.price_per_hour is not None
        spot = "spot estimate " if plan.recipe.compute.spot and plan.recipe.compute.price_per_hour is None else ""
        key = f"{spot}${est.price_per_hour:,.2f} per node-hour, {est.price_source}" if priced else est.price_source
        by_source.setdefault((priced, key), []).append(plan.name)
    return [
        f"cost of {', '.join(names)}: {key}"
        if priced
        else f"no price for {', '.join(names) if len(names) <= 3 else f'{len(names)} recipes'}: {key}"
        for (priced, key), names in by_source.items()
    ]


# -- the short table: one line per recipe -----------------------------------------------
# ``plan`` prints it by default (``--wide``: every column of :func:`summary_row`).

BRIEF_COLUMNS = ("recipe", "compute", "GiB/GPU", "tok/s/GPU", "range", "time", "cost", "status")
BRIEF_NUMERIC = ("GiB/GPU", "tok/s/GPU", "range", "time", "cost")


def brief_row(plan: Plan) -> dict[str, str]:
    """One plan as the short table's row: what it runs on, its memory, speed, time, cost and status."""
    row = summary_row(plan)
    brief = {key: row.get(key, "") for key in BRIEF_COLUMNS}
    brief["status"] = _status(plan).removeprefix("ok, ")
    est = plan.estimates if plan.ok else None
    if est is not None and est.cost_usd is not None and plan.recipe.compute.spot:
        low, high = est.spot_cost_usd_range or (est.cost_usd, est.cost_usd)
        brief["cost"] = f"~${low:,.0f}" + (f"-${high:,.0f}" if high != low else "")
    return brief


# What the tables' abbreviations mean: printed under the table, and in the README.
BRIEF_LEGEND = ("GiB/GPU: memory per GPU (share of its HBM); tok/s/GPU: per GPU, range: its held-out error; ~: spot",)
WIDE_LEGEND = (
    "AC: activation checkpointing (none, selective: the memory-hungry parts, full: every block); "
    "sharding: FSDP strategy/shard group size in GPUs, cpN: context parallel over N GPUs "
    "(hybrid/8 cp2: shards within 8 GPUs, replicas across them, each sequence split over 2); "
    "mb x accum: micro-batch per GPU x gradient accumulation steps; "
    "range: where the measured tokens/s per GPU may lie, against the prediction (the model's leave-one-source-out "
    "errors for this kind of run); "
    "MFU full/causal: model FLOPs utilisation counting full attention / its causal half; "
    "quotas: service quotas to raise before a deploy; "
    "probe: configurations the probe measures (explain lists them)",
)


def more_line(plans: list[Plan], wide: bool) -> str:
    """How to see more than the table shows."""
    name = plans[0].name if len(plans) == 1 else "NAME"
    wider = "" if wide else "plan --wide (precision, sharding, batch, MFU); "
    return f"more: {wider}explain {name} (every decision and fix)"


# -- the quotas the plans need ---------------------------------------------------------------

QUOTA_COLUMNS = ("quota", "code", "needed", "default", "recipes")
QUOTA_NUMERIC = ("needed", "recipes")


def quota_rows(plans: list[Plan], account: dict[str, float] | None = None) -> list[dict[str, str]]:
    """One row per quota that some plan needs raised (its ``quota-needed`` findings): the most any one
    recipe needs, AWS's default and how many recipes need it."""
    from tiered_training.planning import quotas

    needs: dict[str, list[quotas.Need]] = {}
    for plan in plans:
        if plan.account_findings:
            for need in quotas.shortfalls(plan.recipe, account, quotas.prepare_instances(plan)):
                needs.setdefault(need.quota.name, []).append(need)
    rows = []
    for same in needs.values():
        quota = same[0].quota
        needed = max(n.needed for n in same)
        rows.append(
            {
                "quota": quota.title,
                "code": quota.code or "not published",
                "needed": _quota_amount(quota.unit, needed),
                "default": _quota_amount(quota.unit, quota.default) + ("" if quota.default_published else " (assumed)"),
                "recipes": str(len(same)),
            }
        )
    return rows


def _quota_amount(unit: str, value: float) -> str:
    return f"{value / 3600:,.4g} h" if unit == "seconds" else f"{value:,.0f}"


QUOTA_NOTES = (
    "needed: the most one recipe needs (recipes run at once need the sum); default: AWS's, until "
    "compute.quotas or cdk.json's context quotas state the applied value",
    "to raise them: tiered-training explain NAME (the commands), preflight NAME (the account's values)",
)


COLUMNS = (
    "recipe",
    "model",
    "tier",
    "compute",
    "precision",
    "AC",
    "sharding",
    "mb x accum",
    "GiB/GPU",
    "tok/s/GPU",
    "range",
    "MFU full/causal",
    "time",
    "cost",
    "probe",
    "status",
    "quotas",
)
# Columns that hold numbers: never wrapped, right-aligned.
NUMERIC_COLUMNS = ("mb x accum", "GiB/GPU", "tok/s/GPU", "range", "MFU full/causal", "time", "cost", "probe")


def markdown_table(rows: list[dict[str, str]], columns: Iterable[str]) -> str:
    columns = list(columns)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(row.get(c, "") for c in columns) + " |")
    return "\n".join(out)


def plans_markdown(plans: list[Plan]) -> str:
    parts = [markdown_table([summary_row(p) for p in plans], COLUMNS), "", *WIDE_LEGEND]
    parts += [f"\n{line}" for line in price_lines(plans)]
    for plan in plans:
        notes = [f for f in plan.findings if f.severity != "info"]
        if notes:
            parts.append(f"\n**{plan.name}**\n")
            parts += [f"- {'❌' if f.severity == 'error' else '⚠️'} {format_finding(plan, f)}" for f in notes]
    return "\n".join(parts) + "\n"


def plans_json(plans: list[Plan], failures: Iterable[RecipeError] = ()) -> str:
    from tiered_training.report.render import dumps

    return dumps(plans_data(plans, failures))


# -- JSON ---------------------------------------------------------------------------
# Every command's ``--format json``: one object with ``schema_version``. A recipe that
# fails to load is listed under ``invalid`` with its errors; one that loads but cannot
# work is a plan with ``"ok": false`` and its findings.


def problem_dict(problem: Problem) -> dict[str, Any]:
    return {"severity": "error", "code": "invalid-recipe", "fix": "", **problem.to_dict()}


def finding_dict(plan: Plan, finding: Finding) -> dict[str, Any]:
    source, line = finding_place(plan, finding)
    return {
        "severity": finding.severity,
        "code": finding.code,
        "file": source,
        "line": line,
        "field": finding.field,
        "message": finding.message,
        "fix": finding.fix,
        "value": None,
    }


def failure_dict(error: RecipeError) -> dict[str, Any]:
    source = error.problems[0].file if error.problems else None
    return {
        "source": source,
        "name": None,
        "ok": False,
        "errors": [problem_dict(p) for p in error.problems],
        "warnings": [],
    }


def _with_places(plan: Plan) -> dict[str, Any]:
    """The plan as data, each finding with where it points (the file and line, or the ``--set`` that caused it)."""
    data = plan.to_dict()
    for finding, entry in zip(plan.findings, data["findings"], strict=True):
        entry["file"], entry["line"] = finding_place(plan, finding)
    return data


def plans_data(plans: Iterable[Plan], failures: Iterable[RecipeError] = ()) -> dict[str, Any]:
    plans, failures = list(plans), list(failures)
    return {
        "schema_version": SCHEMA_VERSION,
        "ok": not failures and all(p.ok for p in plans),
        "plans": [_with_places(p) for p in plans],
        "invalid": [failure_dict(f) for f in failures],
    }


def validate_data(plans: Iterable[Plan], failures: Iterable[RecipeError] = (), strict: bool = False) -> dict[str, Any]:
    """One entry per recipe: ok, errors and warnings (warnings block under ``strict``)."""
    recipes = [failure_dict(f) for f in failures]
    for plan in plans:
        errors = [finding_dict(plan, f) for f in plan.errors]
        warnings = [finding_dict(plan, f) for f in plan.warnings]
        account = [finding_dict(plan, f) for f in plan.account_findings]
        recipes.append(
            {
                "source": plan.source,
                "name": plan.name,
                "ok": not errors and not (strict and warnings),
                "errors": errors,
                "warnings": warnings,
                "account": account,
            }
        )
    recipes.sort(key=lambda r: str(r["source"]))
    return {"schema_version": SCHEMA_VERSION, "strict": strict, "ok": all(r["ok"] for r in recipes), "recipes": recipes}


def tiers_data() -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "tiers": [tier.model_dump() for tier in catalogs.tiers()]}


def models_data() -> dict[str, Any]:
    models = []
    for entry in catalogs.models().values():
        models.append({**entry.model_dump(), "parameters": entry.architecture.parameters})
    return {"schema_version": SCHEMA_VERSION, "models": models}


def instance_rows(region: str | None = None) -> list[dict[str, Any]]:
    """The instance catalogue with the prices in effect in ``region`` (default: the price
    catalogue's documented region), environment overrides and the spot estimate included."""
    rows = []
    for inst in catalogs.instances().values():
        price, source = inst.price(region=region)
        spot_price, spot_source = inst.price(spot=True, region=region)
        rows.append(
            {
                **inst.model_dump(),
                "price_per_hour": price,
                "price_source": source,
                "spot_price_per_hour": spot_price,
                "spot_price_source": spot_source,
            }
        )
    return rows


def instances_data(region: str | None = None) -> dict[str, Any]:
    region = region or catalogs.prices().default_region
    return {"schema_version": SCHEMA_VERSION, "region": region, "instances": instance_rows(region)}


def _largest_lines(sequence_length: int) -> list[str]:
    """The largest model LoRA and QLoRA fit on one node of each instance type (planning/capacity.py)."""
    from tiered_training.planning.capacity import ADAPTERS, largest

    out = [
        f"Largest model on one node (sequence {sequence_length:,}, bf16, full checkpointing, micro-batch 1, "
        "default adapters; a catalogue model, then a catalogue width made deeper)"
    ]
    for instance in catalogs.instances().values():
        cells = []
        for adapter in ADAPTERS:
            found = largest(instance, adapter, sequence_length)
            named = found.model or "no catalogue model"
            cells.append(f"{adapter} {named}, {found.parameters / 1e9:,.0f}B")
        out.append(Hang(f"  {instance.name:<22} {'; '.join(cells)}", 25))
    return out


# Where the prose of explain's rows begins, for the continuation lines of a row that wraps.
REASON_COLUMN = 2 + 34 + 1 + 14 + 1  # a decision's [source] and reason
ESTIMATE_COLUMN = 2 + 23  # an estimate's value
TERM_COLUMN = 2 + 26 + 1 + 9 + 3 + 6 + 2  # what a step-time term is


def explain_lines(plan: Plan) -> list[str]:
    """Every decision with its reason, the memory proof, the estimates and every finding."""
    out = [f"{plan.name}  ({plan.source or 'recipe'})", ""]
    out.append("Decisions")
    for d in plan.decisions:
        value = d.value if not isinstance(d.value, dict) else ", ".join(f"{k}={v}" for k, v in d.value.items())
        out.append(Hang(f"  {d.field:<34} {str(value):<14} [{d.source}] {d.reason}", REASON_COLUMN))
    if plan.memory is not None:
        out += [
            "",
            f"Memory per GPU ({plan.instance.gpu}, {plan.instance.usable_hbm_gib:g} GiB; headroom "
            f"{plan.tier.memory_headroom:.0%})",
        ]
        for key, gib in plan.memory.as_gib().items():
            if key != "hbm":
                out.append(f"  {key:<22} {gib:>9,.2f} GiB")
        verdict = (
            "fits"
            if plan.memory.fraction <= plan.tier.memory_headroom
            else "tight: over the headroom, the probe will measure it"
            if plan.memory.fraction <= 1
            else "does NOT fit"
        )
        out.append(f"  {'':<22} {plan.memory.fraction:>9.1%} of HBM: {verdict}")
    if plan.estimates is not None:
        e = plan.estimates
        out += [
            "",
            "Estimates",
            f"  FLOPs per token        {e.flops_per_token:,.3e}",
            f"  tokens/s per GPU       {e.tokens_per_second_per_gpu:,.0f}  (all GPUs: {e.tokens_per_second:,.0f})",
            *(
                [
                    Hang(
                        f"  range                  {e.tokens_per_second_per_gpu_range[0]:,.0f}-"
                        f"{e.tokens_per_second_per_gpu_range[1]:,.0f} tokens/s per GPU, "
                        f"wall time {_hours(e.wall_time_hours_range[0])} to {_hours(e.wall_time_hours_range[1])}"
                        + (
                            f", cost ${e.cost_usd_range[0]:,.0f}-${e.cost_usd_range[1]:,.0f}"
                            if e.cost_usd_range is not None
                            else ""
                        )
                        + f" ({e.range_basis})",
                        ESTIMATE_COLUMN,
                    )
                ]
                if e.tokens_per_second_per_gpu_range is not None and e.wall_time_hours_range is not None
                else []
            ),
            Hang(
                f"  MFU (BF16-equivalent)  {e.mfu:.1%} counting full attention (6N + 12*L*h*s, torchtitan's "
                "convention, as the container reports it); "
                f"{e.mfu_causal:.1%} counting the causal half of attention (6N + 6*L*h*s)",
                ESTIMATE_COLUMN,
            ),
            f"  step time              {e.step_time_seconds:,.2f} s over {e.total_steps:,} steps",
            f"  wall time              {_hours(e.wall_time_hours)}"
            + (f" (the probe's {e.probe_hours * 60:,.0f} min included)" if e.probe_hours else ""),
            Hang(
                f"  cost                   none: {e.price_source}"
                if e.cost_usd is None or e.price_per_hour is None
                else (
                    f"  cost                   ${e.cost_usd:,.0f} at ${e.price_per_hour:,.2f} per node-hour "
                    f"({e.price_source})"
                ),
                ESTIMATE_COLUMN,
            ),
            *(
                [f"  spot cost (estimate)   ${e.spot_cost_usd_range[0]:,.0f}-${e.spot_cost_usd_range[1]:,.0f}"]
                if e.spot_cost_usd_range is not None
                else []
            ),
            "",
            f"Step time, term by term ({e.throughput_source})",
        ]
        total = sum(t.seconds for t in e.step_terms) or 1.0
        for term in e.step_terms:
            line = f"  {term.name:<26} {term.seconds:>9,.3f} s {term.seconds / total:>6.1%}  {term.what}"
            out.append(Hang(line, TERM_COLUMN))
        out.append(f"  {'step':<26} {total:>9,.3f} s")
    out += corpus_lines(plan)
    out += preference.explain_lines(plan)
    departures = getattr(plan, "departures", ())
    if departures:
        out += ["", f"Departures from the {plan.tier.name} tier (tuning.follow_tiers: strict keeps the tier's choices)"]
        for d in departures:
            line = (
                f"  {d.field:<34} {d.tier_value} -> {d.value}: {d.gain:+.1%} predicted, {d.margin_gib:,.1f} GiB kept "
                "under the headroom"
            )
            out.append(Hang(line, 2 + 34 + 1))
    full = getattr(plan, "full_parameter", None)
    if full is not None:
        out += ["", "Full-parameter fine-tuning instead of LoRA (tuning.adapter: none)"]
        out.append(
            f"  {full.nodes} x {plan.instance.name}: {full.setting}, {full.memory_fraction:.0%} of HBM, "
            f"{full.tokens_per_second_per_gpu:,.0f} tokens/s per GPU, {_hours(full.wall_time_hours)}, "
            f"{_cost(full.cost_usd)} "
            f"(LoRA: {plan.estimates.tokens_per_second_per_gpu:,.0f} tokens/s per GPU on {plan.nodes} node(s), "
            f"{_hours(plan.estimates.wall_time_hours)}, {_cost(plan.estimates.cost_usd)})"
        )
    if getattr(plan, "adapter", None) in ("lora", "qlora"):
        out += ["", *_largest_lines(plan.recipe.sequence_length)]
    alternatives = getattr(plan, "alternatives", ())
    if alternatives:
        out += ["", "Next alternatives that fit"]
        for a in alternatives:
            numbers = (
                f"  {a.tokens_per_second_per_gpu:>6,.0f} tokens/s per GPU  {a.memory_gib:>5,.1f} GiB "
                f"{'(' + format(a.memory_fraction, '.0%') + ')':<6}"
            )
            out.append(Hang(f"{numbers} {a.describe()}", len(numbers) + 1))
    out += candidate_lines(plan)
    out += ["", "Findings"]
    out += [f"  {format_finding(plan, f)}" for f in plan.findings] or ["  none"]
    return out


def corpus_lines(plan: Plan) -> list[str]:
    """data.sources: each source's share, tokens held and epochs; the Prepare job beside training."""
    corpus = getattr(plan, "corpus", None)
    if corpus is None:
        return []
    out = ["", "Sources (share of the budget, tokens held, epochs)"]
    for s in corpus.sources:
        held = f"{s.held_tokens:,}" if s.held_tokens else "unknown"
        epochs = f"{s.epochs:.2f} epochs (max {s.max_epochs:g})" if s.epochs is not None else "epochs unknown"
        out.append(
            Hang(
                f"  {s.name:<16} {s.share:>6.1%}  {s.budget_tokens:>18,} tokens  held {held} ({s.held_source}); "
                f"{epochs}",
                2 + 16 + 1,
            )
        )
    p = corpus.prepare
    cost = f"${p.cost_usd:,.2f}" if p.cost_usd is not None else "no price recorded for this instance"
    out += [
        "",
        "Prepare (tokenizes the sources before the probe)",
        Hang(
            f"  {p.instance_count} x {p.instance_type} ({p.vcpus} vCPUs each): {p.tokens:,} tokens in "
            f"{_hours(p.hours)}, {cost}; at {p.rate_source}",
            4,
        ),
        f"  with training          {_hours(plan.total_hours)}, {_cost(plan.total_cost_usd)}",
    ]
    return out


def candidate_lines(plan: Plan) -> list[str]:
    """The probe's candidates: number, predicted tokens/s per GPU and memory, configuration."""
    candidates = getattr(plan, "candidates", ())
    if not candidates:
        return []
    out = [
        "",
        f"Probe candidates (the probe measures each; Train runs the fastest measured under "
        f"{plan.probe_memory_limit:.0%} of HBM)",
        f"  {'#':>2}  {'tokens/s/GPU':>12}  {'memory':>6}  configuration (predicted)",
    ]
    for c in candidates:
        numbers = f"  {c.number:>2}  {c.tokens_per_second_per_gpu:>12,.0f}  {c.memory_fraction:>6.0%}"
        accum = f", accumulation {c.grad_accum_steps}"
        why = f": {c.why}" if getattr(c, "why", "") else ""
        out.append(Hang(f"{numbers}  {c.describe()}{accum}{why}", len(numbers) + 2))
    return out


def explain_more_line(recipe: object) -> str:
    """How to see more than explain's text shows."""
    return f"more: `tiered-training explain {recipe} --format json` (the whole plan as data: every field, each source)"


# -- diff ---------------------------------------------------------------------------


def _flat(plan: Plan) -> dict[str, Any]:
    data = plan.to_dict()
    flat = {"task": data.get("task", "pretrain")}
    flat.update({"compute." + k: v for k, v in data["compute"].items()})
    flat.update({"model." + k: v for k, v in data["model"].items()})
    flat.update({"tuning." + k: v for k, v in data["tuning"].items()})
    run = data.get("run") or {}
    if run:  # the run's shape: how many training jobs, each how long, on which instance counts
        flat["compute.segments"] = run["segments"]
        flat["compute.max_runtime_hours"] = round(run["job_runtime_seconds"] / 3600, 2)
        flat["compute.instance_counts"] = run["instance_counts"]
    return flat


def diff(old: Plan, new: Plan) -> dict[str, Any]:
    """Changed decisions and the deltas that matter for review: memory, throughput, time, cost."""
    before, after = _flat(old), _flat(new)
    changed = [
        {"field": key, "old": before.get(key), "new": after.get(key), "reason": _reason(new, key)}
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]
    metrics = {}
    pairs = {
        "memory_gib_per_gpu": lambda p: p.memory.total / GIB if p.memory else None,
        "tokens_per_second_per_gpu": lambda p: p.estimates.tokens_per_second_per_gpu if p.estimates else None,
        "mfu": lambda p: p.estimates.mfu if p.estimates else None,
        "mfu_causal": lambda p: p.estimates.mfu_causal if p.estimates else None,
        "wall_time_hours": lambda p: p.estimates.wall_time_hours if p.estimates else None,
        "cost_usd": lambda p: p.estimates.cost_usd if p.estimates else None,
    }
    for key, get in pairs.items():
        a, b = get(old), get(new)
        metrics[key] = {
            "old": a,
            "new": b,
            "delta": (b - a) if a is not None and b is not None else None,
            "ratio": (b / a) if a and b is not None else None,
        }
    old_codes = {(f.severity, f.code, f.message) for f in old.findings}
    new_codes = {(f.severity, f.code, f.message) for f in new.findings}
    return {
        "schema_version": SCHEMA_VERSION,
        "old": old.name,
        "new": new.name,
        "changed": changed,
        "metrics": metrics,
        "price_source": {
            "old": old.estimates.price_source if old.estimates else None,
            "new": new.estimates.price_source if new.estimates else None,
        },
        "findings_added": [{"severity": s, "code": c, "message": m} for s, c, m in sorted(new_codes - old_codes)],
        "findings_removed": [{"severity": s, "code": c, "message": m} for s, c, m in sorted(old_codes - new_codes)],
    }


def _reason(plan: Plan, key: str) -> str:
    try:
        return plan.decision(key).reason
    except KeyError:
        return ""


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("mfu", "mfu_causal"):
        return f"{value:.1%}"
    if key == "cost_usd":
        return f"${value:,.0f}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def diff_markdown(result: dict[str, Any]) -> str:
    out = [f"### Plan diff: `{result['old']}` → `{result['new']}`", ""]
    if result["changed"]:
        out += ["| decision | old | new | why |", "|---|---|---|---|"]
        out += [
            f"| {c['field']} | {_fmt(c['field'], c['old'])} | {_fmt(c['field'], c['new'])} | {c['reason']} |"
            for c in result["changed"]
        ]
    else:
        out.append("No decision changed.")
    shown = _changed_metrics(result)
    if shown:
        out += ["", "| estimate | old | new | change |", "|---|---|---|---|"]
    else:
        out += ["", "No estimate changed (as shown)."]
    for key, m in shown.items():
        out.append(f"| {key} | {_fmt(key, m['old'])} | {_fmt(key, m['new'])} | {_change(key, m) or '-'} |")
    out += [f"\n{line}" for line in _price_sources(result)]
    for title, key in (("New findings", "findings_added"), ("Resolved findings", "findings_removed")):
        if result[key]:
            out += ["", f"**{title}**"] + [f"- {f['severity']}[{f['code']}]: {f['message']}" for f in result[key]]
    return "\n".join(out) + "\n"


def _price_sources(result: dict[str, Any]) -> list[str]:
    """Where the costs of a diff come from: once when both plans share the source."""
    sources = result.get("price_source") or {}
    old, new = sources.get("old"), sources.get("new")
    if old == new:
        return [f"price: {old}"] if old else []
    return [f"{side} price: {source}" for side, source in (("old", old), ("new", new)) if source]


def _changed_metrics(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The estimates whose shown figure differs (``70.1 -> 70.1`` is left out); the JSON keeps every one."""
    return {key: m for key, m in result["metrics"].items() if _fmt(key, m["old"]) != _fmt(key, m["new"])}


def _change(key: str, metric: dict[str, Any]) -> str:
    """A metric's change: in percentage points for a fraction (MFU), else relative to the old value."""
    if key in ("mfu", "mfu_causal"):
        return "" if metric["delta"] is None else f"{metric['delta'] * 100:+.1f} points"
    return "" if metric["ratio"] is None else f"{metric['ratio'] - 1:+.1%} relative"


def diff_more_line(old: object, new: object) -> str:
    """How to see more than diff's text shows."""
    return (
        f"more: `tiered-training diff {old} {new} --format json` (every value), "
        "or `--format markdown` for a pull request"
    )


def diff_text(result: dict[str, Any]) -> str:
    out = [f"{result['old']} -> {result['new']}"]
    for c in result["changed"]:
        out.append(
            f"  {c['field']}: {_fmt(c['field'], c['old'])} -> {_fmt(c['field'], c['new'])}"
            + (f"  ({c['reason']})" if c["reason"] else "")
        )
    if not result["changed"]:
        out.append("  no decision changed")
    shown = _changed_metrics(result)
    if not shown:
        out.append("  no estimate changed (as shown)")
    for key, m in shown.items():
        change = _change(key, m)
        out.append(f"  {key}: {_fmt(key, m['old'])} -> {_fmt(key, m['new'])}" + (f" ({change})" if change else ""))
    out += [f"  {line}" for line in _price_sources(result)]
    for title, key in (("new", "findings_added"), ("resolved", "findings_removed")):
        out += [f"  {title} {f['severity']}[{f['code']}]: {f['message']}" for f in result[key]]
    return "\n".join(out) + "\n"


# -- tiers --------------------------------------------------------------------------

TIER_COLUMNS = ("tier", "parameters", "precision", "batch", "activation checkpointing", "distribution", "headroom")


def tier_rows() -> list[dict[str, str]]:
    rows = []
    lower = catalogs.tiers()[0].min_parameters
    for tier in catalogs.tiers():
        rows.append(
            {
                "tier": tier.name,
                "parameters": f"{lower / 1e9:g}B-{tier.max_parameters / 1e9:g}B",
                "precision": f"{tier.precision.upper()}: {tier.precision_why}",
                "batch": tier.batch_why + (" (ramped)" if tier.batch_ramp else ""),
                "activation checkpointing": f"{tier.activation_checkpointing}: {tier.checkpointing_why}",
                "distribution": tier.distribution,
                "headroom": f"{tier.memory_headroom:.0%} of HBM",
            }
        )
        lower = tier.max_parameters
    return rows


def _cost(cost: float | None) -> str:
    return "no price" if cost is None else f"${cost:,.0f}"
