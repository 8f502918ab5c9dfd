"""An editor and the CLI give the same verdict on every template and on each edit below.

The editor is the YAML language server (the npm package ``yaml-language-server``, installed by ``make test``'s
``npm ci``), driven over LSP as an editor drives it (tests/recipe/language_server.py): each document names the
recipe's JSON Schema in its first line, and the server's diagnostics are the editor's verdict. The CLI's is
``validate --format json``. One server and one ``validate`` serve the whole module.
"""

from __future__ import annotations

import json
import shutil

import pytest
from language_server import LanguageServer
from support import RECIPES, ROOT, run_cli

SERVER = ROOT / "node_modules" / ".bin" / "yaml-language-server"
BASE = ROOT / "recipes" / "llama3-1b-bf16.yaml"
LORA = ROOT / "recipes" / "qwen2.5-32b-lora.yaml"
REFUSED, ACCEPTED = False, True

# (case, recipe, text replaced, replacement, verdict)
EDITS = [
    # integers
    ("a fraction where an integer goes", BASE, "instance_count: 1\n", "instance_count: 1.5\n", REFUSED),
    ("an integer below its minimum", BASE, "instance_count: 1\n", "instance_count: 0\n", REFUSED),
    ("an integer above its maximum", BASE, "instance_count: 1\n", "instance_count: 513\n", REFUSED),
    ("an integer in quotes", BASE, "instance_count: 1\n", 'instance_count: "1"\n', REFUSED),
    ("a boolean where an integer goes", BASE, "instance_count: 1\n", "instance_count: true\n", REFUSED),
    ("NaN where an integer goes", BASE, "keep_last: 3", "keep_last: .nan", REFUSED),
    ("a fraction in a union with auto", BASE, "precision: bf16\n", "precision: bf16\n  micro_batch_size: 2.5\n", REFUSED),
    ("an integral float above its maximum", BASE, "total_tokens: 100_000_000_000", "total_tokens: 1.0e16", REFUSED),
    # grouped numbers
    ("a grouped number above its maximum", BASE, "instance_count: 1\n", "instance_count: 100_000\n", REFUSED),
    ("a grouped zero below its minimum", BASE, "total_tokens: 100_000_000_000", "total_tokens: 000_000", REFUSED),
    ("a grouped number below its minimum", BASE, "total_tokens: 100_000_000_000", "total_tokens: 999_999", REFUSED),
    ("a grouped number above the largest", BASE, "total_tokens: 100_000_000_000",
     "total_tokens: 1_000_000_000_000_001", REFUSED),
    ("a grouped number above a float's maximum", BASE, "lr: 3.0e-4", "lr: 1_000", REFUSED),
    ("digits grouped other than by thousands", BASE, "total_tokens: 100_000_000_000", "total_tokens: 1000_000_000_00",
     REFUSED),
    ("an underscore in a decimal", BASE, "interval_minutes: 30", "interval_minutes: 3_0.5", REFUSED),
    ("a signed grouped number", BASE, "keep_last: 3", "keep_last: +1_000", REFUSED),
    ("two digits grouped", BASE, "keep_last: 3", "keep_last: 1_0", REFUSED),
    ("a grouped number with a fraction", BASE, "global_batch_tokens: 4_194_304", "global_batch_tokens: 4_194_304.5",
     REFUSED),
    # floats
    ("NaN where a float goes", BASE, "interval_minutes: 30", "interval_minutes: .nan", REFUSED),
    ("NaN where a bounded float goes", BASE, "lr: 3.0e-4", "lr: .nan", REFUSED),
    ("infinity where a float goes", BASE, "lr: 3.0e-4", "lr: .inf", REFUSED),
    ("minus infinity where a float goes", BASE, "interval_minutes: 30", "interval_minutes: -.inf", REFUSED),
    ("infinity in a map of unbounded floats", BASE, "  max_runtime_hours: 96\n",
     "  max_runtime_hours: 96\n  quotas:\n    training/ml.p6-b200.48xlarge: .inf\n", REFUSED),
    ("a float at its exclusive minimum", BASE, "lr: 3.0e-4", "lr: 0", REFUSED),
    ("a float above its maximum", BASE, "max_runtime_hours: 96", "max_runtime_hours: 673", REFUSED),
    ("hours and minutes (YAML 1.1's base 60)", BASE, "max_runtime_hours: 96", "max_runtime_hours: 1:30", REFUSED),
    ("a LoRA dropout at its exclusive maximum", LORA, "dropout: 0.05", "dropout: 1", REFUSED),
    # names, choices and keys
    ("an unknown instance type", BASE, "ml.p6-b200.48xlarge", "ml.p9.48xlarge", REFUSED),
    ("an unknown catalogue model", BASE, "catalog: llama-3.2-1b", "catalog: llama-3.2-2b", REFUSED),
    ("a name over 84 characters", BASE, "name: llama3-1b-bf16", "name: " + "a" * 85, REFUSED),
    ("an unknown schedule", BASE, "schedule: cosine", "schedule: cosinus", REFUSED),
    ("an unknown precision", BASE, "precision: bf16\n", "precision: bf17\n", REFUSED),
    ("an unknown token type", BASE, "token_dtype: uint32", "token_dtype: uint31", REFUSED),
    ("an unknown key", BASE, "  instance_count: 1\n", "  instance_count: 1\n  instances: 1\n", REFUSED),
    ("a sequence shorter than the least", BASE, "sequence_length: 8192", "sequence_length: 64", REFUSED),
    ("a missing required field", BASE, "  instance_type: ml.p6-b200.48xlarge\n", "", REFUSED),
    ("a list where a section goes", BASE, "checkpointing:\n  interval_minutes: 30\n  keep_last: 3\n",
     "checkpointing: [30, 3]\n", REFUSED),
    # accepted
    ("an integral float for an integer", BASE, "instance_count: 1\n", "instance_count: 1.0\n", ACCEPTED),
    ("an integral float in exponent form", BASE, "sequence_length: 8192", "sequence_length: 8.192e3", ACCEPTED),
    ("an integral float in a union with auto", BASE, "precision: bf16\n", "precision: bf16\n  micro_batch_size: 2.0\n",
     ACCEPTED),
    ("a grouped number at its maximum", BASE, "token_dtype: uint32\n", "token_dtype: uint32\n  seed: 4_294_967_295\n",
     ACCEPTED),
    ("a grouped number one above its maximum", BASE, "token_dtype: uint32\n",
     "token_dtype: uint32\n  seed: 4_294_967_296\n", REFUSED),
    ("a grouped number at a float's maximum", BASE, "lr: 3.0e-4", "lr: 0_001", ACCEPTED),
    ("a grouped number in a float field", BASE, "max_runtime_hours: 96", "max_runtime_hours: 0_096", ACCEPTED),
    ("a grouped integer with leading zeros", BASE, "keep_last: 3", "keep_last: 0_000_003", ACCEPTED),
    ("a name of 84 characters", BASE, "name: llama3-1b-bf16", "name: " + "a" * 84, ACCEPTED),
]


