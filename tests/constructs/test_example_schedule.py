"""The example platform repo's weekly schedule starts runs of its own: interpreted with the pipeline's own
definition, its executions train under their own prefixes and never under a production run's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tiered_training.contract import metrics
from tiered_training.pipeline import definition as d
from tiered_training.planning.planner import plan_file
from tiered_training.rehearse.interpreter import Interpreter, JobAttempt

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "platform-repo"


def _weekly_parameters() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("example_platform_app", EXAMPLE / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the stack; synthesises nothing
    return dict(module.WEEKLY_PARAMETERS)


def test_the_weekly_schedule_never_writes_a_production_runs_checkpoints():
    weekly = _weekly_parameters()
    assert "RunId" not in weekly
    plan = plan_file(next((EXAMPLE / "recipes").glob("*.yaml")))
    resources = d.PipelineResources(role_arn="arn:aws:iam::123456789012:role/x", image_uri="img",
                                    checkpoint_s3_uri="s3://team-checkpoints/llama3-1b/checkpoints/",
                                    output_s3_uri="s3://team-checkpoints/llama3-1b/output/")
    definition = d.build_definition(plan, resources)
    jobs: list[tuple[str, str, str, str]] = []  # execution id, step, checkpoint prefix, run.resume

    def runner(execution_id):
        def run(step, job_name, args, attempt, *, warm_from):
            if "CheckpointConfig" in args:
                jobs.append((execution_id, step, args["CheckpointConfig"]["S3Uri"], args["HyperParameters"]["run.resume"]))
            probe = [(0.0, "algo-1", fmt.format(1.0e9 if "tokens" in name else 0.5 if "memory" in name else 1))
                     for name, (fmt, _regex) in metrics.PROBE_METRICS.items()]
            final = [(1.0, "algo-1", f"FINAL {name}=2.0") for name in metrics.final_metric_names(plan.recipe.task)]
            return JobAttempt("Completed", log=probe + final)  # the probe's metrics; the run's final ones
        return run

    production = Interpreter(definition, runner("prod0000aaaa"), execution_id="prod0000aaaa").run({})
    resumed = Interpreter(definition, runner("prod0000bbbb"), execution_id="prod0000bbbb").run({"RunId": "prod0000aaaa"})
    weeks = [Interpreter(definition, runner(e), execution_id=e).run(weekly) for e in ("week00000001", "week00000002")]
    assert all(e.status == "Succeeded" for e in (production, resumed, *weeks))
    head = "s3://team-checkpoints/llama3-1b/checkpoints/runs/"
    prefixes = {execution: prefix for execution, _step, prefix, _resume in jobs}
    assert prefixes["prod0000aaaa"] == prefixes["prod0000bbbb"] == head + "prod0000aaaa/"  # a resume by name
    assert prefixes["week00000001"] == head + "week00000001/" and prefixes["week00000002"] == head + "week00000002/"
    assert {resume for execution, _s, _p, resume in jobs if execution.startswith("week")} == {"false"}
