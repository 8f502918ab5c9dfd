"""The ``--format json`` output of every command, as pydantic models: one shape per command.

Every output has ``schema_version``, ``ok``, ``exit_code`` and ``errors``, and its command's own
keys, on success and on failure alike (a failure leaves them empty or null). ``ok`` is
``exit_code == 0``; ``errors`` lists what made the command fail (for a recipe, also under its
entry). A command emits through :func:`emit` (or :func:`failure_data` for a :class:`Failure`), which
fills the keys a result lacks and refuses one its model does not declare.

``schema`` prints a document (the recipe's JSON Schema, docs/recipe.schema.json), not a report; its
failures print :class:`Output`. ``run-config`` carries its RunConfig under ``run_config``.

``python -m tiered_training.cli.output --write`` writes docs/schemas/<command>.schema.json;
``--check`` exits 1 when they are stale (a test keeps them current).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tiered_training.contract.runconfig import RunConfig

SCHEMA_VERSION: Literal[3] = (
    3  # as report.SCHEMA_VERSION; 3: ok, exit_code and errors in every command's output; diff's comparisons under diffs
)
SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "docs" / "schemas"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class Error(_Strict):
    """One error, as stderr prints it on one line."""

    message: str
    file: str | None = None
    line: int | None = None
    field: str | None = None
    code: str | None = Field(None, description="a finding's code, for example fp8-unsupported")
    fix: str | None = None
    value: str | None = Field(None, description="the value at fault, quoted as in the message")
    severity: str | None = None


class Finding(_Strict):
    severity: Literal["error", "warning", "account", "info"]
    code: str = Field(description="stable identifier, for example quota-needed or invalid-recipe")
    file: str | None = None
    line: int | None = None
    field: str | None = None
    message: str
    fix: str = ""
    value: str | None = None


class Invalid(_Strict):
    """A recipe that did not load, with its errors."""

    source: str | None
    name: str | None = None
    ok: Literal[False] = False
    errors: list[Finding]
    warnings: list[Finding] = []


class PlanFinding(_Strict):
    severity: Literal["error", "warning", "account", "info"]
    code: str
    message: str
    fix: str = ""
    field: str = ""
    file: str | None = Field(None, description="the recipe, or '--set key=value' where an override set the field")
    line: int | None = Field(None, description="the field's line in the file; null for an override")


class Decision(_Strict):
    field: str
    value: Any
    reason: str
    source: str = Field(description="recipe, auto or derived")


class Candidate(_Strict):
    """A configuration the probe measures, with the planner's predictions."""

    number: int = Field(description="1 is the plan's own configuration")
    precision: str
    fp8_recipe: str | None
    activation_checkpointing: str
    sharding: str
    shard_group_size: int
    context_parallel: int
    micro_batch_size: int
    grad_accum_steps: int
    ramp_start_accum_steps: int | None
    tokens_per_second_per_gpu: float = Field(description="predicted")
    memory_fraction: float = Field(description="predicted peak, a fraction of the GPU's memory")
    why: str = Field("", description="why the probe measures it")
    tokens_per_second_per_gpu_range: tuple[float, float] | None = Field(
        None,
        description="where the measured tokens/s per GPU may lie: the model's leave-one-source-out errors for "
        "this kind of run (null: the calibration has none)",
    )


class Plan(_Strict):
    """A resolved recipe. A plan with errors has the same keys, null where the planner could not decide."""

    name: str
    source: str | None
    ok: bool
    task: str
    model: dict[str, Any]
    compute: dict[str, Any]
    tuning: dict[str, Any]
    memory_gib: dict[str, Any] | None = None
    memory_fraction: float | None = None
    memory_headroom: float | None = None
    estimates: dict[str, Any] | None = None
    run: dict[str, Any] | None = Field(None, description="segments, job runtime, spot wait and instance counts")
    full_parameter: dict[str, Any] | None = None
    corpus: dict[str, Any] | None = Field(
        None, description="data.sources: each source's share, tokens held and epochs; the Prepare job's size"
    )
    departures: list[dict[str, Any]] = []
    alternatives: list[dict[str, Any]] = []
    candidates: list[Candidate] = Field(
        [], description="the configurations the probe measures, the plan's own first, with their predictions"
    )
    decisions: list[Decision] = []
    findings: list[PlanFinding] = []


class ProbeCandidate(_Strict):
    number: int
    configuration: str
    predicted_tokens_per_second_per_gpu: float
    predicted_memory_fraction: float
    measured_tokens_per_second_per_gpu: float | None = Field(description="null: the candidate failed (not OOM)")
    measured_peak_allocated_fraction: float | None
    measured_peak_reserved_fraction: float | None
    ratio: float | None = Field(description="measured / predicted tokens/s per GPU")
    trained: bool = Field(description="the candidate Train runs")
    predicted_range: tuple[float, float] | None = Field(
        None, description="where the plan said its tokens/s per GPU may lie (the model's held-out errors)"
    )
    surprising: bool | None = Field(
        None, description="measured outside predicted_range: the model is wrong for this kind of run"
    )