def _name(index: int) -> str:
    return f"edit-{index:02d}.yaml"


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, tuple[list[dict], dict]]:
    """For every template and edit (by file name): the editor's diagnostics, and the CLI's verdict (``ok`` and the
    errors' lines)."""
    if shutil.which("node") is None or not SERVER.exists():
        pytest.fail(f"{SERVER.relative_to(ROOT)} is missing: `make test` installs it (npm ci)")
    folder = tmp_path_factory.mktemp("edits")
    documents = {path.as_uri(): path.read_text() for path in RECIPES}
    for index, (_, recipe, old, new, _) in enumerate(EDITS):
        text = recipe.read_text()
        assert text.count(old) == 1, (recipe.name, old)
        # a name of its own: `validate` refuses two recipes of one name
        text = text.replace(old, new).replace(f"name: {recipe.stem}\n", f"name: {_name(index)[:-5]}\n")
        (folder / _name(index)).write_text(text)
        # opened beside the templates (never written there), so that its schema line finds the schema
        documents[(ROOT / "recipes" / _name(index)).as_uri()] = text
    server = LanguageServer([str(SERVER), "--stdio"], ROOT)
    try:
        editor = {uri.rsplit("/", 1)[1]: found for uri, found in server.diagnostics(documents).items()}
    finally:
        server.close()
    result = run_cli("validate", "--format", "json", ROOT / "recipes", folder)
    report = json.loads(result.stdout)
    cli: dict[str, dict] = {name: {"ok": True, "lines": set()} for name in editor}
    for error in report["errors"]:
        if error["severity"] == "error":
            entry = cli[error["file"].rsplit("/", 1)[1]]
            entry["ok"] = False
            entry["lines"].add(error["line"])
    assert result.returncode == (0 if all(entry["ok"] for entry in cli.values()) else 2)
    return {name: (editor[name], cli[name]) for name in editor}


@pytest.mark.parametrize("template", RECIPES, ids=lambda p: p.name)
def test_every_template_is_valid_to_the_editor_and_the_cli(verdicts, template):
    editor, cli = verdicts[template.name]
    assert editor == [] and cli["ok"]


@pytest.mark.parametrize("index", range(len(EDITS)), ids=[edit[0] for edit in EDITS])
def test_the_editor_and_the_cli_give_the_same_verdict(verdicts, index):
    case, _, _, new, verdict = EDITS[index]
    editor, cli = verdicts[_name(index)]
    said = [(d["range"]["start"]["line"] + 1, d["message"]) for d in editor]
    assert cli["ok"] is verdict, f"validate {'refuses' if verdict else 'accepts'} {new.strip()!r}"
    assert (not editor) is verdict, f"the editor {'flags' if verdict else 'accepts'} {new.strip()!r}: {said}"
    if verdict is REFUSED and cli["lines"] != {None}:  # a missing field has no line in the file
        assert {line for line, _ in said} & cli["lines"], (said, cli["lines"])
