"""The end of a pipeline Prepare step's command (``training.sft_prepare``, ``training.corpus_prepare``): the work
in a scratch folder, bad data as one line and exit status 2, else the property file the pipeline reads."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def run_step(prefix: str, property_file: Path, step: Callable[[Path], dict], bad: type[Exception]) -> int:
    """``step(work)`` in a scratch folder (``prefix``...) removed afterwards; a ``bad`` error is printed and gives 2,
    else ``property_file`` gets the step's result as JSON and the status is 0."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        found = step(work)
    except bad as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    property_file.parent.mkdir(parents=True, exist_ok=True)
    property_file.write_text(json.dumps(found))
    return 0
