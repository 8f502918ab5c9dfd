"""What the CLI prints: no markup from user text, strict JSON on every command, exit
codes, width, version, completion, public sources, spot. In-process (CliRunner)."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from support import RECIPES, ROOT, recipe_dict, unwrapped, write_yaml
from typer.testing import CliRunner

from tiered_training import catalog as catalogs
from tiered_training import report
from tiered_training.cli.app import app
from tiered_training.planning import quotas
from tiered_training.planning.planner import plan_file

RUNNER = CliRunner()
PIPED = {"COLUMNS": None}  # not a terminal, no COLUMNS: nothing wraps


def invoke(*args, env=PIPED):
    return RUNNER.invoke(app, [str(a) for a in args], prog_name="tiered-training", env=env)


def strict_json(text: str):
    """JSON as the standard has it: Infinity and NaN are not JSON."""

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


# -- markup ------------------------------------------------------------------------------


def test_user_text_is_never_markup(tmp_path):
    path = write_yaml(tmp_path / "r.yaml", recipe_dict(**{"compute.instance_type": "[/]", "model.catalog": "[bold]x[/bold]"}))
    for command in ("validate", "plan", "explain"):
        result = invoke(command, path)
        assert result.exit_code == 2, (command, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert "'[/]'" in result.output and "'[bold]x[/bold]'" in result.output, result.output


def test_brackets_in_messages_survive(tmp_path):
    path = write_yaml(tmp_path / "r.yaml", recipe_dict(**{"data.uri": "http://[red]nope[/red]/[/]"}))
    result = invoke("validate", path)
    assert "(got 'http://[red]nope[/red]/[/]')" in result.stderr  # printed as written, not as rich markup


def test_markup_in_a_table_cell_prints_as_written(tmp_path):
    path = write_yaml(tmp_path / "r.yaml", recipe_dict(**{"model.catalog": None, "model.name": "[red]x[/red] [/]", "model.dimensions": {"layers": 16, "hidden_size": 2048, "attention_heads": 32, "kv_heads": 8, "ffn_size": 8192, "vocab_size": 128256}}))
    for columns in (None, "80"):
        result = invoke("plan", "--wide", path, env={"COLUMNS": columns})
        assert result.exit_code == 0, result.output
        assert "[red]x[/red]" in result.stdout and "[/]" in result.stdout  # as written (a piped table may wrap at the space)


# -- JSON on every command ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,key",
    [
        (("plan", *RECIPES[:2]), "plans"),
        (("validate", *RECIPES[:2]), "recipes"),
        (("explain", RECIPES[0]), "plans"),
        (("diff", RECIPES[0], RECIPES[1]), "diffs"),
        (("tiers",), "tiers"),
        (("models",), "models"),
        (("instances",), "instances"),
        (("run-config", RECIPES[0]), "recipe_name"),
    ],
    ids=lambda v: v if isinstance(v, str) else v[0],
)
def test_every_command_takes_format_json(args, key):
    result = invoke(args[0], "--format", "json", *args[1:])
    assert result.exit_code == 0, result.output
    data = strict_json(result.stdout)
    assert key in data
    assert result.stderr == ""


def test_failed_recipes_appear_in_json_with_their_errors(tmp_path):
    bad = write_yaml(tmp_path / "bad.yaml", recipe_dict(sequence_length=64))
    unplannable = write_yaml(tmp_path / "a100.yaml", recipe_dict(name="a100", **{"compute.instance_type": "ml.p4d.24xlarge", "tuning.precision": "fp8"}))
    result = invoke("plan", "-f", "json", RECIPES[0], bad, unplannable)
    assert result.exit_code == 2
    data = strict_json(result.stdout)
    assert data["ok"] is False
    assert [i["source"] for i in data["invalid"]] == [str(bad)]
    error = data["invalid"][0]["errors"][0]
    assert error["field"] == "sequence_length" and error["line"] and error["value"] == "64"
    plans = {p["source"]: p for p in data["plans"]}
    assert plans[str(unplannable)]["ok"] is False
    assert any(f["code"] == "fp8-unsupported" for f in plans[str(unplannable)]["findings"])

    validated = strict_json(invoke("validate", "-f", "json", RECIPES[0], bad, unplannable).stdout)
    verdicts = {r["source"]: r for r in validated["recipes"]}
    assert verdicts[str(RECIPES[0])]["ok"] and not verdicts[str(bad)]["ok"] and not verdicts[str(unplannable)]["ok"]
    assert verdicts[str(unplannable)]["errors"][0]["code"] == "fp8-unsupported"
    assert verdicts[str(unplannable)]["errors"][0]["line"] is not None


def test_json_has_no_infinity(tmp_path):
    # The largest budget the bounds allow, on the slowest instance: still finite.
    path = write_yaml(tmp_path / "big.yaml", recipe_dict(**{"budget.total_tokens": 10**15, "compute.instance_type": "ml.p4d.24xlarge", "compute.price_per_hour": 100_000}))
    result = invoke("plan", "-f", "json", path)
    strict_json(result.stdout)


# -- exit codes --------------------------------------------------------------------------


def test_diff_with_a_failed_plan_exits_2_and_prints_no_comparison(tmp_path):
    good = write_yaml(tmp_path / "good.yaml", recipe_dict())
    broken = write_yaml(tmp_path / "a100.yaml", recipe_dict(**{"compute.instance_type": "ml.p4d.24xlarge", "tuning.precision": "fp8"}))
    result = invoke("diff", good, broken)
    assert result.exit_code == 2
    assert "fp8-unsupported" in result.stderr
    assert "->" not in result.stdout and "cost_usd" not in result.stdout
    as_json = invoke("diff", "-f", "json", good, broken)
    assert as_json.exit_code == 2
    data = strict_json(as_json.stdout)
    assert data["diffs"] == [] and data["ok"] is False and data["exit_code"] == 2
    assert [p["name"] for p in data["plans"]] == ["unit-test"] and "fp8-unsupported" in {e["code"] for e in data["errors"]}
    invalid = write_yaml(tmp_path / "invalid.yaml", recipe_dict(sequence_length=3))
    assert invoke("diff", good, invalid).exit_code == 2


def test_a_bad_option_is_exit_2():
    assert invoke("plan", "--format", "yaml", RECIPES[0]).exit_code == 2
    assert invoke("run-config", "--format", "table", RECIPES[0]).exit_code == 2


# -- width ---------------------------------------------------------------------------------


@pytest.mark.parametrize("columns", [80, 100, 140])
def test_plan_fits_the_width_and_never_splits_a_number(columns):
    plans = [plan_file(path) for path in RECIPES]
    for wide, row, numeric in ((False, report.brief_row, report.BRIEF_NUMERIC), (True, report.summary_row, report.NUMERIC_COLUMNS)):
        result = invoke("plan", *(["--wide"] if wide else []), *RECIPES, env={"COLUMNS": str(columns)})
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= columns
        for plan in plans:
            for column in numeric:
                assert row(plan)[column] in result.stdout, (column, row(plan)[column])


def test_piped_plan_of_the_templates_fits_100_columns_with_one_quota_table():
    """What `make synth` prints first: one line per recipe, one table of the quotas, no fix commands."""
    result = invoke("plan", ROOT / "recipes")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # one line per recipe, then the quota table and the notes (27 lines)
    assert max(map(len, lines)) <= 100 and len(lines) <= len(RECIPES) + 27, (max(map(len, lines)), len(lines))
    plans = [plan_file(path) for path in RECIPES]
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["recipe", "compute"])
    assert sorted(line.split()[0] for line in lines[header + 2 : header + 2 + len(plans)]) == sorted(p.name for p in plans)
    for plan in plans:  # its row: memory, speed, time, status
        row = next(line for line in lines if line.startswith(plan.name + " "))
        brief = report.brief_row(plan)
        assert all(brief[c] in row for c in ("GiB/GPU", "tok/s/GPU", "time", "status")), (row, brief)
    assert "quota(s) to raise" not in result.stdout and "request-service-quota-increase" not in result.stdout
    assert "quota-needed" not in result.stdout
    # Each quota a template needs raised: once, with its code and AWS's default.
    quota_header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["quota", "code"])
    needed = {q.quota.title: q.quota for p in plans for q in quotas.shortfalls(p.recipe, None, quotas.prepare_instances(p))}
    quota_lines = lines[quota_header + 2 : quota_header + 2 + len(needed)]
    assert len(needed) > 1 and sorted(line[: line.index("  ")] for line in quota_lines) == sorted(needed)
    for line in quota_lines:
        quota = needed[line[: line.index("  ")]]
        assert (quota.code or "not published") in line
    assert sum(line.startswith("ml.") or line.startswith("Number") for line in lines) == len(needed)
    # The legend, and where to see more.
    assert report.BRIEF_LEGEND[0].split(";")[0] in result.stdout
    assert "plan --wide" in result.stdout and "explain NAME" in result.stdout
    wide = invoke("plan", "--wide", ROOT / "recipes").stdout
    assert "mb x accum: micro-batch per GPU" in " ".join(wide.split())


def _a_command(line: str) -> bool:
    """A line that holds one `command` and nothing else, or a part of one that continues over lines (`` \\``):
    broken only at spaces outside quotes, so a word of it (a quoted query) may be wider than the terminal."""
    return bool(re.fullmatch(r" *`[^`]*`[,.;]?", line) or re.fullmatch(r" *`[^`]* \\", line) or re.fullmatch(r" *[^` ][^`]*( \\|`[,.;]?)", line))


def _commands(text: str) -> list[str]:
    """The `commands` in printed text, each as a shell reads it (`` \\`` and the line break after it removed)."""
    return [re.sub(r" \\\n *", " ", c) for c in re.findall(r"`[^`]*`", text)]


def test_tiers_and_instances_fit_80_columns():
    for command in ("tiers", "instances", "models", "explain"):
        args = (command, RECIPES[0]) if command == "explain" else (command,)
        result = invoke(*args, env={"COLUMNS": "80"})
        assert result.exit_code == 0
        assert max(len(line) for line in result.stdout.splitlines() if not _a_command(line)) <= 80, command


def test_a_command_in_a_message_is_split_only_as_a_shell_reads_it():
    """A `command` stays on one line where it fits; a longer one continues over lines that end in ``\\``,
    so that pasted into a shell it is the same command; either way every line fits but for a quoted word."""
    for columns in ("80", None):
        result = invoke("explain", RECIPES[0], env={"COLUMNS": columns})
        fixes = " ".join(f["fix"] or "" for f in strict_json(invoke("explain", RECIPES[0], "--format", "json").stdout)["plans"][0]["findings"])
        commands = re.findall(r"`[^`]*`", result.stdout)
        assert commands and all("\n" not in c.replace(" \\\n", "") for c in commands)
        assert any(" \\\n" in c for c in commands)  # the aws service-quotas commands are wider than a line
        aws = [command for command in _commands(result.stdout) if command.startswith("`aws ")]
        assert aws and all(command in fixes for command in aws), aws
        width = int(columns or 100)
        assert max(len(line) for line in result.stdout.splitlines() if "'].QuotaCode" not in line) <= width


def test_explain_wraps_at_spaces_on_a_narrow_terminal(monkeypatch):
    # A relative path: the recipe's path is one word, and a long checkout path cannot wrap.
    monkeypatch.chdir(RECIPES[0].parent)
    narrow = invoke("explain", RECIPES[0].name, env={"COLUMNS": "60"}).stdout
    piped = invoke("explain", RECIPES[0].name).stdout
    words = lambda text: text.split()  # noqa: E731
    assert words(unwrapped(narrow)) == words(unwrapped(piped))  # the same words: no word, no number, split
    assert max(len(line) for line in narrow.splitlines() if not _a_command(line)) <= 60 < max(map(len, piped.splitlines()))


def test_piped_tables_wrap_their_prose_and_keep_every_word():
    from tiered_training.report.render import PIPED_TABLE_WIDTH

    for command, rows in (("tiers", report.tier_rows()), ("instances", None)):
        result = invoke(command, env=PIPED)
        assert result.exit_code == 0
        lines = result.stdout.splitlines()
        assert max(map(len, lines)) <= PIPED_TABLE_WIDTH, command
        words = set(result.stdout.split())
        cells = [str(v) for row in rows for v in row.values()] if rows else [i["price_source"] for i in report.instances_data()["instances"] if i["price_per_hour"] is not None]
        for cell in cells:
            assert set(cell.split()) <= words, (command, cell)  # wrapped at spaces, never cut or folded


def test_piped_validate_wraps_a_finding_under_its_first_line_and_never_splits_a_path(tmp_path):
    deep = tmp_path / ("d" * 120) / ("e" * 120)
    deep.mkdir(parents=True)
    path = write_yaml(deep / "warn.yaml", recipe_dict(**{"tuning.precision": "fp8"}))
    result = invoke("validate", path)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == f"{path}: ok"  # the verdict first
    first = next(i for i, x in enumerate(lines) if x.startswith("warning: "))
    assert lines[first].startswith(f"warning: {path}:")  # a path wider than the line stays whole
    assert all(len(x) <= 100 for x in lines if str(path) not in x)
    line = next(x for x in unwrapped(result.stdout).splitlines() if "fp8-small-gain" in x)
    assert line.startswith(f"warning: {path}:") and "Fix:" in line and len(line) > 300


def test_no_color_means_no_bold_and_no_ansi_at_all():
    """https://no-color.org: NO_COLOR set, a terminal gets the same tables without a single escape sequence."""
    terminal = {"FORCE_COLOR": "1", "COLUMNS": "200", "NO_COLOR": None}
    for args in (("plan", RECIPES[0]), ("tiers",), ("instances",), ("plan", "--wide", RECIPES[0])):
        styled = invoke(*args, env=terminal)
        plain = invoke(*args, env={**terminal, "NO_COLOR": "1"})
        assert styled.exit_code == plain.exit_code == 0, plain.output
        assert "\x1b[1m" in styled.stdout, args  # bold headers on a terminal
        assert "\x1b" not in plain.stdout and "\x1b" not in plain.stderr, args
        assert plain.stdout.split() == re.sub(r"\x1b\[[0-9;]*m", "", styled.stdout).split()