class ProbeComparison(_Strict):
    """The Probe job's measurements against the plan's predictions."""

    training_job: str
    best_candidate: int | None = Field(description="the candidate Train runs; 0: none fits; null: none reported")
    candidates: list[ProbeCandidate]


class Output(_Strict):
    """What every command's JSON has; alone, the output of a command line that names no command."""

    schema_version: Literal[3] = SCHEMA_VERSION
    ok: bool = Field(description="exit_code == 0")
    exit_code: int = Field(description="0 ok; 1 AWS refused or a run failed; 2 invalid input")
    errors: list[Error] = []

    @model_validator(mode="after")
    def _ok_is_exit_zero(self) -> Output:
        if self.ok != (self.exit_code == 0):
            raise ValueError(f"ok is {self.ok} with exit code {self.exit_code}")
        return self


class PlanOutput(Output):
    plans: list[Plan] = []
    invalid: list[Invalid] = []


class ExplainOutput(PlanOutput):
    execution_arn: str | None = Field(None, description="--run: the execution whose probe is shown")
    probe: ProbeComparison | None = Field(None, description="--run: its probe, predicted against measured")


class RecipeCheck(_Strict):
    source: str | None
    name: str | None = None
    ok: bool
    errors: list[Finding] = []
    warnings: list[Finding] = []
    account: list[Finding] = Field([], description="quotas the account must raise (not errors of the recipe)")


class ValidateOutput(Output):
    strict: bool = False
    recipes: list[RecipeCheck] = []


class Change(_Strict):
    field: str
    old: Any
    new: Any
    reason: str


class Metric(_Strict):
    old: float | None
    new: float | None
    delta: float | None = Field(description="new - old, in the metric's unit (fractions for mfu)")
    ratio: float | None = Field(description="new / old")


class FindingChange(_Strict):
    severity: str
    code: str
    message: str


class Diff(_Strict):
    old: str
    new: str
    changed: list[Change]
    metrics: dict[str, Metric] = Field(description="memory_gib_per_gpu, tokens_per_second_per_gpu, mfu, ...")
    price_source: dict[str, str | None]
    findings_added: list[FindingChange]
    findings_removed: list[FindingChange]


class DiffOutput(Output):
    diffs: list[Diff] = Field([], description="one comparison per pair: two files, or the recipes of a name")
    added: list[str] = Field([], description="recipe names only in NEW (two directories)")
    removed: list[str] = Field([], description="recipe names only in OLD (two directories)")
    plans: list[Plan] = Field([], description="plans whose errors stop their comparison")
    invalid: list[Invalid] = []


class TiersOutput(Output):
    tiers: list[dict[str, Any]] = []


class ModelsOutput(Output):
    models: list[dict[str, Any]] | dict[str, Any] = Field(
        [], description="the catalogue; with --from-config, the entry the config gives, by id"
    )


class InstancesOutput(Output):
    region: str | None = None
    instances: list[dict[str, Any]] = []


class Template(_Strict):
    template: str
    about: str


class TemplatesOutput(Output):
    templates: list[Template] = []


class InitOutput(Output):
    path: str | None = None
    template: str | None = None
    name: str | None = None


class Parameter(_Strict):
    name: str
    value: str
    given: bool = Field(description="set on the command line; else the pipeline's default")


class StartOutput(Output):
    pipeline: str | None = None
    dry_run: bool = False
    execution_arn: str | None = None
    status: str | None = None
    failure_reason: str | None = None
    steps: list[dict[str, Any]] = []
    progress: dict[str, Any] | None = None
    region: str | None = Field(None, description="--dry-run: the region it would start in (null: the profile's)")
    parameters: list[Parameter] = Field([], description="--dry-run: every pipeline parameter")
    resume: str | None = None


class StatusOutput(Output):
    pipeline: str | None = None
    execution_arn: str | None = None
    status: str | None = None
    failure_reason: str | None = None
    steps: list[dict[str, Any]] = []
    progress: dict[str, Any] | None = None
    runs_uri: str | None = None
    runs: list[dict[str, Any]] | None = None
    runs_error: str | None = None
    probe: ProbeComparison | None = Field(None, description="null: no Probe job in the execution")
    probe_error: str | None = None


class LogsOutput(Output):
    execution_arn: str | None = None
    training_jobs: list[str] = []
    log_group: str | None = None
    events: list[dict[str, Any]] = []


class StopOutput(Output):
    execution_arn: str | None = None
    status: str | None = None


class RegistryOutput(Output):
    group: str | None = None
    packages: list[dict[str, Any]] = Field(default=[], description="the group's newest versions, newest first")
    changed: dict[str, Any] | None = Field(default=None, description="--approve/--reject: the package as it is now")


class PreflightOutput(Output):
    recipe: str | None = None
    region: str | None = None
    checks: list[dict[str, Any]] = []


