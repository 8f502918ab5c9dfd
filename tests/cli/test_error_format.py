"""One error format across the command line: ``error: FILE:LINE: FIELD: MESSAGE``, one line each."""

from __future__ import annotations

import re

from support import recipe_dict, run_cli, write_yaml

LINE = re.compile(r"^error: (?P<file>[^:]+):(?P<line>\d+): (?P<field>[\w.]+): (?P<message>.+)$")


def test_recipe_problems_and_planner_errors_share_one_format(tmp_path):
    write_yaml(tmp_path / "a-invalid.yaml", recipe_dict(**{"compute.instance_count": 0, "tuning.precision": "fp16"}))
    write_yaml(tmp_path / "b-unplannable.yaml", recipe_dict(**{"compute.instance_type": "ml.p9.48xlarge"}))
    for command in ("validate", "plan"):
        result = run_cli(command, tmp_path)
        assert result.returncode == 2
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.startswith("error")]
        assert len(lines) == 3, lines  # two problems in one file, one planner error in the other: a line each
        parsed = [LINE.match(line) for line in lines]
        assert all(parsed), lines
        assert sorted((m["file"].rsplit("/", 1)[-1], m["field"]) for m in parsed) == [
            ("a-invalid.yaml", "compute.instance_count"),
            ("a-invalid.yaml", "tuning.precision"),
            ("b-unplannable.yaml", "compute.instance_type"),
        ]
        [planner] = [m for m in parsed if m["field"] == "compute.instance_type"]
        assert planner["message"].endswith(" [unknown-instance]")


def test_a_command_that_takes_one_recipe_reports_a_planner_error_in_the_same_format(tmp_path):
    path = write_yaml(tmp_path / "r.yaml", recipe_dict(**{"compute.instance_type": "ml.p9.48xlarge"}))
    result = run_cli("run-config", path)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    match = LINE.match(line)
    assert match and match["field"] == "compute.instance_type" and line.endswith(" [unknown-instance]"), line
