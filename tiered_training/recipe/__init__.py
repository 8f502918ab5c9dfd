"""The recipe: what a user asks for, as reviewed YAML.

Every tuning field may be ``auto``; the planner (``planner.py``) replaces each
``auto`` with a decision and a reason. Unknown keys are errors.
"""

import json
import re
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tiered_training.contract.architecture import Architecture
from tiered_training.contract.corpus import SOURCE_NAME_PATTERN, CorpusFormat
from tiered_training.contract.runconfig import HF_ID_PATTERN, MAX_PROBE_CANDIDATES
from tiered_training.recipe.names import longest_name, name_problem

AUTO: Final = "auto"
# A cross-field error names its field with this prefix; the loader points at that field.
AT = "at "
Auto = Literal["auto"]

PIPELINE_NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$"
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$"
SNS_ARN_PATTERN = r"^arn:aws[a-z\-]*:sns:[a-z0-9\-]+:\d{12}:[A-Za-z0-9_\-]{1,256}$"
TRAINING_PLAN_ARN_PATTERN = r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:\d{12}:training-plan/.{1,63}$"
EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"
MLFLOW_SERVER_ARN_PATTERN = (
    r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:\d{12}:mlflow-tracking-server/[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}$"
)
KMS_KEY_ARN_PATTERN = r"^arn:aws[a-z\-]*:kms:[a-z0-9\-]+:\d{12}:key/[A-Za-z0-9\-]{1,128}$"
REGION_PATTERN = r"^[a-z]{2}(-gov)?-[a-z]+-\d$"
# An ECR image: <account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag> or @sha256:<digest>.
ECR_IMAGE_PATTERN = (
    r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/[a-z0-9._/-]+(:[\w.-]+|@sha256:[0-9a-f]{64})$"
)
# What each pattern means, with an example: messages say this, never the regular expression.
PATTERN_MEANING = {
    PIPELINE_NAME_PATTERN: "letters, digits and hyphens, starting and ending with a letter or digit, such as my-8b",
    S3_URI_PATTERN: "an S3 URI: s3://, a bucket name (3-63 lower-case letters, digits, dots, hyphens), "
    "then a key, such as s3://my-bucket/tokens/",
    SNS_ARN_PATTERN: "an SNS topic ARN, such as arn:aws:sns:us-east-1:123456789012:alarms",
    TRAINING_PLAN_ARN_PATTERN: "a SageMaker training plan ARN, "
    "such as arn:aws:sagemaker:us-east-1:123456789012:training-plan/my-plan",
    EMAIL_PATTERN: "an e-mail address, such as ml-team@example.com",
    MLFLOW_SERVER_ARN_PATTERN: "a SageMaker MLflow tracking server ARN, "
    "such as arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/my-server",
    KMS_KEY_ARN_PATTERN: "a KMS key ARN, "
    "such as arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    REGION_PATTERN: "an AWS region name, such as us-east-1",
    HF_ID_PATTERN: "a Hugging Face model id, owner/name, such as meta-llama/Llama-3.1-8B-Instruct",
}
# An S3 URI: s3:// (5), a bucket name (at most 63), / and a key (at most 1024).
S3_URI_MAX = 5 + 63 + 1 + 1024
# Upper bounds that catch a slip of the keyboard long before anything overflows.
MAX_TOKENS = 10**15
MAX_BATCH_TOKENS = 2**30
MAX_SEED = 2**32 - 1  # numpy and CUDA generators take 32-bit seeds
# AWS allows 50 tags on a resource; the constructs add one (the recipe tag).
MAX_TAGS = 49

Precision = Literal["bf16", "fp8", "fp32"]
Fp8Recipe = Literal["tensorwise", "rowwise", "mxfp8"]
Checkpointing = Literal["none", "selective", "full"]
Sharding = Literal["full", "hybrid", "none"]


def _instance_types(schema: dict[str, Any]) -> None:
    """The schema's enum of instance types: the catalogue's, which the planner accepts."""
    from tiered_training.catalog import instances

    schema["enum"] = sorted(instances())


def _catalogue_models(schema: dict[str, Any]) -> None:
    """The schema's enum of catalogue model ids, on the text branch of an optional field."""
    from tiered_training.catalog import models

    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "string":
            branch["enum"] = sorted(models())