class PricesOutput(Output):
    region: str | None = None
    cache: str | None = None
    source: str | None = None
    prices: list[dict[str, Any]] = []


class RehearseOutput(Output):
    executions: list[dict[str, Any]] = []
    interrupt: str | None = None
    interrupted: Any = None
    losses: dict[str, float] = {}
    validation_losses: dict[str, float] = {}
    checkpoint_uri: str | None = None
    checkpoints_at_end: Any = None
    writers_at_end: dict[str, str] = Field(
        {}, description="each checkpoint left at the end: the training job its COMMITTED manifest names"
    )
    keep_last: int | None = None
    uploads_by_host: Any = None
    exported: dict[str, Any] = {}
    packages: list[dict[str, Any]] = []
    workdir: str | None = None
    scaled: list[dict[str, Any]] = []


class RunConfigOutput(Output):
    recipe_name: str | None = None
    run_config: RunConfig | None = Field(None, description="what the container reads (python -m training --config)")
    hyperparameters: dict[str, str] | None = Field(None, description="--hyperparameters: SageMaker's flat keys")


class CalibrateOutput(Output):
    overlay: dict[str, Any] | None = Field(None, description="the fitted overlay; null on failure")
    uris: list[str] = Field([], description="where each recipe's overlay was stored")
    skipped: list[str] = Field([], description="runs and candidates left out, with why")
    points: dict[str, int] = Field({}, description="measurements used: probe and run")


OUTPUTS: dict[str, type[Output]] = {
    "plan": PlanOutput,
    "validate": ValidateOutput,
    "explain": ExplainOutput,
    "diff": DiffOutput,
    "tiers": TiersOutput,
    "models": ModelsOutput,
    "instances": InstancesOutput,
    "templates": TemplatesOutput,
    "init": InitOutput,
    "start": StartOutput,
    "rehearse": RehearseOutput,
    "status": StatusOutput,
    "logs": LogsOutput,
    "stop": StopOutput,
    "registry": RegistryOutput,
    "preflight": PreflightOutput,
    "prices": PricesOutput,
    "run-config": RunConfigOutput,
    "calibrate": CalibrateOutput,
    "error": Output,  # a command line that names no command, and schema's failures
}


def data(command: str, exit_code: int, **fields: Any) -> dict[str, Any]:
    """The command's output: ``fields`` checked against its model, the keys they lack filled in."""
    fields.pop("schema_version", None)
    fields.pop("ok", None)
    model = OUTPUTS.get(command, Output)
    return model.model_validate({**fields, "ok": exit_code == 0, "exit_code": exit_code}).model_dump(mode="json")


def emit(command: str, exit_code: int, **fields: Any) -> None:
    from tiered_training.report.render import print_json

    print_json(data(command, exit_code, **fields))


def failure_data(command: str | None, exit_code: int, errors: list[dict[str, Any]]) -> dict[str, Any]:
    """A command's output when it fails before its result: its keys empty, the errors listed."""
    return data(command or "error", exit_code, errors=errors)


def finding_errors(entries: list[dict[str, Any]], *, warnings: bool = False) -> list[dict[str, Any]]:
    """The errors (and, under ``warnings``, the warnings) of recipe entries, for ``errors``."""
    out = []
    for entry in entries:
        for finding in entry.get("errors", []) + (entry.get("warnings", []) if warnings else []):
            out.append({k: v for k, v in finding.items() if k in Error.model_fields})
    return out


def plan_errors(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The error findings of plans (``Plan.to_dict()``), for ``errors``."""
    return [
        {"file": f.get("file") or p["source"], **{k: f[k] for k in ("severity", "code", "field", "message", "fix")}}
        for p in plans
        for f in p["findings"]
        if f["severity"] == "error"
    ]


# -- the schemas -------------------------------------------------------------------------------


def schema(command: str) -> dict[str, Any]:
    out = OUTPUTS[command].model_json_schema(mode="serialization")
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["$id"] = f"{command}.schema.json"
    out["title"] = f"tiered-training {command} --format json" if command != "error" else "tiered-training error"
    return out


DOCUMENTS: tuple[str, ...] = ()  # a command whose success prints a document, not an Output


def schema_texts() -> dict[Path, str]:
    return {
        SCHEMAS_DIR / f"{c}.schema.json": json.dumps(schema(c), indent=2, sort_keys=True) + "\n"
        for c in (*OUTPUTS, *DOCUMENTS)
    }


def main(args: list[str]) -> int:
    """``--write``: write docs/schemas/; ``--check``: exit 1 when a file there is stale."""
    texts = schema_texts()
    if "--write" in args:
        SCHEMAS_DIR.mkdir(parents=True, exist_ok=True)
        for path, text in texts.items():
            path.write_text(text, encoding="utf-8")
        return 0
    stale = [p for p, t in texts.items() if not p.is_file() or p.read_text(encoding="utf-8") != t]
    for path in stale:
        print(f"{path} is stale: run python -m tiered_training.cli.output --write", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
