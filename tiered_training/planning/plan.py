"""The Plan: a recipe with every ``auto`` resolved, each decision with its reason,
plus the memory proof, the estimates and the findings.

A recipe with errors resolves to a :class:`FailedPlan` instead: its decisions so far and
its findings, no estimates. It never reaches the constructs (``require_ok``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NoReturn

from tiered_training.catalog import Instance, Tier
from tiered_training.contract.architecture import Architecture
from tiered_training.contract.container import TENSORBOARD_DIR
from tiered_training.contract.corpus import CorpusSource, CorpusSpec, MixtureSource
from tiered_training.contract.runconfig import (
    BatchConfig,
    CandidateConfig,
    CheckpointConfig,
    DataConfig,
    DpoConfig,
    EvaluationConfig,
    ExportConfig,
    HardwareConfig,
    LoraConfig,
    MetricsConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    ProbeConfig,
    RunConfig,
    RunSection,
    SftConfig,
    TrackingConfig,
    ValidationConfig,
)
from tiered_training.planning.corpus import CorpusPlan
from tiered_training.planning.memory import MemoryBreakdown
from tiered_training.planning.perf import Term
from tiered_training.recipe import LoraSection, Recipe
from tiered_training.text import escape

# "account": what the AWS account must allow (a quota to raise); shown like a warning, but never
# blocks `validate --strict`, which judges the recipe (`preflight` judges the account).
Severity = Literal["error", "warning", "account", "info"]
# Where a decided value came from: the search (for an ``auto``), the recipe, or derived from other fields.
DecisionSource = Literal["auto", "recipe", "derived"]


@dataclass(frozen=True)
class Decision:
    field: str  # recipe path, for example "tuning.precision"
    value: Any
    reason: str
    source: DecisionSource


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str  # stable identifier, for example "fp8-unsupported"
    message: str
    fix: str = ""
    field: str = ""


@dataclass(frozen=True)
class Estimates:
    flops_per_token: float
    tokens_per_second_per_gpu: float
    tokens_per_second: float
    mfu: float  # BF16-equivalent, full attention (6N + 12*L*h*s, torchtitan's convention; what the container reports)
    mfu_causal: float  # BF16-equivalent, the attention a causal mask leaves (6N + 6*L*h*s)
    throughput_source: str
    step_time_seconds: float
    step_terms: tuple[Term, ...]  # the performance model's terms of one step, in seconds
    total_steps: int
    wall_time_hours: float
    price_per_hour: float | None  # per node; None where the catalogue has no price for the region
    price_source: str
    cost_usd: float | None
    spot_cost_usd_range: tuple[float, float] | None = None  # spot only, from a price list's on-demand price
    probe_hours: float = 0.0  # the probe's candidates (planning/probe.py), in wall_time_hours and cost_usd
    # Where the measured values may lie, from the model's leave-one-source-out errors for this kind of run
    # (planning/uncertainty.py); None where the calibration has none
    tokens_per_second_per_gpu_range: tuple[float, float] | None = None
    wall_time_hours_range: tuple[float, float] | None = None
    cost_usd_range: tuple[float, float] | None = None
    range_basis: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.spot_cost_usd_range is None:
            del data["spot_cost_usd_range"]
        return data


@dataclass(frozen=True)
class Alternative:
    """A configuration the search also found to fit, for comparison."""

    precision: str
    fp8_recipe: str | None
    activation_checkpointing: str
    micro_batch_size: int
    shard_group_size: int
    context_parallel: int
    tokens_per_second_per_gpu: float
    memory_gib: float
    memory_fraction: float

    def describe(self) -> str:
        precision = self.precision + (f"/{self.fp8_recipe}" if self.fp8_recipe else "")
        cp = f", CP {self.context_parallel}" if self.context_parallel > 1 else ""
        return (
            f"{precision}, {self.activation_checkpointing} AC, micro-batch {self.micro_batch_size}, "
            f"shard group {self.shard_group_size}{cp}"
        )


@dataclass(frozen=True)
class Candidate:
    """A configuration the probe measures (``tuning.probe_candidates``); number 1 is the plan's own."""

    number: int
    precision: str
    fp8_recipe: str | None
    activation_checkpointing: str
    sharding: str
    shard_group_size: int
    context_parallel: int
    micro_batch_size: int
    grad_accum_steps: int
    ramp_start_accum_steps: int | None
    tokens_per_second_per_gpu: float  # predicted
    memory_fraction: float  # predicted
    why: str = ""  # why the probe measures it
    # where its measured tokens/s per GPU may lie (the model's held-out errors for its kind of run)
    tokens_per_second_per_gpu_range: tuple[float, float] | None = None

    def surprising(self, measured: float) -> bool | None:
        """Whether a measured tokens/s per GPU lies outside the predicted range (None: no range)."""
        if self.tokens_per_second_per_gpu_range is None:
            return None
        low, high = self.tokens_per_second_per_gpu_range
        return not low <= measured <= high

    def describe(self) -> str:
        precision = self.precision + (f"/{self.fp8_recipe}" if self.fp8_recipe else "")
        cp = f", CP {self.context_parallel}" if self.context_parallel > 1 else ""
        return (
            f"{precision}, {self.activation_checkpointing} AC, micro-batch {self.micro_batch_size}, "
            f"{self.sharding} shard group {self.shard_group_size}{cp}"
        )


