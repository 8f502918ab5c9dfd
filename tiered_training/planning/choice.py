"""The planner's choice: the tier's configuration or a faster one, the alternatives, the probe's candidates
(the decisions the model doubts) and the ranges of their predictions."""

from __future__ import annotations

import math

from tiered_training import catalog as catalogs
from tiered_training.contract.runconfig import MAX_PROBE_CANDIDATES, steps_for_tokens
from tiered_training.planning import perf, uncertainty
from tiered_training.planning.plan import Alternative, Candidate
from tiered_training.planning.records import _does_not_fit, _record
from tiered_training.planning.search import (
    AC_ORDER,
    Option,
    _batch_fits,
    _compiles,
    _pins_one,
    _Run,
    _space,
    _wants_ramp,
    search,
)
from tiered_training.recipe import AUTO, BatchRampSpec, Recipe

# The plan leaves the tier's advice only for a predicted gain above this; to FP8 against
# a tier that advises BF16 (for its numerical ease), only above the FP8 threshold.
MIN_DEPARTURE_GAIN = 0.02
MIN_FP8_GAIN = 0.10
# Configurations within this of the fastest count as equally fast: the plan takes the one
# closest to the tier's choice.
NEAR_FASTEST = 0.02
# Configurations the probe measures when tuning.probe_candidates is auto and the search has a choice.
DEFAULT_PROBE_CANDIDATES = 3


def tier_choice(run: _Run, options: list[Option]) -> Option | None:
    """What the tier alone would pick among ``options``: its precision, its checkpointing
    (or more recompute when that does not fit), then the smallest shard group, the smallest
    context-parallel degree and the largest micro-batch that fit."""
    tier, tuning = run.tier, run.recipe.tuning
    precision = (
        tuning.precision
        if tuning.precision != AUTO
        else (tier.precision if tier.precision != "fp8" or run.instance.fp8 else "bf16")
    )
    recipe_name = tuning.fp8_recipe if tuning.fp8_recipe != AUTO else "tensorwise"
    start = AC_ORDER.index(tier.activation_checkpointing) if tuning.activation_checkpointing == AUTO else 0
    fitting = [
        o
        for o in options
        if o.fits
        and o.setting.precision == precision
        and (precision != "fp8" or o.setting.fp8_recipe == recipe_name)
        and AC_ORDER.index(o.setting.checkpointing) >= start
    ]
    if not fitting:
        return None
    return min(
        fitting,
        key=lambda o: (
            AC_ORDER.index(o.setting.checkpointing),
            o.setting.shard_group,
            o.setting.context_parallel,
            -o.setting.micro_batch,
        ),
    )


def _choose(run: _Run) -> Option | None:
    """Search, then pick: the tier's choice unless a faster one fits (auto), or the tier's (strict)."""
    space = _space(run)
    if space is None or not _batch_fits(run, space):
        return None
    run.pinned = _pins_one(space)
    options = search(run, space)
    # Fastest first; on a tie, the simpler configuration (less recompute, no context parallelism).
    fitting = sorted(
        (o for o in options if o.fits),
        key=lambda o: (
            -round(o.speed, 6),
            o.setting.context_parallel,
            o.setting.shard_group,
            AC_ORDER.index(o.setting.checkpointing),
        ),
    )
    if not fitting:
        _does_not_fit(run, options)
        return None
    by_tier = tier_choice(run, options)
    chosen = by_tier or fitting[0]
    if not run.strict and by_tier is not None:
        candidates = fitting
        if _fp8_against_tier(run):
            # FP8 against a tier that advises BF16 must earn its numerical risk on its own.
            bf16 = [o for o in fitting if o.setting.precision != "fp8"]
            fp8 = [o for o in fitting if o.setting.precision == "fp8"]
            if bf16 and fp8 and fp8[0].speed < bf16[0].speed * (1 + MIN_FP8_GAIN):
                candidates = bf16
        worth = [o for o in candidates if o.speed > by_tier.speed * (1 + MIN_DEPARTURE_GAIN)]
        if worth:
            # Among the near-fastest, the one that departs from the tier the least.
            near = [o for o in worth if o.speed >= worth[0].speed * (1 - NEAR_FASTEST)]
            chosen = min(near, key=lambda o: (_departures_from(o, by_tier), -o.speed))
    run.alternatives = _alternatives(fitting, chosen)
    _record(run, chosen, by_tier, fitting)
    run.probe_options = _probe_options(run, fitting, chosen)
    return chosen


# The decisions the probe can settle, each named by the settings that make it.
PROBE_DECISIONS = (
    ("precision", ("precision", "fp8_recipe")),
    ("activation checkpointing", ("checkpointing",)),
    ("context-parallel degree", ("context_parallel",)),
    ("sharding group", ("sharding", "shard_group")),
)