# -- conveniences ------------------------------------------------------------------------


def test_version():
    from importlib.metadata import version

    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"tiered-training {version('tiered-training')}"


def test_shell_completion_without_a_terminal(tmp_path, monkeypatch):
    # Typer finds the user's shell among the parent processes (shellingham); a test run may
    # have none (nohup, CI), so the parent shell is stood in: a user typing in bash.
    import shellingham

    monkeypatch.setattr(shellingham, "detect_shell", lambda *a, **k: ("bash", "/bin/bash"))
    script = invoke("--show-completion", "bash")
    assert script.exit_code == 0 and "_TIERED_TRAINING_COMPLETE=complete_bash" in script.stdout
    completed = invoke(env={"_TIERED_TRAINING_COMPLETE": "complete_bash", "COMP_WORDS": "tiered-training st", "COMP_CWORD": "1"})
    assert set(completed.stdout.split()) == {"start", "status", "stop"}
    installed = invoke("--install-completion", "bash", env={"HOME": str(tmp_path), "SHELL": "/bin/bash"})
    assert installed.exit_code == 0, installed.output
    assert "tiered-training" in (tmp_path / ".bashrc").read_text()


# -- sources and spot ------------------------------------------------------------------------


def test_output_cites_public_sources_only(tmp_path):
    outputs = [invoke("instances").stdout, invoke("instances", "-f", "json").stdout, invoke("tiers", "-f", "json").stdout]
    outputs += [invoke("explain", path).stdout for path in RECIPES]
    outputs += [invoke("plan", "-f", "json", *RECIPES).stdout]
    text = "\n".join(outputs)
    assert "facts.md" not in text and "/work/shared" not in text and "reference sheet" not in text
    assert "EC2" not in text  # the bill is SageMaker's training price, never EC2's
    assert "SageMaker training" in text
    package = ROOT / "tiered_training"
    for path in [*package.rglob("*.py"), *package.rglob("*.yaml")]:
        assert "facts.md" not in path.read_text(), path


