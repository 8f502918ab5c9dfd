"""RunConfig: the one contract between the planner and the training container.

The planner builds it from a Plan (``Plan.run_config()``); the pipeline passes it
to the training job as hyperparameters; the container in ``training/`` reads it
back with :meth:`RunConfig.from_hyperparameters`. There is no second schema.

Hyperparameters are flat: one key per leaf field, dotted (``model.layers``), each
value JSON-encoded as a string. SageMaker allows at most 100 keys and 2,500
characters per value.
"""

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tiered_training.contract.architecture import Architecture
from tiered_training.contract.corpus import MixtureSource

MAX_HYPERPARAMETERS = 100
MAX_HYPERPARAMETER_VALUE = 2500
# Paths and names both sides of the contract use (tiered_training/contract/container.py).
from tiered_training.contract.container import TENSORBOARD_DIR, VALIDATION_CHANNEL  # noqa: E402,F401


class _Frozen(BaseModel):
    # Validators are built on first use: a plan uses two of these models, the container all of them.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


# A Hugging Face Hub model id, owner/name (what from_pretrained resolves on the Hub)
HF_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"


class ModelConfig(Architecture):
    """The model to train: its architecture, a display name and an optional starting checkpoint."""

    model_config = ConfigDict(defer_build=True)
    name: str
    init_checkpoint: str | None = Field(
        default=None, description="S3 URI of a Hugging Face checkpoint; the pipeline mounts it as the 'model' channel"
    )
    hf_id: str | None = Field(
        default=None,
        pattern=HF_ID_PATTERN,
        description="the Hugging Face id of the starting checkpoint: an adapter export names it as its base",
    )


class ParallelConfig(_Frozen):
    """world = replicate x shard x context_parallel GPUs.

    ``shard_group_size`` counts the context-parallel ranks: FSDP shards the state over
    shard x context_parallel GPUs, so it is a multiple of ``context_parallel``.
    """

    sharding: Literal["full", "hybrid", "none"]
    shard_group_size: int = Field(ge=1, description="GPUs that share one copy of the sharded state")
    context_parallel: int = Field(
        default=1,
        ge=1,
        description=(
            "GPUs that split each sequence (ring attention). world = replicate x shard x cp; FSDP shards over the "
            "flattened (shard, cp) ranks, so shard_group_size counts the cp ranks and is a multiple of it; "
            "a data-parallel rank is a cp group, and micro_batch_size counts sequences per cp group"
        ),
    )

    @model_validator(mode="after")
    def _context_parallel_fits(self) -> "ParallelConfig":
        cp = self.context_parallel
        if cp > 1 and self.sharding == "none":
            raise ValueError(
                f"context_parallel {cp} needs sharded state: FSDP shards it over the context-parallel ranks; "
                "set sharding to full, or hybrid with shard_group_size a multiple of context_parallel"
            )
        if self.shard_group_size % cp:
            raise ValueError(
                f"shard_group_size {self.shard_group_size} is not a multiple of context_parallel {cp}: "
                "the GPUs sharing one sharded copy include the context-parallel ranks"
            )
        return self


class PrecisionConfig(_Frozen):
    precision: Literal["bf16", "fp8", "fp32"]
    fp8_recipe: Literal["tensorwise", "rowwise", "mxfp8"] | None = None
    fp8_all_gather: bool = Field(default=False, description="FSDP all-gathers in float8 (tensorwise only)")
    activation_checkpointing: Literal["none", "selective", "full"]
    compile: bool = False
    loss_chunk_tokens: int = Field(default=4096, ge=1, description="tokens per chunk of the vocabulary loss")