def _name_length(schema: dict[str, Any]) -> None:
    schema["maxLength"] = longest_name()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSection(_Strict):
    """One of ``catalog`` (an id from ``tiered-training models``), ``dimensions`` or ``hf_config``."""

    catalog: str | None = Field(
        default=None,
        max_length=128,
        description="a model id from the catalogue (tiered-training models)",
        json_schema_extra=_catalogue_models,
    )
    dimensions: Architecture | None = None
    hf_config: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description=(
            "a local Hugging Face checkpoint directory, or its config.json, whose dimensions the planner reads "
            "(relative paths from the recipe's directory); Llama, Mistral, Qwen2 and Qwen3 model types"
        ),
    )
    name: str | None = Field(default=None, max_length=256, description="display name for explicit dimensions")
    init_checkpoint: str | None = Field(
        default=None,
        pattern=S3_URI_PATTERN,
        max_length=S3_URI_MAX,
        description="S3 URI of a Hugging Face checkpoint to start from",
    )
    hf_id: str | None = Field(
        default=None,
        pattern=HF_ID_PATTERN,
        max_length=193,
        description=(
            "the Hugging Face id of init_checkpoint (owner/name), which an adapter export names as its base "
            "(base_model_name_or_path); default: the catalogue model's id. Set it when init_checkpoint is another "
            "checkpoint than the catalogue's (an instruct model, a fine-tune)"
        ),
    )
    allow_outside_tiers: bool = Field(
        default=False, description="acknowledge a model outside the 1B-64B range the tiers cover"
    )

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSection":
        if sum(source is not None for source in (self.catalog, self.dimensions, self.hf_config)) != 1:
            raise ValueError(
                "give exactly one of 'catalog' (a catalogue id), 'dimensions' or 'hf_config' (a local config.json)"
            )
        return self


class PrepareSection(_Strict):
    """The Prepare step, a SageMaker Processing job before the probe: task sft packs the raw examples under
    ``data.uri``; pretraining with ``data.sources`` tokenizes the raw corpora on ``instance_count`` hosts."""

    instance_type: str = Field(
        default="ml.m5.4xlarge",
        pattern=r"^ml\.[a-z0-9-]+\.[a-z0-9]+$",
        max_length=64,
        description="the CPU instance of the Prepare step's SageMaker Processing job",
    )
    volume_gb: int = Field(
        default=200, ge=1, le=16384, description="its EBS volume: the raw examples, the tokenizer and the shards"
    )
    max_runtime_hours: float = Field(default=24, gt=0, le=5 * 24, description="the longest the Prepare job may run")
    instance_count: Annotated[int, Field(ge=1, le=100)] | Auto = Field(
        default=AUTO,
        description=(
            "hosts of the Prepare job (data.sources only; task sft packs on one); auto: the fewest that keep Prepare "
            "within max_share of the run"
        ),
    )
    max_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="data.sources with instance_count auto: the largest share of the run's wall time Prepare may take",
    )


class SourceSection(_Strict):
    """One raw pretraining corpus (``data.sources``): an S3 prefix of files of one format and its share."""

    name: str = Field(pattern=SOURCE_NAME_PATTERN, description="names the source in shards, metrics and messages")
    uri: str = Field(pattern=S3_URI_PATTERN, max_length=S3_URI_MAX, description="S3 prefix of the raw files")
    format: CorpusFormat = Field(
        default="auto",
        description=(
            "parquet (a column), jsonl / json (a field), text (a file per document), text_lines (a line per "
            "document), saved_dataset (datasets' save_to_disk), or auto (by each file's suffix); gzip and zstd "
            "files are read as such"
        ),
    )
    field: str = Field(default="text", min_length=1, max_length=256, description="the column or field of the text")
    weight: float | None = Field(default=None, gt=0, le=1e6, description="the source's share of the budget, relative")
    tokens: int | None = Field(
        default=None, gt=0, le=MAX_TOKENS, description="or the tokens of the budget to take from this source"
    )
    max_epochs: float = Field(
        default=4.0,
        gt=0,
        le=1000,
        description=(
            "the most times the budget may repeat the source; beyond 4 repeated data is worth much less than new "
            "(Muennighoff et al. 2023, Scaling Data-Constrained Language Models)"
        ),
    )
    tokens_estimate: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description=("the tokens the source holds, for the plan's epochs; default: unknown until preflight samples it"),
    )

    @model_validator(mode="after")
    def _one_share(self) -> "SourceSection":
        if (self.weight is None) == (self.tokens is None):
            raise ValueError(f"source {self.name}: give exactly one of weight (a relative share) or tokens")
        return self


def _uri_or_sources(schema: dict[str, Any]) -> None:
    """The schema of ``data``: ``uri`` may be left out with ``sources`` (the loader requires one of them)."""
    schema["required"] = [name for name in schema.get("required", []) if name != "uri"]
    if not schema["required"]:
        del schema["required"]


