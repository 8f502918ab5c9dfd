"""Helpers for reading synthesized templates (imported by the construct tests)."""

from __future__ import annotations

import json
import re


def resources(template: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in template.get("Resources", {}).items() if v["Type"] == kind}


def only(template: dict, kind: str) -> dict:
    found = resources(template, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return next(iter(found.values()))


def join_to_text(value) -> str:
    """A Fn::Join'd string with every intrinsic replaced by a marker: the body as SageMaker would see it."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(join_to_text(p) for p in parts)
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return f"TOKEN-{value['Fn::GetAtt'][0]}-{value['Fn::GetAtt'][1]}"
    if isinstance(value, dict) and "Ref" in value:
        return f"TOKEN-{value['Ref']}".replace("::", "-")
    if isinstance(value, dict) and "Fn::ImportValue" in value:
        return "TOKEN-" + re.sub(r"[^A-Za-z0-9-]", "-", json.dumps(value["Fn::ImportValue"]))
    if isinstance(value, dict) and "Fn::Sub" in value:
        return "TOKEN-sub"
    if isinstance(value, dict) and "Fn::FindInMap" in value:  # the serving image of the stack's region
        return "TOKEN-" + "-".join(str(p) for p in value["Fn::FindInMap"] if isinstance(p, str))
    raise AssertionError(f"unexpected intrinsic {value}")


def pipeline_definition(template: dict) -> dict:
    pipeline = only(template, "AWS::SageMaker::Pipeline")
    body = pipeline["Properties"]["PipelineDefinition"]["PipelineDefinitionBody"]
    return json.loads(join_to_text(body))
