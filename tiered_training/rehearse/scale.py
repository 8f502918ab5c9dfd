"""What a rehearsal changes in the plan's RunConfig so that it runs in minutes on a few CPU cores, and what it keeps.

The model shrinks to a few layers of a tiny width, the sequence to a few dozen tokens, and
each simulated host runs a few CPU workers instead of its GPUs. Everything else the plan
decided is kept: the precision path (FP8 recipe and float8 all-gather, emulated on the
CPU), the activation-checkpointing mode, the sharding kind with the shard group spanning
the same share of a host (or the same number of hosts), the micro-batch, the batch ramp's
shape (the accumulation is divided by one factor, so a step costs at most a few
micro-batches), ``keep_last``, the probe's candidates and the metrics. Each of the probe's
other candidates is scaled as the plan's own configuration is, at the same global batch (the
candidates share it): its accumulation follows from its micro-batch, and where no whole number
does, its micro-batch is lowered to one that divides (listed as a change).
Plan figures that are in minutes become steps at the plan's own step time. Context
parallelism is kept where the trainer has it, and rehearsed as 1 (and listed) where not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from tiered_training.contract.runconfig import CandidateConfig, ParallelConfig, RunConfig

_T = TypeVar("_T")

LAYERS = 2
HIDDEN = 64
QLORA_HIDDEN = 512
HEADS = 4
VOCAB = 256
SEQUENCE = 32
MAX_PROBE_STEPS = 3
LOSS_CHUNK = 64
MAX_ACCUM = 4
METRICS_INTERVAL_S = 0.05
VALIDATION_INTERVAL_S = 1.0
VALIDATION_BATCHES = 2
HOLDOUT_EVERY = 50


@dataclass(frozen=True)
class Change:
    field: str
    plan: object
    rehearsal: object
    why: str


@dataclass(frozen=True)
class Scaled:
    config: RunConfig
    changes: tuple[Change, ...]
    kept: tuple[tuple[str, object], ...]


def scale(
    cfg: RunConfig,
    *,
    hosts: int,
    workers: int,
    plan_step_seconds: float,
    plan_total_steps: int,
    memory_per_worker: int,
    context_parallel: bool = False,
    vocab_size: int | None = None,
    sequence_length: int | None = None,
) -> Scaled:
    """The rehearsal's RunConfig for ``hosts`` simulated hosts of ``workers`` CPU workers each.

    ``cfg.batch.total_steps`` is the execution's (the MaxSteps parameter); ``plan_total_steps``
    is the plan's, for scaling the ramp and warm-up to the same share of the run.
    ``context_parallel``: whether the trainer being rehearsed splits sequences over ranks;
    without it a plan's context parallelism is rehearsed as 1, and the change is listed.
    """
    changes: list[Change] = []
    vocab = vocab_size or VOCAB  # rehearse --data: the user's tokenizer's vocabulary
    window = sequence_length or SEQUENCE  # rehearse --data: room for the user's examples

    def change(field: str, plan: object, rehearsal: _T, why: str) -> _T:
        if plan != rehearsal:
            changes.append(Change(field, plan, rehearsal, why))
        return rehearsal

    m, b, p = cfg.model, cfg.batch, cfg.parallel
    plan_gpus = cfg.hardware.gpus_per_node
    steps = b.total_steps
    share = steps / max(plan_total_steps, 1)

    qlora = cfg.sft is not None and cfg.sft.adapter == "qlora"
    # QLoRA's NF4 weights split into whole 64 x 256 blocks per rank: a wider model, its FFN a multiple of 256
    hidden, width_why, unit = (
        (QLORA_HIDDEN, "small width whose NF4 weights split over up to 8 ranks", 256)
        if qlora
        else (HIDDEN, "tiny width, divisible by 16 for float8", 16)
    )
    ffn = max(unit, unit * round(hidden * m.ffn_size / m.hidden_size / unit))
    kv = HEADS if m.kv_heads == m.attention_heads else max(1, HEADS // 2)
    model = m.model_copy(
        update={
            "name": f"{m.name} (scaled down)",
            "layers": change("model.layers", m.layers, LAYERS, "a rehearsal checks the wiring, not the model"),
            "hidden_size": change("model.hidden_size", m.hidden_size, hidden, width_why),
            "head_size": change("model.head_size", m.head_size, None, "hidden_size / attention_heads, as the width"),
            "attention_heads": change("model.attention_heads", m.attention_heads, HEADS, "tiny width"),
            "kv_heads": change(
                "model.kv_heads", m.kv_heads, kv, "grouped-query attention kept" if kv < HEADS else "no GQA, as planned"
            ),
            "ffn_size": change("model.ffn_size", m.ffn_size, ffn, f"the plan's FFN/hidden ratio, rounded to {unit}"),
            "vocab_size": change(
                "model.vocab_size",
                m.vocab_size,
                vocab,
                "the rehearsal's synthetic tokens" if vocab_size is None else "the tokenizer of the --data examples",
            ),
            "max_sequence_length": max(128, window),
            # fine-tuning needs it named (RunConfig); the channel holds the random checkpoint either way
            "init_checkpoint": m.init_checkpoint
            if cfg.sft is not None
            else change(
                "model.init_checkpoint",
                m.init_checkpoint,
                None,
                "the model channel holds a random Hugging Face checkpoint of this shape, put at that URI",
            ),
        }
    )

    world = hosts * workers
    parallel = _parallel(p, hosts=hosts, workers=workers, plan_gpus=plan_gpus, cp_ok=context_parallel, change=change)
    cp = parallel.context_parallel

    ramp_steps = b.ramp_steps
    if b.ramp_steps and b.ramp_start_accum_steps:
        ramp_steps = min(max(2, round(b.ramp_steps * share)), max(1, steps - 1))
    # Accumulation divided by one factor, so the ramp keeps its shape (start/full) at a CPU's cost.
    factor = max(1, -(-b.grad_accum_steps // MAX_ACCUM))
    accum = max(1, round(b.grad_accum_steps / factor))
    start = b.ramp_start_accum_steps
    if start:
        start = max(1, round(start / factor))
    ratio = (
        f"the plan's {b.ramp_start_accum_steps} -> {b.grad_accum_steps} ramp over {factor}"
        if start
        else f"over {factor}"
    )
    data_parallel = world // cp
    batch = b.model_copy(
        update={
            "sequence_length": change("batch.sequence_length", b.sequence_length, window, "tiny windows"),
            "grad_accum_steps": change(
                "batch.grad_accum_steps",
                b.grad_accum_steps,
                accum,
                f"at most {MAX_ACCUM} micro-batches per step on a CPU: {ratio}",
            ),
            "ramp_start_accum_steps": change(
                "batch.ramp_start_accum_steps", b.ramp_start_accum_steps, start, f"the same start/full ratio ({ratio})"
            ),
            "global_batch_tokens": change(
                "batch.global_batch_tokens",
                b.global_batch_tokens,
                b.micro_batch_size * window * accum * data_parallel,
                f"the micro-batch and the accumulation above on {data_parallel} data-parallel "
                f"workers of {window} tokens",
            ),
            "ramp_steps": change(
                "batch.ramp_steps", b.ramp_steps, ramp_steps, "the same share of the run, at least 2 steps"
            ),
        }
    )

    precision = cfg.precision.model_copy(
        update={
            "compile": change(
                "precision.compile", cfg.precision.compile, False, "torch.compile costs a minute per model on a CPU"
            ),
            "loss_chunk_tokens": change(
                "precision.loss_chunk_tokens",
                cfg.precision.loss_chunk_tokens,
                min(cfg.precision.loss_chunk_tokens, LOSS_CHUNK),
                "several chunks per micro-batch, as planned",
            ),
        }
    )
    optimizer = cfg.optimizer.model_copy(
        update={
            "warmup_steps": change(
                "optimizer.warmup_steps",
                cfg.optimizer.warmup_steps,
                max(1, round(cfg.optimizer.warmup_steps * share)),
                "the same share of the run",
            ),
        }
    )

    ck = cfg.checkpoint
    interval = ck.interval_steps or max(1, round(ck.interval_minutes * 60 / max(plan_step_seconds, 1e-9)))
    checkpoint = ck.model_copy(
        update={
            "interval_steps": change(
                "checkpoint.interval_steps",
                ck.interval_steps,
                interval,
                f"every {ck.interval_minutes:g} min at the plan's {plan_step_seconds:.0f} s per step",
            ),
            "interval_minutes": change("checkpoint.interval_minutes", ck.interval_minutes, 0.0, "by steps only"),
        }
    )
    hardware = cfg.hardware.model_copy(
        update={
            "gpus_per_node": change(
                "hardware.gpus_per_node", plan_gpus, workers, "CPU workers per simulated host (gloo)"
            ),
            "hbm_bytes": change(
                "hardware.hbm_bytes",
                cfg.hardware.hbm_bytes,
                memory_per_worker,
                "each worker's share of this machine's memory (the probe's peak memory is the CPU resident set)",
            ),
            "min_nodes": change(
                "hardware.min_nodes",
                cfg.hardware.min_nodes,
                1,
                "the scaled-down model fits on one host; the sharding and the global batch still decide the counts",
            ),
        }
    )
    probe = cfg.probe.model_copy(
        update={
            "steps": change(
                "probe.steps",
                cfg.probe.steps,
                min(cfg.probe.steps, MAX_PROBE_STEPS),
                "enough for a steady-state figure",
            ),
        }
    )
    own = cfg.model_copy(update={"batch": batch, "precision": precision})
    probe = probe.model_copy(
        update={
            "alternatives": _alternatives(cfg, own, hosts=hosts, workers=workers, cp_ok=context_parallel, change=change)
        }
    )
    # On the plan's hardware a step takes longer than the metrics interval, so every step has its own
    # EMF event; a rehearsal's step is far shorter, so the interval shrinks to keep one event per step.
    metrics = cfg.metrics.model_copy(
        update={
            "interval_seconds": change(
                "metrics.interval_seconds",
                cfg.metrics.interval_seconds,
                METRICS_INTERVAL_S,
                _metrics_why(cfg.metrics.interval_seconds, plan_step_seconds),
            ),
        }
    )
    v = cfg.validation
    validation = v
    if v.source != "none":
        validation = v.model_copy(
            update={
                "interval_minutes": change(
                    "validation.interval_minutes",
                    v.interval_minutes,
                    VALIDATION_INTERVAL_S / 60,
                    f"every {VALIDATION_INTERVAL_S:g} s: a rehearsal lasts minutes, not hours",
                ),
                "batches": change("validation.batches", v.batches, min(v.batches, VALIDATION_BATCHES), "a quick pass"),
                "holdout_every": change(
                    "validation.holdout_every",
                    v.holdout_every,
                    min(v.holdout_every, HOLDOUT_EVERY) if v.source == "holdout" else v.holdout_every,
                    "enough held-out windows in the rehearsal's data",
                ),
            }
        )
    model_bytes = 2 * model.parameters  # bf16
    export = cfg.export.model_copy(
        update={
            "max_shard_bytes": change(
                "export.max_shard_bytes",
                cfg.export.max_shard_bytes,
                max(1, model_bytes // 3),
                "the tiny model is split into several files, as a large one is",
            ),
        }
    )
    run = cfg.run
    if run.segments > 1:
        # The limit scaled down: each segment trains the same share of the rehearsal's steps as of the plan's.
        run = run.model_copy(
            update={
                "segment_seconds": change(
                    "run.segment_seconds",
                    run.segment_seconds,
                    0.0,
                    "a CPU step is not the plan's: each segment's share of the steps divides the run",
                ),
            }
        )
    scaled = cfg.model_copy(
        update={
            "run": run,
            "model": model,
            "parallel": parallel,
            "batch": batch,
            "precision": precision,
            "optimizer": optimizer,
            "checkpoint": checkpoint,
            "hardware": hardware,
            "probe": probe,
            "metrics": metrics,
            "export": export,
            "validation": validation,
        }
    )
    RunConfig.model_validate(scaled.model_dump())  # still a valid contract
    kept = (
        ("parallel.sharding", p.sharding),
        *((("parallel.context_parallel", cp),) if cp > 1 and cp == p.context_parallel else ()),
        ("precision.precision", cfg.precision.precision),
        ("precision.fp8_recipe", cfg.precision.fp8_recipe),
        ("precision.fp8_all_gather", cfg.precision.fp8_all_gather),
        ("precision.activation_checkpointing", cfg.precision.activation_checkpointing),
        ("batch.micro_batch_size", b.micro_batch_size),
        ("batch.total_steps", b.total_steps),
        ("checkpoint.keep_last", ck.keep_last),
        *((("run.segments", f"{run.segment} of {run.segments}"),) if run.segments > 1 else ()),
        (
            "probe candidates",
            "; ".join(f"{n} = {scaled.candidate_config(n).describe()}" for n in range(1, scaled.probe.count + 1)),
        ),
        ("probe.memory_limit", cfg.probe.memory_limit),
        ("optimizer", f"{cfg.optimizer.schedule}, lr {cfg.optimizer.lr:g}"),
        ("data", f"{cfg.data.token_dtype}, seed {cfg.data.seed}"),
        ("export.dtype", cfg.export.dtype),
        ("validation.source", cfg.validation.source),
        ("hardware.instance_type", cfg.hardware.instance_type),
    )
    return Scaled(scaled, tuple(changes), kept)


def _parallel(
    p: ParallelConfig, *, hosts: int, workers: int, plan_gpus: int, cp_ok: bool, change, prefix: str = ""
) -> ParallelConfig:
    """The parallel layout on ``hosts`` x ``workers``: the shard group spanning the same share of a host (or the
    same hosts), context parallelism where the trainer has it; each change recorded under ``prefix``."""
    world = hosts * workers
    cp = p.context_parallel
    if cp > 1:
        if not cp_ok:
            cp = change(
                f"{prefix}parallel.context_parallel",
                p.context_parallel,
                1,
                "this checkout's trainer has no context parallelism (training/distributed/context_parallel.py): "
                "each worker holds whole sequences",
            )
        else:
            fitting = [c for c in range(min(cp, workers), 0, -1) if workers % c == 0 and SEQUENCE % (2 * c) == 0]
            cp = change(
                f"{prefix}parallel.context_parallel",
                p.context_parallel,
                fitting[0],
                f"the largest degree that a simulated host of {workers} workers and {SEQUENCE}-token windows take",
            )

    if p.sharding == "hybrid":
        if p.shard_group_size >= plan_gpus and p.shard_group_size % plan_gpus == 0:
            group = p.shard_group_size // plan_gpus * workers
            why = f"{p.shard_group_size // plan_gpus} host(s) per shard group, as planned"
        else:
            group = max(1, workers * p.shard_group_size // plan_gpus)
            why = "the same share of a host per shard group, as planned"
        if group > world:
            group, why = world, f"{why}, but at most the rehearsal's {hosts} host(s)"
    elif p.sharding == "full":
        group, why = hosts * workers, "full sharding over every worker"
    else:
        group, why = 1, "no sharding"
    if cp > 1 and group % cp:
        group = cp * max(1, group // cp)
    return p.model_copy(
        update={
            "shard_group_size": change(f"{prefix}parallel.shard_group_size", p.shard_group_size, group, why),
            "context_parallel": cp,
        }
    )


def _alternatives(
    cfg: RunConfig, scaled: RunConfig, *, hosts: int, workers: int, cp_ok: bool, change
) -> list[CandidateConfig]:
    """The probe's other candidates scaled as the RunConfig's own configuration is, each at the scaled run's
    global batch (the candidates share it): its accumulation is what its micro-batch needs on its data-parallel
    ranks; where no whole accumulation does, the micro-batch is lowered to one that divides, and the change listed."""
    world = hosts * workers
    tokens = scaled.batch.global_batch_tokens
    sequence = scaled.batch.sequence_length
    found = []
    for index, c in enumerate(cfg.probe.alternatives):
        prefix = f"probe.alternatives[{index}]."
        number = index + 2
        parallel = _parallel(
            c.parallel,
            hosts=hosts,
            workers=workers,
            plan_gpus=cfg.hardware.gpus_per_node,
            cp_ok=cp_ok,
            change=change,
            prefix=prefix,
        )
        ranks = world // parallel.context_parallel
        sequences, rest = divmod(tokens, sequence * ranks)  # per data-parallel rank and step
        micro, accum = c.micro_batch_size, max(1, sequences)
        if rest or sequences < 1:
            accum = max(1, round(tokens / (sequence * ranks * micro)))
            why = (
                f"candidate {number}: {ranks} data-parallel ranks cannot take the shared global batch of "
                f"{tokens} tokens in whole {sequence}-token sequences; the nearest accumulation"
            )
        else:
            micro = max(m for m in range(1, min(micro, sequences) + 1) if sequences % m == 0)
            accum = sequences // micro
            why = (
                f"candidate {number}: the shared global batch of {tokens} tokens on its {ranks} data-parallel "
                f"ranks at micro-batch {micro}"
            )
        micro = change(
            f"{prefix}micro_batch_size",
            c.micro_batch_size,
            micro,
            f"candidate {number}: the largest micro-batch up to the plan's that divides the {sequences} sequences "
            "a data-parallel rank takes per step",
        )
        accum = change(f"{prefix}grad_accum_steps", c.grad_accum_steps, accum, why)
        start = c.ramp_start_accum_steps
        if start:
            start = change(
                f"{prefix}ramp_start_accum_steps",
                start,
                max(1, round(start * accum / c.grad_accum_steps)),
                f"candidate {number}: the plan's start/full ratio ({start}/{c.grad_accum_steps})",
            )
        precision = c.precision.model_copy(
            update={"compile": scaled.precision.compile, "loss_chunk_tokens": scaled.precision.loss_chunk_tokens}
        )
        found.append(
            c.model_copy(
                update={
                    "parallel": parallel,
                    "precision": precision,
                    "micro_batch_size": micro,
                    "grad_accum_steps": accum,
                    "ramp_start_accum_steps": start,
                }
            )
        )
    return found


def _metrics_why(interval: float, plan_step_seconds: float) -> str:
    if plan_step_seconds >= interval:
        return f"one EMF event per step, as with the plan's {plan_step_seconds:.0f} s steps"
    return "one EMF event per step, so that every step's loss is read exactly"