class DataSection(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, json_schema_extra=_uri_or_sources)

    uri: str = Field(pattern=S3_URI_PATTERN, max_length=S3_URI_MAX, description="S3 prefix of flat token shards")
    allowed_uris: list[Annotated[str, Field(pattern=S3_URI_PATTERN, max_length=S3_URI_MAX)]] | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="S3 prefixes that the DataUri pipeline parameter may name; default: [uri]",
    )
    kms_key_arn: str | None = Field(
        default=None,
        pattern=KMS_KEY_ARN_PATTERN,
        description="ARN of the KMS key that encrypts the data (a key, not an alias); the jobs may decrypt with it",
    )
    token_dtype: Literal["uint16", "uint32"] = "uint32"
    input_mode: Literal["FastFile", "File"] = "FastFile"
    validation_uri: str | None = Field(
        default=None,
        pattern=S3_URI_PATTERN,
        max_length=S3_URI_MAX,
        description="S3 prefix of held-out token shards for the validation loss",
    )
    validation_fraction: float = Field(
        default=0.001,
        ge=0,
        le=0.5,
        description=(
            "without validation_uri: the share of the training windows held out for validation; 0 = no validation loss"
        ),
    )
    seed: int = Field(default=1234, ge=0, le=MAX_SEED)
    loss_on: Literal["assistant", "all"] | None = Field(
        default=None,
        description=(
            "task sft: the tokens the loss counts, as the shards must have been packed (python -m training.sft_data "
            "--loss-on): assistant (the assistant turns or completions) or all; preflight checks the shards' manifest; "
            "default: not checked"
        ),
    )
    overlong: Literal["error", "drop", "truncate"] | None = Field(
        default=None,
        description=(
            "task sft: what packing did with an example longer than sequence_length (python -m training.sft_data "
            "--overlong): error, drop or truncate; preflight checks the shards' manifest; default: not checked"
        ),
    )
    format: Literal["auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text", "preference"] | None = Field(
        default=None,
        description=(
            "task sft: the raw examples' format (python -m training.sft_data --format): messages (OpenAI/trl chat, "
            "tool calls included), sharegpt, alpaca, prompt_completion, text (continued pretraining), or auto "
            "(decided per file from its first valid record); task dpo: preference (trl's prompt/chosen/rejected, "
            "python -m training.dpo_data); preflight checks the shards' manifest; default: not "
            "checked (the command's default: auto)"
        ),
    )
    on_bad_example: Literal["error", "skip"] | None = Field(
        default=None,
        description=(
            "task sft: what preparing did with a bad example (--on-bad-example): error stops at it, naming the file, "
            "line and reason; skip leaves it out and counts it; preflight checks the shards' manifest; default: not "
            "checked (the command's default: error)"
        ),
    )
    max_bad_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=(
            "task sft, with on_bad_example skip: the largest share of bad examples preparing accepted "
            "(--max-bad-fraction); preflight checks the shards' manifest; default: not checked "
            "(the command's default: 0)"
        ),
    )
    ignore: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default=[],
        max_length=100,
        description=(
            "task sft with data.prepare: globs of objects under uri that are not examples (such as '*.md', "
            "'.DS_Store'), matched against the key under uri and the file name; the Prepare step and preflight "
            "list them and leave them out; any other object that is not .jsonl, .json (either gzipped) or "
            ".parquet is refused, by name; with data.sources: globs of raw files under the sources to leave out "
            "(matched against the key), any file no reader takes being refused; default: none"
        ),
    )

    prepare: PrepareSection | None = Field(
        default=None,
        description=(
            "task sft: uri holds raw examples (JSON Lines, JSON, Parquet or save_to_disk files, in data.format), and "
            "the pipeline packs them in a Prepare step before the probe, keyed by a hash of the inputs' ETags and "
            "sizes, the tokenizer, its chat template, the settings and the preparing code (an unchanged rerun "
            "reuses them once their S3 SHA-256 checksums match; damaged ones are prepared again); "
            "pretraining with data.sources: the Prepare job that tokenizes them (default: its defaults); "
            "default: uri holds packed shards"
        ),
    )
    sources: list[SourceSection] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description=(
            "pretraining from raw corpora: each source's S3 prefix, format, text field and weight (or tokens); a "
            "Prepare step tokenizes them on data.prepare.instance_count hosts, keyed by content, and the trainer "
            "samples them by weight; uri then defaults to the first source's"
        ),
    )
    tokenizer: str | None = Field(
        default=None,
        pattern=S3_URI_PATTERN,
        max_length=S3_URI_MAX,
        description="data.sources: S3 prefix of the tokenizer's files (tokenizer.json); default: model.init_checkpoint",
    )

    @model_validator(mode="before")
    @classmethod
    def _uri_from_sources(cls, data: Any) -> Any:
        """With sources, ``uri`` (the DataUri parameter's default) is the first source's prefix unless given, and
        ``prepare`` (the Prepare step that tokenizes them) takes its defaults unless given."""
        if isinstance(data, dict) and isinstance(data.get("sources"), list) and data["sources"]:
            first = data["sources"][0]
            if "uri" not in data and isinstance(first, dict) and isinstance(first.get("uri"), str):
                data = {**data, "uri": first["uri"]}
            if data.get("prepare") is None:
                data = {**data, "prepare": {}}
        return data

    @property
    def data_prefixes(self) -> list[str]:
        """The S3 prefixes a run may read its data from: the sources', ``allowed_uris``, or the recipe's ``uri``."""
        if self.sources:
            return list(dict.fromkeys(source.uri for source in self.sources))
        return list(self.allowed_uris) if self.allowed_uris else [self.uri]

    @model_validator(mode="after")
    def _sources(self) -> "DataSection":
        if not self.sources:
            if self.tokenizer is not None:
                raise ValueError(f"{AT}data.tokenizer: applies to data.sources only; remove it, or list the sources")
            return self
        names = [source.name for source in self.sources]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"{AT}data.sources: source names repeat ({', '.join(repeated)}); give each its own name")
        if len({source.weight is None for source in self.sources}) > 1:
            raise ValueError(
                f"{AT}data.sources: some sources give a weight and others tokens; give every source a weight, or "
                "every source tokens"
            )
        for path, value in (
            ("data.validation_uri", self.validation_uri),
            ("data.allowed_uris", self.allowed_uris),
            ("data.format", self.format),
        ):
            if value is not None:
                raise ValueError(
                    f"{AT}{path}: not with data.sources (the Prepare step holds out each source's validation share "
                    "and reads each source in its own format); remove it"
                )
        if self.uri not in self.data_prefixes:
            raise ValueError(f"{AT}data.uri: with data.sources, leave it out or give one of the sources' uri")
        return self

    def allows(self, uri: str) -> bool:
        """Whether ``uri`` lies under one of :attr:`data_prefixes` (whole path segments only)."""
        return any(_under(uri, prefix) for prefix in self.data_prefixes)

    @model_validator(mode="after")
    def _bad_examples(self) -> "DataSection":
        if self.max_bad_fraction is not None and self.on_bad_example != "skip":
            raise ValueError(
                f"{AT}data.max_bad_fraction: applies with data.on_bad_example: skip only; "
                "set it, or remove the fraction"
            )
        return self

    @model_validator(mode="after")
    def _ignore(self) -> "DataSection":
        if self.ignore and self.prepare is None:
            raise ValueError(
                f"{AT}data.ignore: applies with data.prepare only (the Prepare step reads the raw prefix); "
                "set data.prepare, or remove it"
            )
        return self

    @model_validator(mode="after")
    def _uri_allowed(self) -> "DataSection":
        if self.allowed_uris and not self.allows(self.uri):
            raise ValueError(f"{AT}data.uri: not under any of data.allowed_uris ({', '.join(self.allowed_uris)})")
        return self


