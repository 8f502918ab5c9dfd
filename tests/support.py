"""Test helpers: a minimal valid recipe and ways to write variants of it."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from tiered_training.contract.ports import loopback_port, serve_on_free_port

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))

BASE = {
    "name": "unit-test",
    "model": {"catalog": "llama-3.2-1b"},
    "data": {"uri": "s3://bucket-for-tests/tokens/"},
    "sequence_length": 4096,
    "budget": {"total_tokens": 10_000_000_000, "global_batch_tokens": 4096 * 256},
    "compute": {"instance_type": "ml.p6-b200.48xlarge", "instance_count": 1},
}


def recipe_dict(**overrides) -> dict:
    """The base recipe with dotted-path overrides, e.g. recipe_dict(**{"tuning.precision": "fp8"})."""
    data = copy.deepcopy(BASE)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if value is _DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return data


_DELETE = object()

DELETE = _DELETE


def rounded(value):
    """Floats to 6 significant digits, through dicts, lists and tuples: what a reviewed copy
    (``tests/golden/``) compares, since the C library's ``log``/``exp`` may differ in the last digits."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def write_yaml(path: Path, data: dict | str) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def free_port() -> int:
    """A free 127.0.0.1 port, outside the kernel's ephemeral range (tiered_training/contract/ports.py)."""
    return loopback_port()


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto server on 127.0.0.1 for the duration of the block; yields its endpoint URL."""
    from tiered_training.rehearse.s3 import start_moto

    server, port = serve_on_free_port(start_moto)
    url = f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        # moto's servers in one process share its backends: what this one made must not reach the next
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).close()
        server.stop()


def offline_aws_env(mp, home: Path, region: str) -> None:
    """Test credentials, one region, no retries and no user AWS configuration (``mp``: a MonkeyPatch)."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region, "AWS_MAX_ATTEMPTS": "1", "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"),
    }.items():
        mp.setenv(key, value)
    mp.delenv("AWS_PROFILE", raising=False)


CLI = [sys.executable, "-m", "tiered_training.cli.app"]

def run_cli(*args, cwd=ROOT):
    """The CLI in-process (typer's CliRunner), from ``cwd``; ``subprocess`` only where a test needs a real process."""
    import os
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from tiered_training.cli.app import app

    here = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, [str(a) for a in args], prog_name="tiered-training", env={"COLUMNS": None})
    finally:
        os.chdir(here)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


def run_cli_process(*args, cwd=ROOT):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=60)


def json_output(command: str, text: str) -> dict:
    """A command's ``--format json`` output, checked against its schema in docs/schemas/."""
    import json

    import jsonschema

    data = json.loads(text)
    schema = json.loads((ROOT / "docs" / "schemas" / f"{command}.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    return data


def unwrapped(text: str) -> str:
    """Printed text with its wrapping undone: each continuation line (indented four or more columns deeper
    than the line it continues, or after a line that ends in `` \\``, a command's) joined to that line with
    one space."""
    out: list[str] = []
    head = 0  # the indent of the line being continued
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if out and out[-1].endswith(" \\") and line.strip():
            out[-1] = out[-1][:-2] + " " + line.strip()
        elif out and out[-1].strip() and line.strip() and indent >= head + 4:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
            head = indent
    return "\n".join(out) + "\n"
