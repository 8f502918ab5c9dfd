"""The evaluation report of an export (``evaluation.json``, written by ``training/evaluation.py``): its checksum,
shared by the container that writes it and whoever reads it (the rehearsal's summary, ``models list``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tiered_training.contract.container import EVALUATION_FILE

__all__ = ["EVALUATION_FILE", "checksum", "verified"]


def checksum(report: dict[str, Any]) -> str:
    """sha256 of the report's canonical JSON (sorted keys, no spaces), its own ``sha256`` left out."""
    body = {k: v for k, v in report.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def verified(text: str | bytes, where: str) -> dict[str, Any]:
    """The report in ``text``, its checksum checked; ValueError naming ``where`` otherwise."""
    try:
        report = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{where}: not JSON ({error}): the file was cut short or is not an evaluation") from None
    if not isinstance(report, dict) or report.get("sha256") != checksum(report):
        raise ValueError(f"{where}: the checksum does not match the content (the file was changed or cut short)")
    return report