@dataclass(frozen=True)
class FullParameter:
    """Under LoRA: the same fine-tuning with every parameter trained, on the fewest nodes where it fits."""

    nodes: int
    setting: str
    tokens_per_second_per_gpu: float
    memory_fraction: float
    wall_time_hours: float
    cost_usd: float | None


@dataclass(frozen=True)
class Departure:
    """Where the plan leaves the tier's advice, and what that buys."""

    field: str
    tier_value: Any
    value: Any
    gain: float  # predicted throughput gain over the tier's own choice (0.25 = 25% faster)
    margin_gib: float  # memory left under the headroom
    reason: str


class _Result:
    """What a Plan and a FailedPlan share: identity, decisions and findings."""

    recipe: Recipe
    source: str | None
    decisions: tuple[Decision, ...]
    findings: tuple[Finding, ...]
    locations: dict[str, int]
    overrides: dict[str, str]

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def account_findings(self) -> list[Finding]:
        """What the account must allow for this plan (quotas to raise): never blocking."""
        return [f for f in self.findings if f.severity == "account"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def hf_id(self) -> str | None:
        """The starting checkpoint's Hugging Face id: the recipe's ``model.hf_id``, else the catalogue model's."""
        from tiered_training import catalog as catalogs

        model = self.recipe.model
        if model.hf_id is not None or model.catalog is None:
            return model.hf_id
        entry = catalogs.models().get(model.catalog)
        return entry.hf_id if entry is not None else None

    def decision(self, field_path: str) -> Decision:
        for decision in self.decisions:
            if decision.field == field_path:
                return decision
        raise KeyError(field_path)


@dataclass(frozen=True)
class FailedPlan(_Result):
    """A recipe that loads but cannot work: its errors, the decisions made before them, no estimates."""

    recipe: Recipe
    source: str | None
    model_name: str
    tier: Tier | None
    parameters: int | None
    decisions: tuple[Decision, ...] = ()
    findings: tuple[Finding, ...] = ()
    locations: dict[str, int] = field(default_factory=dict, compare=False)
    overrides: dict[str, str] = field(default_factory=dict, compare=False)  # field path -> its --set text

    memory = None  # never estimated
    estimates = None

    @property
    def nodes(self) -> int:
        return self.recipe.compute.instance_count

    def require_ok(self) -> NoReturn:
        if not self.ok:
            raise PlanError(self)
        raise AssertionError("a FailedPlan always has errors")

    def run_config(self) -> RunConfig:
        self.require_ok()
        raise AssertionError("a FailedPlan always has errors")

    def to_dict(self) -> dict[str, Any]:
        recipe = self.recipe
        return {
            "name": self.name,
            "source": self.source,
            "ok": False,
            "task": recipe.task,
            "model": {
                "name": self.model_name,
                "parameters": self.parameters,
                "tier": self.tier.name if self.tier else None,
            },
            "compute": {
                "instance_type": recipe.compute.instance_type,
                "gpu": None,
                "nodes": recipe.compute.instance_count,
                "gpus": None,
                "spot": recipe.compute.spot,
            },
            "tuning": dict.fromkeys(TUNING_KEYS)
            | {
                "sequence_length": recipe.sequence_length,
                "global_batch_tokens": recipe.budget.global_batch_tokens,
            },
            "memory_gib": None,
            "memory_fraction": None,
            "memory_headroom": self.tier.memory_headroom if self.tier else None,
            "estimates": None,
            "full_parameter": None,
            "corpus": None,
            "departures": [],
            "alternatives": [],
            "candidates": [],
            "decisions": [asdict(d) for d in self.decisions],
            "findings": [asdict(f) for f in self.findings],
        }


TUNING_KEYS = (
    "precision",
    "fp8_recipe",
    "activation_checkpointing",
    "sharding",
    "shard_group_size",
    "context_parallel",
    "micro_batch_size",
    "grad_accum_steps",
    "ramp_start_accum_steps",
    "ramp_steps",
    "adapter",
    "lora",
)


@dataclass(frozen=True)
class Plan(_Result):
    recipe: Recipe
    source: str | None  # the recipe's file, when it came from one
    model_name: str
    architecture: Architecture
    tier: Tier
    instance: Instance
    nodes: int
    # Resolved tuning
    precision: str
    fp8_recipe: str | None
    activation_checkpointing: str
    sharding: str
    shard_group_size: int  # GPUs sharing one sharded copy of the state, context-parallel ranks included
    context_parallel: int  # GPUs that split each sequence
    micro_batch_size: int  # sequences per data-parallel rank (a context-parallel group)
    grad_accum_steps: int
    ramp_start_accum_steps: int | None
    ramp_steps: int
    warmup_steps: int
    loss_chunk_tokens: int
    compile: bool
    memory: MemoryBreakdown
    estimates: Estimates
    decisions: tuple[Decision, ...] = ()
    findings: tuple[Finding, ...] = ()
    departures: tuple[Departure, ...] = ()
    alternatives: tuple[Alternative, ...] = ()  # the next fastest configurations that fit
    candidates: tuple[Candidate, ...] = ()  # what the probe measures: the plan's own first, then the next fastest
    segments: int = (
        1  # training jobs the run is split into under the runtime limit (tiered_training/planning/segments.py)
    )
    job_runtime_seconds: int = 432_000  # MaxRuntimeInSeconds of each of them
    segment_seconds: float = 0.0  # the wall-clock guard a segment stops at
    spot_wait_seconds: int | None = None  # MaxWaitTimeInSeconds of each spot segment
    instance_counts: tuple[int, ...] = ()  # InstanceCount values that keep the planned global batch
    locations: dict[str, int] = field(default_factory=dict, compare=False)  # field path -> line in source
    overrides: dict[str, str] = field(default_factory=dict, compare=False)  # field path -> its --set text
    lora: LoraSection | None = None  # task sft with LoRA: the adapters' settings
    full_parameter: FullParameter | None = None  # under LoRA: the full-parameter alternative
    corpus: CorpusPlan | None = None  # data.sources: the sources' shares and epochs, the Prepare job's size

    @property
    def task(self) -> str:
        return self.recipe.task

    @property
    def adapter(self) -> str | None:
        """none, lora or qlora for task sft; None for pretraining."""
        if not self.recipe.fine_tuning:
            return None
        if self.lora is None:
            return "none"
        return "qlora" if self.recipe.tuning.adapter == "qlora" else "lora"

    @property
    def gpus(self) -> int:
        return self.nodes * self.instance.gpus

    @property
    def parameters(self) -> int:
        return self.architecture.parameters

    def require_ok(self) -> Plan:
        if not self.ok:
            raise PlanError(self)
        return self

    @property
    def total_hours(self) -> float:
        """The run's wall time with its Prepare job (data.sources), which runs before the probe."""
        return self.estimates.wall_time_hours + (self.corpus.prepare.hours if self.corpus else 0.0)

    @property
    def total_cost_usd(self) -> float | None:
        """The run's cost with its Prepare job's; None where either has no price."""
        training = self.estimates.cost_usd
        if self.corpus is None or training is None:
            return training
        prepare = self.corpus.prepare.cost_usd
        return None if prepare is None else training + prepare

    def corpus_spec(self) -> CorpusSpec | None:
        """What the Prepare step tokenizes (``data.sources``): the one place the recipe becomes a CorpusSpec."""
        data = self.recipe.data
        if not data.sources:
            return None
        tokenizer = data.tokenizer or self.recipe.model.init_checkpoint
        assert tokenizer is not None  # the recipe's validation requires one
        return CorpusSpec(
            sources=[
                CorpusSource(
                    name=s.name,
                    uri=s.uri,
                    format=s.format,
                    field=s.field,
                    weight=s.weight,
                    tokens=s.tokens,
                    max_epochs=s.max_epochs,
                )
                for s in data.sources
            ],
            tokenizer=tokenizer,
            token_dtype=data.token_dtype,
            validation_fraction=data.validation_fraction,
            on_bad_example=data.on_bad_example or "error",
            max_bad_fraction=data.max_bad_fraction or 0.0,
            ignore=list(data.ignore),
            seed=data.seed,
            total_tokens=self.recipe.budget.total_tokens,
        )

    def mixture(self) -> list[MixtureSource] | None:
        """The trainer's view of the sources: each one's share of the budget (the planner's, normalised)."""
        if self.corpus is None:
            return None
        return [MixtureSource(name=s.name, weight=s.share) for s in self.corpus.sources]

    def run_config(self) -> RunConfig:
        """The slice the training container needs. Only for a Plan without errors."""
        self.require_ok()
        recipe = self.recipe
        precision = self._precision_config(
            self.precision, self.fp8_recipe, self.activation_checkpointing, self.sharding
        )
        alternatives = [
            CandidateConfig(
                parallel=ParallelConfig(
                    sharding=c.sharding, shard_group_size=c.shard_group_size, context_parallel=c.context_parallel
                ),
                precision=self._precision_config(c.precision, c.fp8_recipe, c.activation_checkpointing, c.sharding),
                micro_batch_size=c.micro_batch_size,
                grad_accum_steps=c.grad_accum_steps,
                ramp_start_accum_steps=c.ramp_start_accum_steps,
            )
            for c in self.candidates[1:]
        ]
        return RunConfig(
            recipe_name=recipe.name,
            model=ModelConfig(
                name=self.model_name,
                init_checkpoint=recipe.model.init_checkpoint,
                hf_id=self.hf_id,
                **self.architecture.model_dump(),
            ),
            parallel=ParallelConfig(
                sharding=self.sharding, shard_group_size=self.shard_group_size, context_parallel=self.context_parallel
            ),
            precision=precision,
            batch=BatchConfig(
                sequence_length=recipe.sequence_length,
                micro_batch_size=self.micro_batch_size,
                grad_accum_steps=self.grad_accum_steps,
                global_batch_tokens=recipe.budget.global_batch_tokens,
                total_steps=self.estimates.total_steps,
                ramp_start_accum_steps=self.ramp_start_accum_steps,
                ramp_steps=self.ramp_steps,
            ),
            optimizer=OptimizerConfig(
                lr=recipe.optimizer.lr,
                min_lr_ratio=recipe.optimizer.min_lr_ratio,
                warmup_steps=self.warmup_steps,
                schedule=recipe.optimizer.schedule,
                weight_decay=recipe.optimizer.weight_decay,
                grad_clip=recipe.optimizer.grad_clip,
                beta1=recipe.optimizer.beta1,
                beta2=recipe.optimizer.beta2,
                max_nonfinite_skips=recipe.optimizer.max_nonfinite_skips,
            ),
            data=DataConfig(token_dtype=recipe.data.token_dtype, seed=recipe.data.seed, mixture=self.mixture()),
            checkpoint=CheckpointConfig(
                interval_minutes=recipe.checkpointing.interval_minutes,
                interval_steps=0,  # by time; the trainer also saves on SIGTERM
                keep_last=recipe.checkpointing.keep_last,
                shutdown_deadline_seconds=recipe.checkpointing.shutdown_deadline_seconds,
            ),
            hardware=HardwareConfig(
                instance_type=self.instance.name,
                gpus_per_node=self.instance.gpus,
                peak_bf16_flops=self.instance.peak_bf16_flops,
                hbm_bytes=self.instance.hbm_bytes,
                min_nodes=self.tier.min_nodes_for(self.lora is not None),
                nvlink_bytes_per_s=self.instance.nvlink_gbytes_per_s * 1e9,
                network_bits_per_s=self.instance.efa_gbps * 1e9,
            ),
            probe=ProbeConfig(
                steps=recipe.probe.steps,
                alternatives=alternatives,
                memory_limit=self.probe_memory_limit,
                predicted=[
                    (c.tokens_per_second_per_gpu, *c.tokens_per_second_per_gpu_range)
                    for c in self.candidates
                    if c.tokens_per_second_per_gpu_range is not None
                ]
                if all(c.tokens_per_second_per_gpu_range is not None for c in self.candidates)
                else [],
            ),
            metrics=MetricsConfig(plan_tokens_per_second_per_gpu=round(self.estimates.tokens_per_second_per_gpu, 2)),
            tracking=TrackingConfig(
                mlflow_tracking_uri=recipe.tracking.mlflow_tracking_server_arn,
                experiment_name=recipe.tracking.mlflow_experiment or recipe.name,
                tensorboard_dir=TENSORBOARD_DIR if recipe.tracking.tensorboard else None,
            ),
            validation=self.validation_config(),
            export=ExportConfig(format=self.recipe.export.format),
            evaluation=EvaluationConfig(**recipe.evaluation.model_dump()),
            run=RunSection(segments=self.segments, segment_seconds=self.segment_seconds),
            sft=self.sft_config(),
            dpo=self.dpo_config(),
        )

    def _precision_config(
        self, precision: str, fp8_recipe: str | None, checkpointing: str, sharding: str
    ) -> PrecisionConfig:
        """A configuration's precision section: FSDP all-gathers in float8 with tensorwise scaling when sharded."""
        return PrecisionConfig(
            precision=precision,
            fp8_recipe=fp8_recipe,
            fp8_all_gather=fp8_recipe == "tensorwise" and sharding != "none",
            activation_checkpointing=checkpointing,
            compile=self.compile,
            loss_chunk_tokens=self.loss_chunk_tokens,
        )

    @property
    def probe_memory_limit(self) -> float:
        """Peak memory fraction (0-1) a probe candidate may reach: the tier's headroom, or all of the HBM for a
        pinned configuration that the plan keeps over the headroom (its "tight" warning)."""
        if self.memory.fraction > self.tier.memory_headroom:
            return 1.0
        return self.tier.memory_headroom

    def dpo_config(self) -> DpoConfig | None:
        """The preference section of the RunConfig: None unless task dpo."""
        from tiered_training.planning.preference import dpo_config

        return dpo_config(self.recipe, self.adapter)

    def sft_config(self) -> SftConfig | None:
        """The fine-tuning section of the RunConfig: None for pretraining."""
        if not self.recipe.fine_tuning:
            return None
        if self.lora is None:
            return SftConfig(adapter="none")
        lora = self.lora
        return SftConfig(
            adapter="qlora" if self.adapter == "qlora" else "lora",
            lora=LoraConfig(
                rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, target_modules=list(lora.target_modules)
            ),
        )

    def validation_config(self) -> ValidationConfig:
        """Where the validation loss comes from: the recipe's validation_uri, a held-out fraction, or nowhere."""
        recipe = self.recipe
        timing = {"interval_minutes": recipe.validation.interval_minutes, "batches": recipe.validation.batches}
        if recipe.data.validation_uri or (recipe.data.sources and recipe.data.validation_fraction > 0):
            return ValidationConfig(source="channel", **timing)  # data.sources: the Prepare step's held-out shards
        if recipe.data.validation_fraction > 0:
            return ValidationConfig(
                source="holdout", holdout_every=max(2, round(1 / recipe.data.validation_fraction)), **timing
            )
        return ValidationConfig(source="none", **timing)

    def to_dict(self) -> dict[str, Any]:
        """Stable, JSON-ready form (``plan --format json``)."""
        return {
            "name": self.name,
            "source": self.source,
            "ok": self.ok,
            "task": self.task,
            "model": {"name": self.model_name, "parameters": self.parameters, "tier": self.tier.name},
            "compute": {
                "instance_type": self.instance.name,
                "gpu": self.instance.gpu,
                "nodes": self.nodes,
                "gpus": self.gpus,
                "spot": self.recipe.compute.spot,
            },
            "tuning": {
                "precision": self.precision,
                "fp8_recipe": self.fp8_recipe,
                "activation_checkpointing": self.activation_checkpointing,
                "sharding": self.sharding,
                "shard_group_size": self.shard_group_size,
                "context_parallel": self.context_parallel,
                "micro_batch_size": self.micro_batch_size,
                "grad_accum_steps": self.grad_accum_steps,
                "ramp_start_accum_steps": self.ramp_start_accum_steps,
                "ramp_steps": self.ramp_steps,
                "adapter": self.adapter,
                "lora": self.lora.model_dump() if self.lora else None,
                "sequence_length": self.recipe.sequence_length,
                "global_batch_tokens": self.recipe.budget.global_batch_tokens,
            },
            "memory_gib": self.memory.as_gib(),
            "memory_fraction": round(self.memory.fraction, 4),
            "memory_headroom": self.tier.memory_headroom,
            "estimates": self.estimates.to_dict(),
            "run": {
                "segments": self.segments,
                "job_runtime_seconds": self.job_runtime_seconds,
                "spot_wait_seconds": self.spot_wait_seconds,
                "instance_counts": list(self.instance_counts),
            },
            "full_parameter": asdict(self.full_parameter) if self.full_parameter else None,
            "corpus": self.corpus.to_dict() if self.corpus else None,
            "departures": [asdict(d) for d in self.departures],
            "alternatives": [asdict(a) for a in self.alternatives],
            "candidates": [asdict(c) for c in self.candidates],
            "decisions": [asdict(d) for d in self.decisions],
            "findings": [asdict(f) for f in self.findings],
        }


PlanResult = Plan | FailedPlan


def finding_line(plan: PlanResult, finding: Finding) -> int | None:
    """The recipe line a finding points at: its field's, or the nearest parent's."""
    line = plan.locations.get(finding.field) if finding.field else None
    if line is None and finding.field:
        parts = finding.field.split(".")
        for end in range(len(parts) - 1, 0, -1):
            line = plan.locations.get(".".join(parts[:end]))
            if line:
                break
    return line


def finding_override(plan: PlanResult, finding: Finding) -> str | None:
    """The ``--set`` that gave the finding's field (or a section above it) its value: where the cause is, not the
    file's line of a value the override replaced."""
    if not finding.field:
        return None
    parts = finding.field.split(".")
    for end in range(len(parts), 0, -1):
        text = plan.overrides.get(".".join(parts[:end]))
        if text:
            return text
    return None


def finding_place(plan: PlanResult, finding: Finding) -> tuple[str | None, int | None]:
    """Where a finding points: ``("--set key=value", None)`` when an override set its field, else the recipe's
    source and the line of the field (or its nearest parent)."""
    override = finding_override(plan, finding)
    if override:
        return f"--set {override}", None
    return plan.source, finding_line(plan, finding)


def format_finding(plan: PlanResult, finding: Finding) -> str:
    """``error: FILE:LINE: FIELD: MESSAGE. Fix: FIX. [CODE]``: the command line's one error format
    (a recipe problem's, with the severity first and the finding's code last)."""
    source, line = finding_place(plan, finding)
    where = escape(source or plan.name)
    if line:
        where += f":{line}"
    field = f" {finding.field}:" if finding.field else ""
    fix = f" Fix: {finding.fix}." if finding.fix else ""
    return f"{finding.severity}: {where}:{field} {finding.message}.{fix} [{finding.code}]"


class PlanError(Exception):
    """A recipe that loads but cannot work: the plan has hard errors."""

    def __init__(self, plan: PlanResult):
        self.plan = plan
        super().__init__(str(self))

    def __str__(self) -> str:
        lines = [f"{self.plan.name}: {len(self.plan.errors)} error(s)"]
        lines += [f"  {format_finding(self.plan, f)}" for f in self.plan.errors]
        return "\n".join(lines)