class BatchConfig(_Frozen):
    sequence_length: int
    micro_batch_size: int
    grad_accum_steps: int = Field(description="at the full global batch")
    global_batch_tokens: int
    total_steps: int
    ramp_start_accum_steps: int | None = Field(default=None, description="accumulation at step 0 when ramping")
    ramp_steps: int = 0

    def accum_steps_at(self, step: int) -> int:
        """Gradient-accumulation steps at the 0-based ``step``, under the linear batch ramp."""
        return ramp_accum_steps(step, self.ramp_start_accum_steps, self.grad_accum_steps, self.ramp_steps)


def steps_for_tokens(tokens: int, tokens_per_accum: int, start: int | None, full: int, ramp_steps: int) -> int:
    """Optimiser steps until ``tokens`` have been trained on, counting the batch ramp's smaller
    steps (``tokens_per_accum`` tokens per accumulation step, over all ranks). At least 1.

    The planner turns ``warmup_tokens`` and the token budget into steps with it, so both
    mean tokens whether the batch ramps or not.
    """
    done, step = 0, 0
    while done < tokens and step < ramp_steps:
        done += ramp_accum_steps(step, start, full, ramp_steps) * tokens_per_accum
        step += 1
    if done < tokens:
        step += -(-(tokens - done) // (full * tokens_per_accum))
    return max(1, step)


def ramp_accum_steps(step: int, start: int | None, full: int, ramp_steps: int) -> int:
    """The batch ramp, linear in accumulation steps: ``start`` at step 0, ``full`` from ``ramp_steps`` on.

    The planner counts the ramp's tokens with it and the trainer follows it, so the
    plan's step count meets the token budget exactly as the trainer runs.
    """
    if not start or ramp_steps <= 0 or step >= ramp_steps:
        return full
    return start + (full - start) * step // ramp_steps


class OptimizerConfig(_Frozen):
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    schedule: Literal["cosine", "linear", "constant"]
    weight_decay: float
    grad_clip: float
    beta1: float
    beta2: float
    max_nonfinite_skips: int = Field(
        default=3, ge=0, description="skipped non-finite steps in a row before the job stops; 0: stop at the first"
    )


class DataConfig(_Frozen):
    token_dtype: Literal["uint16", "uint32"]
    seed: int
    mixture: list[MixtureSource] | None = Field(
        default=None,
        description=(
            "pretraining from a prepared corpus: each source's shards in the folder of its name under the data "
            "channel (and the validation channel), sampled by weight over the whole budget; None: one stream"
        ),
    )


class CheckpointConfig(_Frozen):
    interval_minutes: float
    interval_steps: int = Field(default=0, ge=0, description="also save every N steps; 0 = by time only")
    keep_last: int
    shutdown_deadline_seconds: int


class HardwareConfig(_Frozen):
    """What the container needs to report MFU and memory fraction."""

    instance_type: str
    gpus_per_node: int
    peak_bf16_flops: float = Field(description="dense BF16 FLOP/s per GPU")
    hbm_bytes: int = Field(description="usable HBM per GPU")
    min_nodes: int = Field(default=1, ge=1, description="fewest hosts the plan may run on (the tier's minimum)")
    nvlink_bytes_per_s: float = Field(
        default=0.0, ge=0, description="NVLink bandwidth per GPU and direction (the probe's health check; 0: none)"
    )
    network_bits_per_s: float = Field(
        default=0.0, ge=0, description="EFA bandwidth per instance (the probe's health check; 0: none)"
    )


MAX_PROBE_CANDIDATES = 5  # the planner's top K the probe may measure (tuning.probe_candidates)


class CandidateConfig(_Frozen):
    """A configuration the probe measures besides the RunConfig's own: what differs between the planner's
    top candidates (docs/probe.md). The rest of the RunConfig (model, global batch, steps) is shared."""

    parallel: ParallelConfig
    precision: PrecisionConfig
    micro_batch_size: int = Field(ge=1)
    grad_accum_steps: int = Field(ge=1, description="at the full global batch")
    ramp_start_accum_steps: int | None = Field(default=None, description="accumulation at step 0 when ramping")

    def describe(self) -> str:
        """A short description: ``bf16, selective AC, full shard 8, micro-batch 2 x 4``."""
        p, par = self.precision, self.parallel
        precision = f"{p.precision} {p.fp8_recipe}" if p.precision == "fp8" and p.fp8_recipe else p.precision
        parts = [precision, f"{p.activation_checkpointing} AC"]
        parts.append("no sharding" if par.sharding == "none" else f"{par.sharding} shard {par.shard_group_size}")
        if par.context_parallel > 1:
            parts.append(f"CP {par.context_parallel}")
        if p.compile:
            parts.append("compiled")
        parts.append(f"micro-batch {self.micro_batch_size} x {self.grad_accum_steps}")
        return ", ".join(parts)


class ProbeConfig(_Frozen):
    """The probe (``training/probe.py``): ``steps`` optimiser steps of each candidate, each in its own launch.

    Candidate 1 is the RunConfig's own configuration (the planner's first choice); candidates 2.. are
    ``alternatives``, in the planner's order. The probe names the fastest measured candidate whose peak
    reserved memory is at most ``memory_limit`` of the HBM; the Train step runs it (``run.candidate``).
    """

    steps: int
    alternatives: list[CandidateConfig] = Field(default=[], max_length=MAX_PROBE_CANDIDATES - 1)
    memory_limit: float = Field(
        default=1.0, gt=0, le=1, description="peak reserved memory, as a fraction of hbm_bytes, a candidate may reach"
    )
    predicted: list[tuple[float, float, float]] = Field(
        default=[],
        max_length=MAX_PROBE_CANDIDATES,
        description="per candidate, in order: the predicted tokens/s per GPU and the range its measurement may "
        "fall in (the model's held-out errors); a measurement outside it is surprising. Empty: none",
    )

    @property
    def count(self) -> int:
        """Candidates the probe measures: this configuration and its alternatives."""
        return 1 + len(self.alternatives)


class ExportConfig(_Frozen):
    """The Hugging Face model written at the end (``training/export.py``)."""

    dtype: Literal["bf16", "fp32"] = Field(default="bf16", description="dtype of the exported weights")
    max_shard_bytes: int = Field(
        default=5 * 10**9, ge=1, description="split the safetensors into files of at most this size"
    )
    format: Literal["merged", "adapter"] = Field(
        default="merged",
        description="merged: full weights (LoRA merged in); adapter: the LoRA adapter in peft's format",
    )


MAX_EVALUATION_PROMPTS = 8
MAX_EVALUATION_PROMPT_CHARS = 256


class EvaluationConfig(_Frozen):
    """The evaluation of the export after the run's last step (``training/evaluation.py``): held-out loss and
    perplexity, and the export's answers to a few prompts, written as ``evaluation.json`` next to the export."""

    enabled: bool = Field(default=True, description="evaluate the export after the last segment")
    batches: int = Field(default=8, ge=1, le=1000, description="held-out micro-batches the export is scored on")
    prompts: list[str] = Field(
        default=[],
        max_length=MAX_EVALUATION_PROMPTS,
        description="prompts the export answers (greedy), as the chat template renders a user turn when it has one",
    )
    max_new_tokens: int = Field(default=64, ge=1, le=1024, description="tokens generated per prompt at most")

    @model_validator(mode="after")
    def _prompt_length(self) -> "EvaluationConfig":
        for number, prompt in enumerate(self.prompts):
            if not prompt.strip() or len(prompt) > MAX_EVALUATION_PROMPT_CHARS:
                raise ValueError(
                    f"evaluation.prompts[{number}]: {len(prompt)} characters; a prompt has 1 to "
                    f"{MAX_EVALUATION_PROMPT_CHARS} (the list travels in one hyperparameter of at most 2500)"
                )
        return self


# peft's names for the Llama and Qwen2 projections: LoRA on every linear layer of the blocks
# (QLoRA, Dettmers et al. 2023, https://arxiv.org/abs/2305.14314, found all-linear adapters
# needed to match full fine-tuning).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(_Frozen):
    """LoRA adapters through peft (``peft.LoraConfig``): the base stays frozen."""

    rank: int = Field(default=16, ge=1, le=1024, description="the adapters' rank r")
    alpha: float = Field(default=32.0, gt=0, description="scaling: the update is multiplied by alpha / rank")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="dropout on the adapters' input")
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGET_MODULES), min_length=1)