def _differs(a: perf.Setting, b: perf.Setting, names: tuple[str, ...]) -> bool:
    return any(getattr(a, n) != getattr(b, n) for n in names)


def _bounds(run: _Run, option: Option) -> tuple[float, float, str]:
    """Where ``option``'s measured tokens/s per GPU may lie (the model's held-out range for its kind of run)."""
    found = prediction_range(run, option.setting)
    if found is None:
        return option.speed, option.speed, "no held-out runs"
    low, high = _rounded(found.measured(option.speed)) or (option.speed, option.speed)  # as the plan's range
    return low, high, f"{found.low:+.0%} to {found.high:+.0%}"


def _probe_options(run: _Run, fitting: list[Option], chosen: Option) -> list[Option]:
    """The configurations the probe measures: the chosen one, then, for each decision the model may have wrong
    (precision, activation checkpointing, the context-parallel degree, the sharding group), the fastest other
    that fits whose predicted margin lies inside the model's own held-out error for its kind of run: it can win
    by the model's own bounds (its highest measured speed at or above the chosen one's lowest). The rest of the
    count goes to the next fastest that can win. An FP8 plan measures the fastest BF16 that fits (FP8 against
    BF16 is where the model errs most); FP8 is not measured against a tier that advises BF16 unless the plan
    takes it; context parallelism is not measured where the sequence fits without it (the ring only adds work
    there). ``run.probe_why`` gets the reason for each."""
    asked = run.recipe.tuning.probe_candidates
    count = asked if isinstance(asked, int) else (1 if run.pinned or run.strict else DEFAULT_PROBE_CANDIDATES)
    pool = [o for o in fitting if o is not chosen]
    if _fp8_against_tier(run) and chosen.setting.precision != "fp8":
        pool = [o for o in pool if o.setting.precision != "fp8"]
    fits_without_cp = any(o.setting.context_parallel == 1 for o in fitting)
    if fits_without_cp:
        pool = [o for o in pool if o.setting.context_parallel == 1]
    chosen_low, chosen_high, chosen_band = _bounds(run, chosen)

    def can_win(o: Option) -> bool:
        return _bounds(run, o)[1] >= chosen_low

    doubtful = [o for o in pool if can_win(o)]
    why: dict[int, str] = {}

    def against(o: Option) -> str:
        low, high, band = _bounds(run, o)
        return (
            f"{round(o.speed, 1):,.0f} tokens/s per GPU predicted, {o.speed / chosen.speed - 1:+.1%} against the "
            f"plan's; the model's held-out error for its kind of run ({band}) puts it at {low:,.0f}-{high:,.0f}, "
            f"the plan's ({chosen_band}) at {chosen_low:,.0f}-{chosen_high:,.0f}"
        )

    picked = [chosen]
    bf16 = next((o for o in pool if o.setting.precision == "bf16"), None) if chosen.setting.precision == "fp8" else None
    if count > 1 and bf16 is not None:
        picked.append(bf16)
        why[id(bf16)] = (
            f"BF16 against the plan's FP8, where the model errs most: the fastest BF16 that fits, {against(bf16)}"
            + ("" if can_win(bf16) else "; measured although it cannot win by these bounds, as every FP8 plan does")
        )
    in_doubt = []
    for decision, names in PROBE_DECISIONS:
        if decision == "precision" and bf16 in picked:
            continue  # the BF16 candidate measures it
        other = next((o for o in doubtful if _differs(o.setting, chosen.setting, names)), None)
        if other is not None and other not in picked:
            in_doubt.append((decision, other))
    if not isinstance(asked, int) and count > 1:
        # auto: one candidate for each decision in doubt, at least the default count
        count = min(MAX_PROBE_CANDIDATES, max(count, len(picked) + len(in_doubt)))
    for decision, other in in_doubt:
        if len(picked) >= count:
            break
        if other in picked:
            continue
        picked.append(other)
        why[id(other)] = f"the {decision} in doubt: the fastest other {decision} that fits, {against(other)}"
    for o in doubtful:
        if len(picked) >= count:
            break
        if o not in picked:
            picked.append(o)
            why[id(o)] = f"the next fastest that can win: {against(o)}"
    if isinstance(asked, int):  # the recipe's count: the next fastest that fit, beyond the model's error too
        for o in pool:
            if len(picked) >= count:
                break
            if o not in picked:
                picked.append(o)
                why[id(o)] = f"set in the recipe: the next fastest that fits, beyond the model's error: {against(o)}"
    beyond = sum(1 for o in pool if o not in picked and not can_win(o))
    picked = [chosen, *sorted(picked[1:], key=lambda o: -o.speed)][: max(count, 1)]
    run.probe_why = ["the plan's own configuration"] + [why[id(o)] for o in picked[1:]]
    if count == 1:
        reason = (
            "set in the recipe: the probe measures the plan's configuration only"
            if isinstance(asked, int)
            else "the recipe pins every tuning field, so there is one configuration to measure"
            if run.pinned
            else "tuning.follow_tiers is strict: the tier's configuration only"
        )
    elif len(picked) == 1:
        how = "set in the recipe" if isinstance(asked, int) else "auto"
        reason = f"{how}: {count} wanted, but only the plan's configuration fits; the probe measures it"
        if beyond:
            reason = (
                f"{how}: {count} wanted, but no other configuration that fits can win by the model's own held-out "
                f"error ({beyond} slower beyond it); the probe measures the plan's"
            )
    else:
        others = ", ".join(f"{o.speed:,.0f}" for o in picked[1:])
        short = (
            ""
            if len(picked) >= count
            else f"; only {len(picked)} fit"
            if len(picked) == len(pool) + 1
            else f"; only {len(picked)} can win by the model's own error"
        )
        how = "set in the recipe" if isinstance(asked, int) else "auto"
        reason = (
            f"{how}: the probe measures the plan's ({chosen.speed:,.0f} predicted) and {len(picked) - 1} "
            f"whose margin lies inside the model's held-out error for their kind of run ({others} tokens/s per "
            f"GPU){short}; the full run takes the fastest measured under the headroom"
        )
        if bf16 in picked[1:]:
            reason += "; an FP8 plan measures the fastest BF16"
        if beyond:
            reason += f"; {beyond} slower beyond the model's error are not measured"
        if fits_without_cp and any(o.setting.context_parallel > 1 for o in fitting):
            reason += "; no context-parallel candidate: the sequence fits without it"
    run.decide("tuning.probe_candidates", len(picked), reason, asked)
    return picked


