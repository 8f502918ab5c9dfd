"""The modules that moved in 0.2, importable at their old paths until 0.3 with a DeprecationWarning.

``import tiered_training.runconfig`` returns the module ``tiered_training.contract.runconfig``
itself (one module object, so classes compare equal), after a warning that names the new path.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

REMOVED_IN = "0.3"
MOVED = {
    "tiered_training.alarms": "tiered_training.planning.alarms",
    "tiered_training.architecture": "tiered_training.contract.architecture",
    "tiered_training.calibration": "tiered_training.planning.calibration",
    "tiered_training.catalogs": "tiered_training.catalog",
    "tiered_training.definition": "tiered_training.pipeline.definition",
    "tiered_training.environment": "tiered_training.catalog.environment",
    "tiered_training.hf_config": "tiered_training.contract.hf_config",
    "tiered_training.images": "tiered_training.catalog.images",
    "tiered_training.loader": "tiered_training.recipe.loader",
    "tiered_training.memory": "tiered_training.planning.memory",
    "tiered_training.metrics": "tiered_training.contract.metrics",
    "tiered_training.perf": "tiered_training.planning.perf",
    "tiered_training.plan": "tiered_training.planning.plan",
    "tiered_training.planner": "tiered_training.planning.planner",
    "tiered_training.preflight": "tiered_training.aws.preflight",
    "tiered_training.quotas": "tiered_training.planning.quotas",
    "tiered_training.runconfig": "tiered_training.contract.runconfig",
    "tiered_training.run_list": "tiered_training.aws.run_list",
    "tiered_training.runs": "tiered_training.aws.runs",
    "tiered_training.schema": "tiered_training.recipe.schema",
    "tiered_training.segments": "tiered_training.planning.segments",
    "tiered_training.start": "tiered_training.aws.start",
    "tiered_training.world": "tiered_training.contract.world",
}


class _Finder:
    """A meta path finder and loader (the protocols, not importlib.abc's classes: importing importlib.abc
    loads importlib.resources and tempfile, a cost every command would pay at start)."""

    def find_spec(self, fullname: str, path, target=None):
        if fullname in MOVED:
            return importlib.machinery.ModuleSpec(fullname, cast("Loader", self))
        return None

    def create_module(self, spec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes in {REMOVED_IN}", DeprecationWarning, stacklevel=2
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module was imported at its new path already."""

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m <old path>`` runs the new module's code (runpy asks for it), after a note on stderr:
        Python hides a DeprecationWarning outside ``__main__``, and a person typed this command."""
        new = MOVED[fullname]
        print(f"note: {fullname} moved to {new}; the old path goes in {REMOVED_IN}", file=sys.stderr)
        import importlib.abc
        import importlib.util

        spec = importlib.util.find_spec(new)
        loader = spec.loader if spec else None
        return loader.get_code(new) if isinstance(loader, importlib.abc.InspectLoader) else None


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