def _under(uri: str, prefix: str) -> bool:
    if uri == prefix:
        return True
    base = prefix if prefix.endswith("/") else prefix + "/"
    return uri.startswith(base)


class BudgetSection(_Strict):
    total_tokens: int = Field(ge=1_000_000, le=MAX_TOKENS, description="tokens to train on")
    global_batch_tokens: int = Field(ge=1024, le=MAX_BATCH_TOKENS, description="tokens per optimiser step")


class OptimizerSection(_Strict):
    lr: float = Field(default=3e-4, gt=0, le=1.0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS, description="default: 1% of the budget")
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = Field(default=0.1, ge=0, le=1)
    grad_clip: float = Field(default=1.0, gt=0)
    beta1: float = Field(default=0.9, gt=0, lt=1)
    beta2: float = Field(default=0.95, gt=0, lt=1)
    max_nonfinite_skips: int = Field(
        default=3,
        ge=0,
        le=1000,
        description=(
            "a step whose loss or gradient norm is NaN or infinite is skipped (no update, no checkpoint); "
            "after this many skipped steps in a row the job stops with a failure reason. 0: stop at the first"
        ),
    )


class ComputeSection(_Strict):
    instance_type: str = Field(
        max_length=64,
        description="a GPU training instance from the catalogue (tiered-training instances)",
        json_schema_extra=_instance_types,
    )
    instance_count: int = Field(default=1, ge=1, le=512)
    spot: bool = False
    max_runtime_hours: float | None = Field(
        default=None,
        ge=1 / 60,
        le=28 * 24,
        description=(
            "the longest one training job (a segment of the run) may run, at most the account's "
            "training-job-max-runtime quota; default: that quota. A longer run is split into segments"
        ),
    )
    max_wait_hours: float | None = Field(
        default=None,
        gt=0,
        le=28 * 24,
        description=(
            "spot only: each segment's MaxWait (capacity waits and interruptions included), at least "
            "its runtime; default: runtime + 24 h"
        ),
    )
    training_plan_arn: str | None = Field(default=None, pattern=TRAINING_PLAN_ARN_PATTERN)
    price_per_hour: float | None = Field(
        default=None, gt=0, le=100_000, description="overrides the catalogue price per node"
    )
    compile: bool = True
    region: str | None = Field(default=None, pattern=REGION_PATTERN)
    quotas: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default={},
        description=(
            "the account's applied service quotas, by name in tiered_training/catalog/quotas.yaml; "
            "default: AWS's defaults"
        ),
    )

    @field_validator("region")
    @classmethod
    def _known_region(cls, value: str | None) -> str | None:
        """A region where SageMaker runs, from botocore's endpoint data (only the pattern without botocore)."""
        from tiered_training.recipe.regions import region_problem

        problem = value and region_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("quotas")
    @classmethod
    def _known_quotas(cls, values: dict[str, float]) -> dict[str, float]:
        from tiered_training.catalog import quotas

        known = quotas()
        for name, value in values.items():
            if name not in known:
                from tiered_training.recipe.keys import non_ascii, suggest

                inside = f" (contains non-ASCII {', '.join(non_ascii(name))})" if non_ascii(name) else ""
                hint = suggest(name, known, "quotas", "tiered_training/catalog/quotas.yaml")
                raise ValueError(f"unknown quota {name!r}{inside}; {hint}")
            hard_max = known[name].hard_max
            if hard_max is not None and value > hard_max:
                raise ValueError(
                    f"quota {name!r}: {value:,.0f} is above AWS's hard limit of {hard_max:,.0f} {known[name].unit}"
                )
        return values

    def quota(self, name: str) -> float:
        """The account's value of a quota: the recipe's applied value, else AWS's default."""
        from tiered_training.catalog import quotas

        return self.quotas.get(name, quotas()[name].default)