def _alternatives(fitting: list[Option], chosen: Option, count: int = 3) -> list[Alternative]:
    """The next fastest configurations that fit, in order, none skipped (every fitting configuration faster than
    the last one listed is listed); and, where the chosen one splits sequences, the fastest at every other
    context-parallel degree that fits, so that the degrees can be compared side by side."""

    def key(o: Option) -> tuple[str, str | None, str, int, int, int]:
        s = o.setting
        return (s.precision, s.fp8_recipe, s.checkpointing, s.shard_group, s.micro_batch, s.context_parallel)

    seen, picked = {key(chosen)}, []
    for option in fitting:
        if key(option) not in seen:
            seen.add(key(option))
            picked.append(option)
    picked = picked[:count]
    if chosen.setting.context_parallel > 1:
        degrees = {chosen.setting.context_parallel} | {o.setting.context_parallel for o in picked}
        for option in fitting:  # fastest first
            if option.setting.context_parallel not in degrees:
                degrees.add(option.setting.context_parallel)
                picked.append(option)
        picked.sort(key=lambda o: -o.speed)
    return [o.alternative() for o in picked]


def _departures_from(option: Option, by_tier: Option) -> int:
    a, b = option.setting, by_tier.setting
    return sum(
        getattr(a, name) != getattr(b, name)
        for name in ("precision", "fp8_recipe", "checkpointing", "context_parallel", "shard_group")
    )


def _fp8_against_tier(run: _Run) -> bool:
    return run.tier.precision != "fp8" and run.recipe.tuning.precision == AUTO