class SftConfig(_Frozen):
    """Supervised fine-tuning on packed example shards (``training/sft_data.py``).

    The shards carry a loss mask and per-example positions; attention does not cross examples.
    """

    adapter: Literal["none", "lora", "qlora"] = Field(
        default="none",
        description="none: every parameter trains; lora: adapters on a bf16 base; qlora: adapters on an NF4 base",
    )
    lora: LoraConfig | None = Field(default=None, description="with adapter lora or qlora")

    @model_validator(mode="after")
    def _lora_with_adapter(self) -> "SftConfig":
        if self.adapter != "none" and self.lora is None:
            raise ValueError(f"sft.adapter is {self.adapter} but sft.lora is not set")
        if self.adapter == "none" and self.lora is not None:
            raise ValueError("sft.lora is set but sft.adapter is none")
        return self


DPO_LOSSES = ("sigmoid", "ipo", "robust")


class DpoConfig(_Frozen):
    """Preference tuning (DPO, Rafailov et al. 2023, https://arxiv.org/abs/2305.18290) on packed pairs
    (``training/dpo_data.py``), each loss as trl's ``DPOTrainer`` computes it (``training/dpo_loss.py``).

    The fine-tuning section (``sft``) still says full or LoRA; the shards hold pairs, chosen then rejected.
    """

    loss: Literal["sigmoid", "ipo", "robust"] = Field(
        default="sigmoid",
        description=(
            "sigmoid: -log sigmoid(beta x margin) (DPO); ipo: (margin per completion token - 1/(2 beta))^2 "
            "(Azar et al. 2023); robust: DPO with label_smoothing, the probability that a label is flipped "
            "(Chowdhury et al. 2024)"
        ),
    )
    beta: float = Field(default=0.1, gt=0, le=100, description="how far the policy may move from the reference")
    label_smoothing: float = Field(default=0.0, ge=0, lt=0.5, description="loss robust: a label's flip probability")
    reference: Literal["precomputed", "adapter_disabled"] = Field(
        default="precomputed",
        description=(
            "precomputed: a first pass of the starting weights over the data before training; adapter_disabled: "
            "the frozen base with the LoRA adapters switched off, in each step (LoRA and QLoRA only)"
        ),
    )

    @model_validator(mode="after")
    def _smoothing_with_robust(self) -> "DpoConfig":
        if self.label_smoothing and self.loss != "robust":
            raise ValueError(f"dpo.label_smoothing is for loss robust; loss is {self.loss}")
        return self