class CheckpointSection(_Strict):
    interval_minutes: float = Field(default=30.0, gt=0, le=24 * 60)
    keep_last: int = Field(default=3, ge=1, le=100)
    shutdown_deadline_seconds: int = Field(default=110, ge=10, le=600)


class MonitoringSection(_Strict):
    alarm_email: str | None = Field(default=None, max_length=254, pattern=EMAIL_PATTERN)
    alarm_topic_arn: str | None = Field(default=None, pattern=SNS_ARN_PATTERN)
    min_throughput_fraction: float = Field(default=0.7, gt=0, le=1, description="of the plan's tokens/s")
    min_gpu_utilization: float = Field(default=70.0, gt=0, le=100, description="percent")
    max_memory_fraction: float = Field(default=0.97, gt=0, le=1, description="of HBM")
    stall_minutes: int = Field(
        default=10,
        ge=5,
        le=1440,
        description="no step for this long is a stall; the alarm widens it to the plan's longest healthy pause",
    )
    loss_ceiling: Annotated[float, Field(gt=0)] | Auto = Field(
        default=AUTO, description="loss above this is divergence; auto: ln(vocabulary size) + loss_margin"
    )
    loss_margin: float = Field(
        default=1.0, gt=0, le=20, description="nats above ln(V), the loss of a uniform guess, for an automatic ceiling"
    )
    max_validation_gap: float = Field(
        default=0.5, gt=0, description="validation loss this far (nats) above the training loss is divergence"
    )


class ValidationSection(_Strict):
    interval_minutes: float = Field(default=30.0, ge=1, le=24 * 60, description="evaluate every N minutes")
    batches: int = Field(default=8, ge=1, le=10_000, description="micro-batches per GPU in one evaluation")


class TrackingSection(_Strict):
    mlflow_tracking_server_arn: str | None = Field(
        default=None,
        pattern=MLFLOW_SERVER_ARN_PATTERN,
        description="a SageMaker managed MLflow tracking server; the trainer logs params and metrics to it",
    )
    mlflow_experiment: str | None = Field(
        default=None, min_length=1, max_length=256, description="default: the recipe name"
    )
    tensorboard: bool = Field(
        default=True, description="write TensorBoard event files, uploaded beside the model output"
    )


class ProbeSection(_Strict):
    enabled: bool = True
    steps: int = Field(default=20, ge=3, le=1000)
    min_throughput_fraction: float = Field(default=0.8, gt=0, le=2.0, description="gate: probe vs plan tokens/s")


class BatchRampSpec(_Strict):
    start_fraction: float = Field(default=0.25, gt=0, le=1, description="first global batch, as a fraction")
    ramp_fraction: float = Field(default=0.02, gt=0, le=0.5, description="share of the token budget the ramp spans")


