"""The recipe's registered models (``tiered-training models``): the packages of its model package group, each with
the run, plan and final metrics its Register step recorded, and their approval.

The group is named as the pipeline; each run chain's Register step adds a version to it
(``tiered_training.pipeline.definition.register_arguments``). Calls: ``ListModelPackages`` (the group's versions),
``DescribeModelPackage`` (each one listed: its metadata and evaluation), ``UpdateModelPackage`` (approve or reject).
"""

from __future__ import annotations

from typing import Any

from tiered_training.aws.session import StartError, aws_errors

APPROVAL_STATUSES = ("Approved", "Rejected", "PendingManualApproval")
MAX_LISTED = 20  # the newest versions shown


def _package(described: dict[str, Any]) -> dict[str, Any]:
    metadata = dict(described.get("CustomerMetadataProperties") or {})
    statistics = ((described.get("ModelMetrics") or {}).get("ModelQuality") or {}).get("Statistics") or {}
    containers = (described.get("InferenceSpecification") or {}).get("Containers") or [{}]
    created: Any = described.get("CreationTime")
    return {
        "version": described.get("ModelPackageVersion"),
        "arn": described.get("ModelPackageArn"),
        "approval": described.get("ModelApprovalStatus"),
        "status": described.get("ModelPackageStatus"),
        "created": created.isoformat() if hasattr(created, "isoformat") else created,
        "run_id": metadata.get("run_id"),
        "plan_hash": metadata.get("plan_hash"),
        "export": containers[0].get("ModelDataUrl"),
        "image": containers[0].get("Image"),
        "evaluation": statistics.get("S3Uri"),
        "metrics": {k: v for k, v in metadata.items() if ":" in k or "/" in k},
        "approval_note": described.get("ApprovalDescription"),
    }


def list_packages(sm: Any, group: str, limit: int = MAX_LISTED) -> list[dict[str, Any]]:
    """The group's newest ``limit`` versions, newest first, each described."""
    with aws_errors(f"list the model packages of group {group}"):
        listed = sm.list_model_packages(
            ModelPackageGroupName=group, SortBy="CreationTime", SortOrder="Descending", MaxResults=limit
        )
    found = []
    for summary in listed.get("ModelPackageSummaryList", []):
        with aws_errors(f"describe model package {summary['ModelPackageArn']}"):
            found.append(_package(sm.describe_model_package(ModelPackageName=summary["ModelPackageArn"])))
    return sorted(found, key=lambda p: p["version"] or 0, reverse=True)


def set_approval(sm: Any, group: str, version: int, status: str, note: str | None = None) -> dict[str, Any]:
    """Approve (or reject, or set back to pending) version ``version`` of the group; the package as it is then."""
    if status not in APPROVAL_STATUSES:
        raise StartError(f"approval status {status!r}: one of {', '.join(APPROVAL_STATUSES)}")
    packages = list_packages(sm, group, limit=100)
    match = [p for p in packages if p["version"] == version]
    if not match:
        known = ", ".join(str(p["version"]) for p in packages) or "none"
        raise StartError(f"model package group {group} has no version {version} (versions: {known})")
    request: dict[str, Any] = {"ModelPackageArn": match[0]["arn"], "ModelApprovalStatus": status}
    if note:
        request["ApprovalDescription"] = note[:1024]
    with aws_errors(f"set version {version} of {group} to {status}"):
        sm.update_model_package(**request)
        described = sm.describe_model_package(ModelPackageName=match[0]["arn"])
    return _package(described)