class MetricsConfig(_Frozen):
    """What the container emits to CloudWatch (``training/components/metrics.py``); the alarms are fitted to it."""

    namespace: str = "TieredTraining"
    interval_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="wall-clock cadence of the EMF metrics and of the progress heartbeat"
    )
    plan_tokens_per_second_per_gpu: float = 0.0


class TrackingConfig(_Frozen):
    """Experiment tracking beside CloudWatch (``training/components/tracking.py``)."""

    mlflow_tracking_uri: str | None = Field(
        default=None, description="a SageMaker MLflow tracking-server ARN (sagemaker-mlflow plugin) or any MLflow URI"
    )
    experiment_name: str | None = Field(default=None, description="MLflow experiment; default the recipe name")
    tensorboard_dir: str | None = Field(default=None, description="where TensorBoard event files are written")


class ValidationConfig(_Frozen):
    """Validation loss on held-out token shards (``training/components/validation.py``)."""

    source: Literal["none", "channel", "holdout"] = Field(
        default="none",
        description="channel: the 'validation' input channel; holdout: every N-th window of the training data",
    )
    holdout_every: int = Field(default=0, ge=0, description="with source=holdout: every N-th window is held out")
    interval_minutes: float = Field(default=30.0, gt=0, description="evaluate every N minutes of wall clock")
    batches: int = Field(default=8, ge=1, description="micro-batches per rank in one evaluation")


RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class RunSection(_Frozen):
    """Which run a training job belongs to, and which segment of it (docs/runs.md).

    A run is one training from step 0 to the end of its token budget; its checkpoints live
    under its own prefix, and their manifests record :meth:`RunConfig.identity`. The pipeline
    fills ``id`` (the execution id for a new run, the ``RunId`` parameter for a resume),
    ``resume`` and ``data_uri``; the planner fills the segments.
    """

    id: str = Field(default="", description="the run id (part of the checkpoint prefix); empty outside a pipeline")
    resume: bool = Field(default=False, description="this execution resumes the named run: no checkpoint is an error")
    data_uri: str = Field(default="", description="the training data's S3 URI, as the execution gave it")
    segment: int = Field(default=1, ge=1, description="this training job's segment of the run, 1-based")
    segments: int = Field(default=1, ge=1, description="training jobs the run is split into (the runtime limit)")
    segment_seconds: float = Field(
        default=0.0, ge=0, description="a segment saves and hands over after this long in one attempt; 0: no time limit"
    )
    candidate: int = Field(
        default=0,
        ge=0,
        le=MAX_PROBE_CANDIDATES,
        description=(
            "the probe candidate this job trains (1: the RunConfig's own configuration, n: probe.alternatives[n-2]), "
            "as the probe chose it; 0: the candidate the run's checkpoints record, else 1"
        ),
    )

    @model_validator(mode="after")
    def _segment_in_range(self) -> "RunSection":
        if self.segment > self.segments:
            raise ValueError(f"run.segment {self.segment} is beyond run.segments {self.segments}")
        return self

    def end_step(self, total_steps: int) -> int:
        """The step this segment trains to: the run's steps split evenly, the last segment to the end."""
        return -(-total_steps * self.segment // self.segments)


class RunConfig(_Frozen):
    recipe_name: str
    model: ModelConfig
    parallel: ParallelConfig
    precision: PrecisionConfig
    batch: BatchConfig
    optimizer: OptimizerConfig
    data: DataConfig
    checkpoint: CheckpointConfig
    hardware: HardwareConfig
    probe: ProbeConfig
    metrics: MetricsConfig = MetricsConfig()
    tracking: TrackingConfig = TrackingConfig()
    validation: ValidationConfig = ValidationConfig()
    export: ExportConfig = ExportConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    run: RunSection = RunSection()
    sft: SftConfig | None = Field(default=None, description="None: pretraining on flat token shards")
    dpo: DpoConfig | None = Field(default=None, description="preference pairs (with sft); None: SFT or pretraining")

    @model_validator(mode="after")
    def _export_format_fits_the_task(self) -> "RunConfig":
        if self.export.format == "adapter" and (self.sft is None or self.sft.adapter == "none"):
            raise ValueError("export.format is adapter, but the run trains no LoRA adapter (sft.adapter: lora)")
        if self.sft is not None and self.sft.adapter == "qlora" and self.precision.precision != "bf16":
            raise ValueError(
                f"sft.adapter qlora computes in bf16 from an NF4 base; precision.precision is "
                f"{self.precision.precision} (set bf16)"
            )
        if self.sft is not None and self.sft.adapter == "qlora" and self.precision.compile:
            raise ValueError("sft.adapter qlora runs eager (the NF4 base is not compiled); set precision.compile false")
        if self.sft is not None and self.model.init_checkpoint is None:
            raise ValueError("sft needs model.init_checkpoint: fine-tuning starts from trained weights")
        if self.dpo is not None and self.sft is None:
            raise ValueError("dpo needs the sft section: preference tuning fine-tunes (full or LoRA)")
        if (
            self.dpo is not None
            and self.sft is not None
            and self.dpo.reference == "adapter_disabled"
            and self.sft.adapter == "none"
        ):
            raise ValueError(
                "dpo.reference adapter_disabled needs LoRA adapters (sft.adapter lora or qlora); "
                "a full fine-tune uses dpo.reference precomputed"
            )
        return self

    @model_validator(mode="after")
    def _sequence_splits_over_context_parallel(self) -> "RunConfig":
        cp = self.parallel.context_parallel
        if cp > 1 and self.sft is not None:
            raise ValueError(
                f"parallel.context_parallel {cp} with sft: ring attention is causal over the whole sequence and has "
                "no document mask, so the packed examples of a sequence would attend to each other; set "
                "parallel.context_parallel to 1 (or a batch.sequence_length that fits one GPU)"
            )
        if cp > 1 and self.batch.sequence_length % (2 * cp):
            raise ValueError(
                f"batch.sequence_length {self.batch.sequence_length} is not a multiple of 2 x context_parallel "
                f"({2 * cp}): each context-parallel rank holds one chunk from the head and one from the tail "
                "of every sequence (load balancing for the causal mask)"
            )
        return self

    @model_validator(mode="after")
    def _candidate_exists(self) -> "RunConfig":
        if self.run.candidate > self.probe.count:
            raise ValueError(
                f"run.candidate {self.run.candidate} is beyond the probe's {self.probe.count} candidate(s) "
                f"(1 and probe.alternatives)"
            )
        return self

    def with_candidate(self, number: int) -> "RunConfig":
        """This RunConfig running probe candidate ``number`` (1-based; 1 is its own configuration):
        the candidate's parallel layout, precision, micro-batch and accumulation, and ``run.candidate`` set."""
        if not 1 <= number <= self.probe.count:
            raise ValueError(f"probe candidate {number} does not exist: the probe has {self.probe.count}")
        run = self.run.model_copy(update={"candidate": number})
        if number == 1:
            return self.model_copy(update={"run": run})
        c = self.probe.alternatives[number - 2]
        batch = self.batch.model_copy(
            update={
                "micro_batch_size": c.micro_batch_size,
                "grad_accum_steps": c.grad_accum_steps,
                "ramp_start_accum_steps": c.ramp_start_accum_steps,
            }
        )
        return self.model_copy(update={"parallel": c.parallel, "precision": c.precision, "batch": batch, "run": run})

    def candidate_config(self, number: int) -> "CandidateConfig":
        """Candidate ``number``'s configuration (1: this RunConfig's own)."""
        if number == 1:
            b = self.batch
            return CandidateConfig(
                parallel=self.parallel,
                precision=self.precision,
                micro_batch_size=b.micro_batch_size,
                grad_accum_steps=b.grad_accum_steps,
                ramp_start_accum_steps=b.ramp_start_accum_steps,
            )
        return self.probe.alternatives[number - 2]

    def mfu(self, tokens_per_second_per_gpu: float, *, causal: bool = False) -> float:
        """Model FLOPs utilisation (a fraction) with the planner's FLOPs formula over the BF16 peak,
        so FP8 runs report BF16-equivalent MFU. Full-attention FLOPs (6N + 12*L*h*s), or with
        ``causal`` the causal ones (6N + 6*L*h*s): at long context they differ by a large factor.
        Under LoRA the frozen base computes no weight gradients (4N, plus 6 per adapter parameter)."""
        lora = None
        if self.sft is not None and self.sft.lora is not None:
            from tiered_training.contract.architecture import Lora

            lora = Lora(
                self.sft.lora.rank,
                tuple(self.sft.lora.target_modules),
                self.sft.lora.dropout > 0,
                quantized=self.sft.adapter == "qlora",
            )
        flops = self.model.flops_per_token(self.batch.sequence_length, causal=causal, lora=lora)
        return flops * tokens_per_second_per_gpu / self.hardware.peak_bf16_flops

    def identity_parts(self) -> dict[str, str]:
        """Short hashes of what a run's state depends on, by part; a resume needs every part equal.

        ``model``: the architecture and starting checkpoint (the weights' shapes); ``batch``: the
        sequence length and global batch (the data position counts windows of it); ``data``: the
        token type and shuffle seed (the order of the windows); ``sft``, for fine-tuning only: the
        adapter and its settings (what the checkpoint's trained state is). The step count is not part
        of it (``MaxSteps`` may extend a run), nor the micro-batch and accumulation (they follow the world).
        """
        import hashlib

        parts = {
            "model": self.model.model_dump(mode="json", exclude={"name", "hf_id"}),  # names, not weights
            "batch": {
                "sequence_length": self.batch.sequence_length,
                "global_batch_tokens": self.batch.global_batch_tokens,
            },
            # a mixture only when there is one, so the identity of a run without one stays as it was
            "data": self.data.model_dump(mode="json", exclude=None if self.data.mixture else {"mixture"}),
        }
        if self.sft is not None:  # absent for pretraining, so pretraining plan hashes stay as they were
            parts["sft"] = self.sft.model_dump(mode="json")
        if self.dpo is not None:  # absent otherwise, so SFT plan hashes stay as they were
            parts["dpo"] = self.dpo.model_dump(mode="json")
        return {
            name: hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]
            for name, value in parts.items()
        }

    def plan_hash(self) -> str:
        """One hash of :meth:`identity_parts`."""
        import hashlib

        return hashlib.sha256(json.dumps(self.identity_parts(), sort_keys=True).encode()).hexdigest()[:12]

    # -- SageMaker hyperparameters -------------------------------------------------

    def to_hyperparameters(self) -> dict[str, str]:
        """Flat ``{"section.field": json}`` strings, within SageMaker's limits."""
        flat: dict[str, str] = {}
        for section, value in self.model_dump(mode="json").items():
            if section == "dpo" and value is None:
                continue  # optional: a run without preference pairs has no key for it
            if isinstance(value, dict):
                for key, leaf in value.items():
                    if section == "data" and key == "mixture" and leaf is None:
                        continue  # optional: a run without a mixture has no key for it
                    flat[f"{section}.{key}"] = json.dumps(leaf)
            else:
                flat[section] = json.dumps(value)
        if len(flat) > MAX_HYPERPARAMETERS:
            raise ValueError(f"RunConfig has {len(flat)} hyperparameters; SageMaker allows {MAX_HYPERPARAMETERS}")
        for key, text in flat.items():
            if len(text) > MAX_HYPERPARAMETER_VALUE:
                raise ValueError(
                    f"hyperparameter {key} is {len(text)} characters; the limit is {MAX_HYPERPARAMETER_VALUE}"
                )
        return flat

    @classmethod
    def from_hyperparameters(cls, hyperparameters: dict[str, Any]) -> "RunConfig":
        """Inverse of :meth:`to_hyperparameters`. Unknown keys are errors.

        Values may be JSON strings (as SageMaker writes them) or already decoded.
        SageMaker's own keys (``sagemaker_*``) are ignored.
        """
        nested: dict[str, Any] = {}
        for key, raw in hyperparameters.items():
            if key.startswith("sagemaker_"):
                continue
            value = _decode(raw)
            section, _, leaf = key.partition(".")
            if leaf:
                nested.setdefault(section, {})[leaf] = value
            else:
                nested[section] = value
        return cls.model_validate(nested)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return cls.model_validate_json(text)


def _decode(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