# peft's module names of the Llama and Qwen2 projections. LoRA on every linear layer of the
# blocks: QLoRA (Dettmers et al. 2023, https://arxiv.org/abs/2305.14314, section 4) found that
# adapters on all linear layers are needed to match full fine-tuning.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSection(_Strict):
    """LoRA (Hu et al. 2021, https://arxiv.org/abs/2106.09685) through peft's ``LoraConfig``
    (https://huggingface.co/docs/peft/package_reference/lora). Defaults: rank 16, alpha 32
    (alpha = 2 x rank) and dropout 0.05, as in QLoRA's and torchtune's Llama recipes
    (https://github.com/pytorch/torchtune/tree/main/recipes/configs/llama3_1), on all seven projections."""

    rank: int = Field(default=16, ge=1, le=1024, description="the adapters' rank r")
    alpha: float = Field(default=32.0, gt=0, le=4096, description="the update is scaled by alpha / rank")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="dropout on the adapters' input")
    target_modules: list[Literal[LORA_TARGETS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(LORA_TARGETS),
        min_length=1,
        max_length=len(LORA_TARGETS),
        description="the projections that get adapters (peft's module names)",
    )

    @field_validator("target_modules")
    @classmethod
    def _distinct(cls, modules: list[str]) -> list[str]:
        repeated = sorted({m for m in modules if modules.count(m) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed more than once")
        return modules


class ExportSection(_Strict):
    """The model written at the end of the run."""

    format: Literal["merged", "adapter"] = Field(
        default="merged",
        description=(
            "merged: full bf16 weights in Hugging Face format (LoRA merged in); adapter: the LoRA adapter alone "
            "in peft's format (PeftModel.from_pretrained), only with tuning.adapter lora"
        ),
    )


class PreferenceSection(_Strict):
    """Task dpo: the loss over pairs of answers and its reference, as trl's ``DPOConfig`` names them
    (https://huggingface.co/docs/trl/dpo_trainer)."""

    loss: Literal["sigmoid", "ipo", "robust"] = Field(
        default="sigmoid",
        description=(
            "sigmoid: DPO (Rafailov et al. 2023); ipo: IPO (Azar et al. 2023), the margin averaged per completion "
            "token; robust: DPO with label_smoothing, the share of flipped labels (Chowdhury et al. 2024)"
        ),
    )
    beta: float = Field(
        default=0.1, gt=0, le=100, description="how far the policy may move from the reference (IPO's tau)"
    )
    label_smoothing: float = Field(
        default=0.0, ge=0, lt=0.5, description="loss robust: the probability that a preference label is flipped"
    )
    reference: Literal["auto", "precomputed", "adapter_disabled"] = Field(
        default=AUTO,
        description=(
            "the reference model's log-probabilities: precomputed (a first pass of the starting weights over the "
            "data, no second model in memory), adapter_disabled (LoRA: the frozen base with the adapters off, one "
            "more forward per step, as trl with peft); auto: adapter_disabled with LoRA, else precomputed"
        ),
    )

    @model_validator(mode="after")
    def _smoothing(self) -> "PreferenceSection":
        if self.label_smoothing and self.loss != "robust":
            raise ValueError(
                f"{AT}preference.label_smoothing: applies to loss robust (trl's robust DPO); loss is {self.loss}"
            )
        return self
class RegistrySection(_Strict):
    """The model package each finished run registers in the recipe's model package group (SageMaker Model
    Registry), with its metrics, evaluation and lineage."""

    enabled: bool = Field(default=True, description="end the pipeline with the Register step")
    approval: Literal["PendingManualApproval", "Approved"] = Field(
        default="PendingManualApproval",
        description=(
            "the package's ModelApprovalStatus; an operator approves it: tiered-training registry RECIPE --approve N"
        ),
    )
    serving_image: str | None = Field(
        default=None,
        pattern=ECR_IMAGE_PATTERN,
        description=(
            "the inference image the package names; default: the LMI (DJL) container of the stack's region "
            "(tiered_training/catalog/serving_images.yaml), which serves the exported Hugging Face folder with vLLM"
        ),
    )


MAX_PROMPTS_JSON = 2400  # evaluation.prompts as JSON, within one hyperparameter (2500) with room to spare


class EvaluationSection(_Strict):
    """The evaluation of the export after the last step: held-out loss and perplexity, and its answers to the
    prompts listed here, written as evaluation.json next to the export and attached to the model package."""

    enabled: bool = Field(default=True, description="evaluate the export after the run's last step")
    batches: int = Field(
        default=8,
        ge=1,
        le=1000,
        description="held-out micro-batches the export is scored on (at most validation.batches: the same ones)",
    )
    prompts: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default=[], max_length=8, description="prompts the export answers (greedy decoding)"
    )
    max_new_tokens: int = Field(default=64, ge=1, le=1024, description="tokens generated per prompt at most")

    @field_validator("prompts")
    @classmethod
    def _prompts_fit_a_hyperparameter(cls, prompts: list[str]) -> list[str]:
        size = len(json.dumps(prompts))
        if size > MAX_PROMPTS_JSON:
            raise ValueError(
                f"the prompts take {size} characters as JSON (non-ASCII characters count 6); they travel in one "
                f"SageMaker hyperparameter of at most 2500: shorten them to {MAX_PROMPTS_JSON} in all"
            )
        return prompts


class TuningSection(_Strict):
    precision: Precision | Auto = AUTO
    fp8_recipe: Fp8Recipe | Auto = AUTO
    activation_checkpointing: Checkpointing | Auto = AUTO
    sharding: Sharding | Auto = AUTO
    shard_group_size: Annotated[int, Field(ge=1, le=4096)] | Auto = AUTO
    micro_batch_size: Annotated[int, Field(ge=1, le=4096)] | Auto = AUTO
    context_parallel: Annotated[int, Field(ge=1, le=64)] | Auto = Field(
        default=AUTO, description="GPUs that split each sequence (ring attention); auto: the search chooses"
    )
    batch_ramp: bool | BatchRampSpec | Auto = AUTO
    follow_tiers: Literal["auto", "strict"] = Field(
        default=AUTO,
        description=(
            "auto: the fastest configuration that fits, starting from the tier's advice; strict: the tier's choices"
        ),
    )
    adapter: Literal["none", "lora", "qlora"] | Auto = Field(
        default=AUTO,
        description=(
            "task sft: none trains every parameter; lora trains low-rank adapters on a frozen base (peft); "
            "qlora as lora with the base's projections in NF4 (torchao; bf16 compute, not compiled); "
            "auto: the tier's choice (LoRA for 30B-64B models, where it fits on one node)"
        ),
    )
    lora: LoraSection | None = Field(
        default=None,
        description="the LoRA adapters' settings; default: rank 16, alpha 32, dropout 0.05 on all seven projections",
    )
    probe_candidates: Annotated[int, Field(ge=1, le=MAX_PROBE_CANDIDATES)] | Auto = Field(
        default=AUTO,
        description=(
            "configurations the probe measures (the plan's, then for each decision the model doubts the fastest other "
            "that fits and can win by its held-out error), the full run taking the fastest measured; auto: one per "
            "decision in doubt, at least 3 where as many can win, or 1 when the recipe pins every tuning field"
        ),
    )


class Recipe(_Strict):
    """A training recipe. See ``recipes/`` for templates."""

    name: str = Field(
        pattern=PIPELINE_NAME_PATTERN,
        description="SageMaker pipeline name; names.py derives the others",
        json_schema_extra=_name_length,
    )
    description: str | None = Field(default=None, max_length=3072)
    task: Literal["pretrain", "sft", "dpo"] = Field(
        default="pretrain",
        description=(
            "pretrain: next-token loss on flat token shards; sft: supervised fine-tuning of model.init_checkpoint "
            "on packed example shards (python -m training.sft_data); dpo: preference tuning of "
            "model.init_checkpoint (a Hugging Face checkpoint or an earlier run's export) on pairs of answers "
            "(python -m training.dpo_data)"
        ),
    )
    model: ModelSection
    data: DataSection
    sequence_length: int = Field(ge=128, le=131072)
    budget: BudgetSection
    optimizer: OptimizerSection = OptimizerSection()
    compute: ComputeSection
    checkpointing: CheckpointSection = CheckpointSection()
    monitoring: MonitoringSection = MonitoringSection()
    validation: ValidationSection = ValidationSection()
    tracking: TrackingSection = TrackingSection()
    probe: ProbeSection = ProbeSection()
    tuning: TuningSection = TuningSection()
    export: ExportSection = ExportSection()
    preference: PreferenceSection | None = Field(
        default=None, description="task dpo: the preference loss and its reference; default: sigmoid, beta 0.1"
    )
    evaluation: EvaluationSection = EvaluationSection()
    registry: RegistrySection = RegistrySection()
    tags: dict[str, str] = Field(default={})

    @property
    def fine_tuning(self) -> bool:
        """Task sft or dpo: trained weights, packed examples, full or LoRA."""
        return self.task in ("sft", "dpo")

    @field_validator("name")
    @classmethod
    def _name_length(cls, name: str) -> str:
        problem = name_problem(name)
        if problem:
            raise ValueError(problem)
        return name

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        if len(tags) > MAX_TAGS:
            raise ValueError(f"{len(tags)} tags; AWS allows at most {MAX_TAGS} besides the recipe tag")
        for key, value in tags.items():
            if not re.fullmatch(r"[\w.:/=+\-@ ]{1,128}", key) or key.startswith("aws:"):
                raise ValueError(
                    f"tag key {key[:40]!r} is not a valid AWS tag key (1-128 letters, digits, spaces or _.:/=+-@)"
                )
            if len(value) > 256:
                raise ValueError(f"the value of tag {key!r} has {len(value)} characters; AWS allows 256")
        return tags

    @model_validator(mode="after")
    def _budget(self) -> "Recipe":
        if self.budget.global_batch_tokens % self.sequence_length:
            raise ValueError(
                f"{AT}budget.global_batch_tokens: {self.budget.global_batch_tokens} is not a multiple of "
                f"sequence_length {self.sequence_length}"
            )
        if self.budget.total_tokens < self.budget.global_batch_tokens:
            raise ValueError(f"{AT}budget.total_tokens: smaller than one global batch")
        return self

    def _check_sources(self) -> None:
        """Raw corpora: pretraining only, a tokenizer to tokenize with, token shares that add up to the budget."""
        data = self.data
        assert data.sources
        if self.task != "pretrain":
            raise ValueError(
                f"{AT}data.sources: raw corpora are for task pretrain; task sft reads its examples under data.uri "
                "with data.prepare"
            )
        if data.tokenizer is None and self.model.init_checkpoint is None:
            raise ValueError(
                f"{AT}data.tokenizer: data.sources needs a tokenizer: give the S3 prefix of its tokenizer.json, or "
                "model.init_checkpoint"
            )
        if data.sources[0].tokens is not None:
            total = sum(source.tokens or 0 for source in data.sources)
            if total != self.budget.total_tokens:
                raise ValueError(
                    f"{AT}data.sources: the sources' tokens add up to {total:,}, not budget.total_tokens "
                    f"{self.budget.total_tokens:,}; make them add up, or give weights"
                )

    @model_validator(mode="after")
    def _task(self) -> "Recipe":
        """SFT needs a starting checkpoint; the fine-tuning fields mean nothing to pretraining."""
        tuning, data = self.tuning, self.data
        if data.sources:
            self._check_sources()
        if self.preference is not None and self.task != "dpo":
            raise ValueError(f"{AT}preference: applies to task dpo only; remove it, or set task: dpo")
        if data.format not in (None, AUTO) and (data.format == "preference") != (self.task == "dpo"):
            raise ValueError(
                f"{AT}data.format: preference is the format of task dpo, and task dpo reads only preference pairs"
            )
        if self.fine_tuning:
            if data.prepare is not None and data.prepare.instance_count not in (AUTO, 1):
                raise ValueError(
                    f"{AT}data.prepare.instance_count: task {self.task} packs its examples on one host; remove it, "
                    "or set 1"
                )
            if self.model.init_checkpoint is None:
                raise ValueError(
                    f"{AT}model.init_checkpoint: task {self.task} fine-tunes trained weights: give the S3 URI of a "
                    "Hugging Face checkpoint (or of an earlier run's export)"
                )
            if self.task == "dpo" and data.overlong == "truncate":
                raise ValueError(
                    f"{AT}data.overlong: truncate would compare cut answers; task dpo drops (drop) or refuses (error) "
                    "a pair longer than sequence_length"
                )
            if self.task == "dpo" and data.loss_on == "all":
                raise ValueError(f"{AT}data.loss_on: task dpo counts the answers' tokens only; remove it")
            reference = self.preference.reference if self.preference else AUTO
            if reference == "adapter_disabled" and tuning.adapter == "none":
                raise ValueError(
                    f"{AT}preference.reference: adapter_disabled needs LoRA (tuning.adapter lora or qlora); a full "
                    "fine-tune uses precomputed"
                )
        else:
            sft_only: list[tuple[str, object]] = [
                ("data.loss_on", data.loss_on),
                ("data.overlong", data.overlong),
                ("data.format", data.format),
            ]
            if not data.sources:  # raw corpora have bad records and a Prepare job too
                sft_only += [
                    ("data.on_bad_example", data.on_bad_example),
                    ("data.max_bad_fraction", data.max_bad_fraction),
                    ("data.prepare", data.prepare),
                    ("data.ignore", data.ignore or None),
                ]
            for path, value in sft_only:
                if value is not None:
                    raise ValueError(
                        f"{AT}{path}: applies to task sft (packed example shards) or data.sources only; remove it, "
                        "or set task: sft"
                    )
            if tuning.adapter != AUTO:
                raise ValueError(f"{AT}tuning.adapter: applies to task sft or dpo only; remove it, or set task: sft")
            if tuning.lora is not None:
                raise ValueError(f"{AT}tuning.lora: applies to task sft or dpo only; remove it, or set task: sft")
        if tuning.adapter == "none" and tuning.lora is not None:
            raise ValueError(
                f"{AT}tuning.lora: set, but tuning.adapter is none; remove it, or set tuning.adapter: lora"
            )
        if self.export.format == "adapter" and (not self.fine_tuning or tuning.adapter == "none"):
            raise ValueError(
                f"{AT}export.format: adapter exports a LoRA adapter; it needs task: sft (or dpo) and tuning.adapter: "
                "lora, qlora (or auto)"
            )
        if tuning.adapter == "qlora" and tuning.precision not in (AUTO, "bf16"):
            raise ValueError(
                f"{AT}tuning.precision: {tuning.precision}, but tuning.adapter qlora computes in bf16 from its NF4 "
                "base; set tuning.precision: bf16 (or auto)"
            )
        return self