def test_spot_cost_uses_the_catalogue_discount_labelled_as_an_estimate(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERED_TRAINING_PRICE_ML_P6_B200_48XLARGE", "100")
    on_demand = plan_file(write_yaml(tmp_path / "od.yaml", recipe_dict()))
    spot = plan_file(write_yaml(tmp_path / "spot.yaml", recipe_dict(**{"compute.spot": True})))
    discount = catalogs.instances()["ml.p6-b200.48xlarge"].spot_discount
    assert 0 < discount < 1
    assert spot.estimates.cost_usd == pytest.approx(on_demand.estimates.cost_usd * (1 - discount))
    assert "estimate" in spot.estimates.price_source and "spot" in spot.estimates.price_source
    explained = unwrapped(invoke("explain", tmp_path / "spot.yaml").stdout)
    assert re.search(r"cost .*spot: expected \d+% below on-demand \(estimate\)", explained)
    assert "spot est." in invoke("plan", "--wide", tmp_path / "spot.yaml").stdout
    assert "~$" in invoke("plan", tmp_path / "spot.yaml").stdout
    # A recipe's own price is the price paid: no discount on top.
    own = plan_file(write_yaml(tmp_path / "own.yaml", recipe_dict(**{"compute.spot": True, "compute.price_per_hour": 50.0})))
    assert own.estimates.price_per_hour == 50.0


def test_every_catalogue_instance_has_a_labelled_spot_estimate():
    for instance in catalogs.instances().values():
        assert 0 < instance.spot_discount < 0.9, instance.name
        assert "estimate" in instance.spot_source
    header = (ROOT / "tiered_training" / "catalog" / "instances.yaml").read_text().split("\nml.", 1)[0]
    assert "Spot Instance Advisor" in header and "Managed Spot Training" in header


def test_yaml_round_trip_of_the_json_is_loadable():
    data = strict_json(invoke("tiers", "-f", "json").stdout)
    assert [t["name"] for t in data["tiers"]] == [t.name for t in catalogs.tiers()]
    yaml.safe_dump(data)


@pytest.mark.parametrize("args", [("templates",), ("tiers",), ("plan", "recipes/"), ("models",), ("instances",)])
@pytest.mark.parametrize("columns", [None, "100"])
def test_a_table_fits_100_columns_with_no_trailing_space_and_no_clipped_cell(args, columns, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = RUNNER.invoke(app, list(args), prog_name="tiered-training", env={"COLUMNS": columns, "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert [line for line in lines if line != line.rstrip()] == []
    assert not [line for line in lines if "..." in line or "characters)" in line]


def test_validate_gives_one_account_line_per_recipe_under_its_verdict_and_leaves_each_quota_to_explain(monkeypatch):
    monkeypatch.chdir(ROOT)
    result = RUNNER.invoke(app, ["validate", "recipes/"], prog_name="tiered-training", env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and [x for x in lines if x != x.rstrip()] == []
    data = json.loads(
        RUNNER.invoke(app, ["validate", "recipes/", "--format", "json"], prog_name="tiered-training").stdout
    )
    needing = {r["source"]: len(r["account"]) for r in data["recipes"] if r["account"]}
    assert needing, data
    for source, count in needing.items():
        verdict = lines.index(f"{source}: ok")
        many = f"{count} quotas" if count > 1 else "a quota"
        assert lines[verdict + 1] == f"account: {source}: {many} to raise; `explain` names them. [quota-needed]"
    assert sum(line.startswith("account: ") for line in lines) == len(needing)
    explained = RUNNER.invoke(app, ["explain", source], prog_name="tiered-training", env={"COLUMNS": None})
    assert explained.stdout.count("aws service-quotas request-service-quota-increase") == count
