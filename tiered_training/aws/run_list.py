"""A recipe's runs and their last checkpoints, as ``tiered-training status`` lists them.

The deployed pipeline's definition (DescribePipeline) names the runs' prefix: the literal head of
a Train step's ``CheckpointConfig.S3Uri`` (``s3://<store>/<recipe>/checkpoints/runs/``). Each run
is a prefix under it; its last checkpoint is the committed one whose manifest (the ``COMMITTED``
marker, training/components/checkpoint.py) has the highest step, and the manifest's ``run`` entry says what
the run trains on (docs/runs.md). As in the trainer, a manifest of another step than its directory's (a copy
or a rename) or of another run does not count.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from tiered_training.aws.session import StartError, aws_errors
from tiered_training.pipeline.definition import S_TRAIN, find_step


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    checkpoints: int  # committed checkpoints in the prefix
    last_step: int | None
    tokens_seen: int | None
    data_uri: str | None
    committed_at: float | None  # the last checkpoint's commit time (seconds since the epoch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.last_step is None:
            return f"{self.run_id}: no committed checkpoint"
        tokens = f", {self.tokens_seen:,} tokens" if self.tokens_seen is not None else ""
        data = f", data {self.data_uri}" if self.data_uri else ""
        return f"{self.run_id}: last checkpoint step {self.last_step}{tokens}{data} ({self.checkpoints} kept)"


def _is_the_runs(manifest: dict[str, Any], run: str, key: str) -> bool:
    """Whether a manifest is a checkpoint of ``run`` that the trainer would resume: its step is its directory's
    (not a copy or a rename) and its ``run`` entry, if any, names ``run`` (not another run's checkpoint)."""
    directory = key.rsplit("/", 2)[-2]
    step = manifest.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or directory != f"step-{step}":
        return False
    entry = manifest.get("run")
    return not (isinstance(entry, dict) and entry.get("run_id") and entry["run_id"] != run)


def runs_uri(sm: Any, pipeline_name: str) -> str:
    """``s3://bucket/prefix/`` of the pipeline's runs, from its deployed definition."""
    with aws_errors(f"describe pipeline {pipeline_name}"):
        body = sm.describe_pipeline(PipelineName=pipeline_name)["PipelineDefinition"]
    try:
        uri = find_step(json.loads(body), S_TRAIN)["Arguments"]["CheckpointConfig"]["S3Uri"]
        head = uri["Std:Join"]["Values"][0]
    except (KeyError, TypeError, IndexError, ValueError):
        raise StartError(
            f"pipeline {pipeline_name} has no per-run checkpoint prefix (deployed before runs had ids?); redeploy it"
        ) from None
    if not isinstance(head, str) or not head.startswith("s3://"):
        raise StartError(f"pipeline {pipeline_name}: cannot read the runs' prefix from {head!r}")
    return head


def list_runs(s3: Any, uri: str) -> list[RunSummary]:
    """Every run under ``uri`` with its last checkpoint, the most recently committed first."""
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    runs: dict[str, list[str]] = {}
    with aws_errors(f"list {uri}"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                rest = item["Key"][len(prefix) :]
                run, _, tail = rest.partition("/")
                markers = runs.setdefault(run, [])
                if tail.startswith("step-") and tail.endswith("/COMMITTED"):
                    markers.append(item["Key"])
    found = []
    for run, markers in runs.items():
        manifests = []
        for key in markers:
            with aws_errors(f"read s3://{bucket}/{key}"):
                text = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            try:
                manifest = json.loads(text)
            except ValueError:
                continue
            if isinstance(manifest, dict) and _is_the_runs(manifest, run, key):
                manifests.append(manifest)
        last = max(manifests, key=lambda m: m["step"], default=None)
        entry = (last or {}).get("run") or {}
        found.append(
            RunSummary(
                run,
                len(manifests),
                last["step"] if last else None,
                entry.get("tokens_seen"),
                entry.get("data_uri"),
                (last or {}).get("committed_at"),
            )
        )
    return sorted(found, key=lambda r: r.committed_at or 0, reverse=True)
