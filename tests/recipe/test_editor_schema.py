"""An editor's check (the npm ``yaml`` parser and Ajv, tests/recipe/editor_check.mjs) and the CLI agree.

Both read the templates as valid; both refuse each edit below, and both accept each grouped number.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from support import RECIPES, ROOT, run_cli

from tiered_training.recipe.schema import SCHEMA_FILE

CHECK = ROOT / "tests" / "recipe" / "editor_check.mjs"
BASE = ROOT / "recipes" / "llama3-1b-bf16.yaml"

# (case, text replaced in BASE, replacement, the field the editor flags)
REFUSED = [
    ("a float where an integer goes", "instance_count: 1\n", "instance_count: 1.0\n", "/compute/instance_count"),
    (
        "a float in a union with auto",
        "precision: bf16\n",
        "precision: bf16\n  micro_batch_size: 2.0\n",
        "/tuning/micro_batch_size",
    ),
    ("an unknown instance type", "ml.p6-b200.48xlarge", "ml.p9.48xlarge", "/compute/instance_type"),
    ("an unknown catalogue model", "catalog: llama-3.2-1b", "catalog: llama-3.2-2b", "/model/catalog"),
    ("a name over 84 characters", "name: llama3-1b-bf16", "name: " + "a" * 85, "/name"),
    ("digits grouped other than by thousands", "100_000_000_000", "1000_000_000_00", "/budget/total_tokens"),
    (
        "an underscore in a decimal",
        "interval_minutes: 30",
        "interval_minutes: 3_0.5",
        "/checkpointing/interval_minutes",
    ),
    ("a signed grouped number", "keep_last: 3", "keep_last: +1_000", "/checkpointing/keep_last"),
]
ACCEPTED = [
    ("a name of 84 characters", "name: llama3-1b-bf16", "name: " + "a" * 84),
    ("a grouped number in a number field", "max_runtime_hours: 96", "max_runtime_hours: 0_096"),
    ("a grouped integer", "keep_last: 3", "keep_last: 0_003"),
]


def _edited(old: str, new: str) -> str:
    text = BASE.read_text()
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.fixture(scope="module")
def editor() -> dict[str, list[dict]]:
    """The editor's errors for every template and every edited recipe, from one node process."""
    documents = [{"name": path.name, "text": path.read_text()} for path in RECIPES]
    documents += [{"name": case, "text": _edited(old, new)} for case, old, new, *_ in REFUSED + ACCEPTED]
    done = subprocess.run(
        ["node", str(CHECK), str(ROOT / SCHEMA_FILE)],
        input=json.dumps(documents),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, (
        f"{CHECK.name} failed (are yaml and ajv installed? run `npm ci`):\n{done.stderr[-3000:]}"
    )
    return {result["name"]: result["errors"] for result in json.loads(done.stdout)}


@pytest.mark.parametrize("template", RECIPES, ids=lambda p: p.name)
def test_every_template_is_valid_to_a_yaml_1_2_editor(editor, template):
    assert editor[template.name] == []


@pytest.mark.parametrize("case,old,new,path", REFUSED, ids=[c[0] for c in REFUSED])
def test_the_editor_and_the_cli_refuse_the_same_edit(editor, tmp_path, case, old, new, path):
    assert editor[case], f"the editor accepts {new.strip()!r}"
    assert {error["path"] for error in editor[case]} == {path}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(_edited(old, new))
    result = run_cli("validate", recipe)
    assert result.returncode == 2, result.stdout + result.stderr
    assert path[1:].replace("/", ".") in result.stderr


@pytest.mark.parametrize("case,old,new", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_the_editor_and_the_cli_accept_the_same_edit(editor, tmp_path, case, old, new):
    assert editor[case] == []
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(_edited(old, new))
    result = run_cli("validate", recipe)
    assert result.returncode == 0, result.stdout + result.stderr