def _tokens_per_accum(run: _Run, chosen: Option) -> int:
    s = chosen.setting
    return s.micro_batch * run.recipe.sequence_length * (run.gpus // s.context_parallel)


def _ramp_spec(recipe: Recipe) -> BatchRampSpec:
    """The recipe's batch ramp, or the default one (for ``auto`` and ``true``)."""
    return recipe.tuning.batch_ramp if isinstance(recipe.tuning.batch_ramp, BatchRampSpec) else BatchRampSpec()


def _ramp_start(spec: BatchRampSpec, accum: int) -> int | None:
    """Accumulation steps at a ramp's step 0: ``spec.start_fraction`` of ``accum``; None when a step is one
    micro-batch per data-parallel rank (there is nothing to ramp)."""
    return max(1, round(accum * spec.start_fraction)) if accum >= 2 else None


def _ramp_and_steps(run: _Run, chosen: Option) -> tuple[int | None, int, int]:
    """Batch ramp (linear in gradient-accumulation steps) and the step count that meets the token budget."""
    recipe, tier, tuning = run.recipe, run.tier, run.recipe.tuning
    accum = chosen.accum
    want = _wants_ramp(recipe, tier)
    spec = _ramp_spec(recipe)
    global_tokens = recipe.budget.global_batch_tokens
    tokens_per_accum = _tokens_per_accum(run, chosen)
    start = _ramp_start(spec, accum) if want else None
    ramp_steps = None
    if want and start is None:
        run.decide(
            "tuning.batch_ramp",
            False,
            "the global batch is one micro-batch per data-parallel rank; there is nothing to ramp",
            tuning.batch_ramp,
        )
    elif start is not None:
        ramp_steps = max(1, math.ceil(spec.ramp_fraction * recipe.budget.total_tokens / global_tokens))
        why = tier.batch_why if tuning.batch_ramp == AUTO else "set in the recipe"
        run.decide(
            "tuning.batch_ramp",
            {"start_accum_steps": start, "ramp_steps": ramp_steps},
            f"{why}: from {start * tokens_per_accum:,} to {global_tokens:,} tokens per step over {ramp_steps} steps",
            tuning.batch_ramp,
        )
    else:
        reason = f"{tier.name} tier: {tier.batch_why}" if tuning.batch_ramp == AUTO else "set in the recipe"
        run.decide("tuning.batch_ramp", False, reason, tuning.batch_ramp)
    total = steps_for_tokens(recipe.budget.total_tokens, tokens_per_accum, start, accum, ramp_steps or 0)
    return start, ramp_steps or 0, total


def _candidates(run: _Run, chosen: Option, ramp_start: int | None) -> list[Candidate]:
    """The probe's candidates as the plan records them: the chosen one (with the plan's ramp), then the others,
    each ramping from the same share of its own accumulation."""
    spec = _ramp_spec(run.recipe)
    found = []
    for number, option in enumerate(run.probe_options or [chosen], start=1):
        s = option.setting
        start = ramp_start
        if number > 1 and ramp_start is not None:
            start = _ramp_start(spec, option.accum)
        found.append(
            Candidate(
                number=number,
                precision=s.precision,
                fp8_recipe=s.fp8_recipe,
                activation_checkpointing=s.checkpointing,
                sharding=s.sharding,
                shard_group_size=s.shard_group,
                context_parallel=s.context_parallel,
                micro_batch_size=s.micro_batch,
                grad_accum_steps=option.accum,
                ramp_start_accum_steps=start,
                tokens_per_second_per_gpu=round(option.speed, 1),
                memory_fraction=round(option.memory.fraction, 4),
                why=run.probe_why[number - 1] if number <= len(run.probe_why) else "the plan's own configuration",
                tokens_per_second_per_gpu_range=_rounded(_measured_range(run, option.setting, option.speed)),
            )
        )
    return found


def _warmup(run: _Run, chosen: Option, start: int | None, ramp_steps: int, total_steps: int) -> int:
    """Warmup steps that train on ``optimizer.warmup_tokens`` tokens, the ramp's smaller steps counted as such."""
    recipe = run.recipe
    tokens = recipe.optimizer.warmup_tokens
    if tokens is None:
        tokens = recipe.budget.total_tokens // 100
    steps = min(total_steps, steps_for_tokens(tokens, _tokens_per_accum(run, chosen), start, chosen.accum, ramp_steps))
    during = " (the batch ramp's smaller steps counted as such)" if start and steps <= ramp_steps else ""
    run.decide(
        "optimizer.warmup_steps",
        steps,
        f"the first {steps:,} steps train on {tokens:,} warmup tokens{during}",
        AUTO if recipe.optimizer.warmup_tokens is None else "set",
    )
    return steps


def prediction_range(run: _Run, setting: perf.Setting) -> uncertainty.Range | None:
    """The model's held-out error range for ``setting``'s kind of run (performance.yaml's ``loso_by_kind``)."""
    adapter = "none" if run.lora is None else "qlora" if run.lora.quantized else "lora"
    kind = uncertainty.kind_of_run(
        run.instance.gpu, setting.precision, _compiles(run.recipe), run.recipe.sequence_length, adapter
    )
    return uncertainty.range_for(kind, catalogs.performance_model().summary.loso_runs)


def _measured_range(run: _Run, setting: perf.Setting, speed: float) -> tuple[float, float] | None:
    found = prediction_range(run, setting)
    return None if found is None else found.measured(speed)


def _rounded(pair: tuple[float, float] | None) -> tuple[float, float] | None:
    """A range to a tenth, outwards (it keeps containing what it contained)."""
    return None if pair is None else (math.floor(pair[0] * 10) / 10, math.ceil(pair[1] * 10) / 10)
