"""Mutation testing of the pure-Python core with mutmut, one module at a time.

For each module this lays out a scratch copy of the project under ``/tmp/tt-mutation/<module>/`` (``MUTATION_DIR``)
whose ``pyproject.toml`` tells mutmut to mutate only that module and to run only the fast
test files listed for it below; then runs ``mutmut run`` there and prints the score and
every surviving mutant (its diff), then a table of scores.

    python scripts/mutation.py                  # every module
    python scripts/mutation.py perf memory      # some modules
    python scripts/mutation.py --report-only    # print the last results again, run nothing

A mutant "survives" when every test that reaches the mutated function still passes.
mutmut runs only the tests that reach the function (it records that on a clean run),
so a module's run costs roughly (mutants x the tests that reach each one).
Equivalent survivors and the reasons are listed in docs/mutation.md.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Outside the work tree and short: some tests print recipe paths into 60-column output.
WORK = Path(os.environ.get("MUTATION_DIR", "/tmp/tt-mutation"))

# module -> the fast test files that exercise it (mutmut runs, per mutant, only those
# tests among these that reach the mutated function).
# Each module's file under tiered_training/ (the name is the file's stem, as docs/mutation.md records).
FILES = {"errors": "recipe/errors.py", "recipe": "recipe/__init__.py", "loader": "recipe/loader.py",
         "planner": "planning/planner.py", "search": "planning/search.py", "choice": "planning/choice.py",
         "records": "planning/records.py", "runtime": "planning/runtime.py", "perf": "planning/perf.py", "memory": "planning/memory.py",
         "plan": "planning/plan.py", "runconfig": "contract/runconfig.py", "definition": "pipeline/definition.py", "validation": "pipeline/validation.py",
         "alarms": "planning/alarms.py", "calibration": "planning/calibration.py", "report": "report/__init__.py"}
MODULES: dict[str, list[str]] = {
    "errors": ["tests/recipe/test_loader_exact.py", "tests/recipe/test_errors.py", "tests/report/test_reported_lines.py", "tests/recipe/test_recipe.py"],
    "recipe": ["tests/recipe/test_recipe_values.py", "tests/recipe/test_recipe.py", "tests/report/test_reported_lines.py", "tests/pipeline/test_fidelity.py"],
    "loader": ["tests/report/test_reported_lines.py", "tests/recipe/test_loader_messages.py", "tests/recipe/test_recipe_files.py", "tests/recipe/test_recipe.py",
               "tests/recipe/test_recipe_lookup.py", "tests/recipe/test_loader_exact.py", "tests/cli/test_hostile_input.py",
               "tests/pipeline/test_fidelity.py"],
    "planner": ["tests/planning/test_plan_golden.py", "tests/planning/test_planner.py", "tests/planning/test_properties.py", "tests/pipeline/test_fidelity.py"],
    # planner.py's search, choice, decision records and runtime (split out of it) run under the same tests
    "search": ["tests/planning/test_plan_golden.py", "tests/planning/test_planner.py", "tests/planning/test_properties.py", "tests/planning/test_probe_candidates.py"],
    "choice": ["tests/planning/test_plan_golden.py", "tests/planning/test_planner.py", "tests/planning/test_alternatives.py", "tests/planning/test_probe_candidates.py"],
    "records": ["tests/planning/test_plan_golden.py", "tests/planning/test_planner.py", "tests/report/test_plan_output.py"],
    "runtime": ["tests/planning/test_plan_golden.py", "tests/planning/test_planner.py", "tests/planning/test_probe_time.py"],
    "perf": ["tests/planning/test_step_time.py", "tests/planning/test_perf.py", "tests/planning/test_comm_bound.py", "tests/planning/test_planner.py"],
    "memory": ["tests/planning/test_memory.py", "tests/planning/test_planner.py", "tests/planning/test_properties.py", "tests/planning/test_perf.py"],
    "plan": ["tests/report/test_plan_output.py", "tests/planning/test_planner.py", "tests/contract/test_runconfig.py", "tests/pipeline/test_fidelity.py"],
    "runconfig": ["tests/contract/test_run_identity.py", "tests/planning/test_batch_ramp.py", "tests/contract/test_runconfig.py", "tests/pipeline/test_fidelity.py", "tests/planning/test_properties.py"],
    "definition": ["tests/pipeline/test_training_arguments.py", "tests/pipeline/test_definition_checks.py", "tests/pipeline/test_gate.py", "tests/pipeline/test_definition.py",
                   "tests/pipeline/test_fidelity.py"],
    "validation": ["tests/pipeline/test_definition_checks.py", "tests/pipeline/test_definition.py"],
    "alarms": ["tests/planning/test_alarm_fitting.py", "tests/planning/test_alarm_routing.py"],
    "calibration": ["tests/planning/test_calibration.py", "tests/planning/test_perf.py"],
    "report": ["tests/report/test_plan_diff.py", "tests/report/test_report_json.py", "tests/cli/test_cli.py", "tests/cli/test_cli_output.py"],
}

# Tests left out of a module's run: the refits of the performance model (75 s a mutant) run in
# calibration's, where the fitting code is what they test.
DESELECT: dict[str, list[str]] = {
    "perf": ["tests/planning/test_perf.py::test_fit_reproduces_the_stored_parameters",
             "tests/planning/test_perf.py::test_a_refit_without_a_source_never_reads_that_source"],
    "memory": ["tests/planning/test_perf.py::test_fit_reproduces_the_stored_parameters",
               "tests/planning/test_perf.py::test_a_refit_without_a_source_never_reads_that_source"],
}

# What the tests read besides the package and the tests themselves.
ALSO_COPY = ["recipes", "examples", "training", "docs", "bench", "README.md", "app.py", "cdk.json"]


def layout(module: str) -> Path:
    """A scratch project for ``module``: the sources, and a pyproject.toml with its mutmut config."""
    here = WORK / module
    keep_results = here / "mutants"
    # mutmut re-copies neither the package's data files nor a source whose copy is newer:
    # results are kept only while the package is the same as in the run that made them.
    digest = _package_digest()
    stamp = here / "package.sha256"
    if keep_results.exists() and (not stamp.exists() or stamp.read_text() != digest):
        print(f"== {module}: the package changed since the last run; its results are discarded", flush=True)
        shutil.rmtree(keep_results)
    # Which tests reach which function is recorded afresh each run: mutmut keeps the old record of
    # a test it has seen before, and a changed test may reach more (or other) functions now.
    (keep_results / "mutmut-stats.json").unlink(missing_ok=True)
    if here.exists():
        for entry in here.iterdir():
            if entry != keep_results:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    here.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "snapshots", "cdk.out")
    shutil.copytree(ROOT / "tiered_training", here / "tiered_training", ignore=ignore)
    shutil.copytree(ROOT / "tests", here / "tests", ignore=ignore)
    for name in ALSO_COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, here / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, here / name)
    tests = [t for t in MODULES[module] if (ROOT / t).exists()]
    tests += [arg for test in DESELECT.get(module, []) for arg in ("--deselect", test)]
    pyproject = (ROOT / "pyproject.toml").read_text()
    pyproject = re.sub(r"\n\[tool\.mutmut\][^\[]*", "\n", pyproject)
    pyproject += (
        "\n[tool.mutmut]\n"
        'source_paths = ["tiered_training"]\n'
        f'only_mutate = ["tiered_training/{FILES[module]}"]\n'
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n'
        f"also_copy = {json.dumps(ALSO_COPY)}\n"
        "use_git_change_detection = false\n"
    )
    (here / "pyproject.toml").write_text(pyproject)
    stamp.write_text(digest)
    return here


def _package_digest() -> str:
    """sha256 over every file of the package (paths and contents)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "tiered_training").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the mutated copy must be what imports
    env["HYPOTHESIS_PROFILE"] = "mutation"
    return env


def _mutmut(here: Path, args: list[str], deadline: float | None) -> bool:
    """Run mutmut in its own process group; stop the group at the deadline. False when stopped."""
    mutmut = Path(sys.executable).with_name("mutmut")
    quiet = not os.environ.get("MUTATION_VERBOSE")
    process = subprocess.Popen([str(mutmut), *args], cwd=here, env=_env(), start_new_session=True,
                               stdout=subprocess.DEVNULL if quiet else None)
    try:
        code = process.wait(timeout=None if deadline is None else max(1.0, deadline - time.time()))
        if code:
            print(f"== mutmut {' '.join(args[:1])} exited with {code} (MUTATION_VERBOSE=1 shows why)", flush=True)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return False


def run(module: str, children: int, deadline: float | None) -> bool:
    """Test again the mutants that survived a previous run (tests may have been added since),
    then those that have no result yet. False when the deadline stopped it."""
    stamp = WORK / module / "package.sha256"
    same = stamp.exists() and stamp.read_text() == _package_digest()
    before = (results(module) or {}) if same else {}
    again = before.get("survived", []) + before.get("no tests", [])
    here = layout(module)
    print(f"== {module}: mutmut over {', '.join(t for t in MODULES[module] if (here / t).exists())}", flush=True)
    if again:
        print(f"== {module}: again the {len(again)} mutants that survived the previous run", flush=True)
        if not _mutmut(here, ["run", "--max-children", str(children), *again], deadline):
            return False
    return _mutmut(here, ["run", "--max-children", str(children)], deadline)


def results(module: str) -> dict[str, list[str]] | None:
    """Mutant names by status (killed, survived, timeout, no tests, not checked, ...) from the last run."""
    here = WORK / module
    if not (here / "mutants").exists():
        return None
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run([str(mutmut), "results", "--all", "true"], cwd=here, env=_env(), capture_output=True,
                         text=True, check=False).stdout
    by_status: dict[str, list[str]] = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith("tiered_training."):
            by_status.setdefault(status.strip(), []).append(name)
    return by_status


def show(module: str, mutant: str) -> str:
    mutmut = Path(sys.executable).with_name("mutmut")
    return subprocess.run([str(mutmut), "show", mutant], cwd=WORK / module, env=_env(), capture_output=True,
                          text=True, check=False).stdout


def summarise(modules: list[str], diffs: bool) -> int:
    rows = []
    for module in modules:
        by_status = results(module)
        if by_status is None:
            rows.append((module, None))
            continue
        killed = len(by_status.get("killed", [])) + len(by_status.get("timeout", []))
        survived = by_status.get("survived", [])
        untested = by_status.get("no tests", [])
        other = {k: v for k, v in by_status.items() if k not in ("killed", "timeout", "survived", "no tests")}
        total = killed + len(survived) + len(untested)
        rows.append((module, (killed, total, survived, untested, other)))
        if diffs and (survived or untested):
            print(f"\n== {module}: {len(survived)} survived, {len(untested)} reached by no test")
            for name in survived + untested:
                print(show(module, name).rstrip() or name)
    print("\nmodule        killed / mutants   score   survived  no-tests")
    for module, row in rows:
        if row is None:
            print(f"{module:<13} not run")
            continue
        killed, total, survived, untested, other = row
        score = 100.0 * killed / total if total else 100.0
        extra = "  " + ", ".join(f"{k}: {len(v)}" for k, v in other.items()) if other else ""
        print(f"{module:<13} {killed:>6} / {total:<7}  {score:5.1f}%  {len(survived):>8}  {len(untested):>8}{extra}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help=f"modules to run (default: all of {', '.join(MODULES)})")
    parser.add_argument("--report-only", action="store_true", help="print the last results, run nothing")
    parser.add_argument("--no-diffs", action="store_true", help="only the table, not each survivor's diff")
    parser.add_argument("--children", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--deadline", metavar="HH:MM", help="stop testing at this UTC time (the next one to come); results so far are kept")
    parser.add_argument("--deselect", metavar="NODEID", action="append", default=[],
                        help="leave this test out of this run (repeatable): for a second pass over survivors that an "
                             "unchanged slow test already failed to kill")
    args = parser.parse_args()
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(MODULES)}")
    modules = args.modules or list(MODULES)
    for module in modules:
        DESELECT[module] = DESELECT.get(module, []) + args.deselect
    deadline = None
    if args.deadline:
        hours, minutes = map(int, args.deadline.split(":"))
        now = datetime.datetime.now(datetime.UTC)
        when = now.replace(hour=hours, minute=minutes, second=0, microsecond=0)
        if when <= now:  # a time already past today means tomorrow's
            when += datetime.timedelta(days=1)
        deadline = when.timestamp()
    if not args.report_only:
        for module in modules:
            if not run(module, args.children, deadline):
                print(f"== {module}: stopped at the deadline; its untested mutants show as 'not checked'", flush=True)
                break
    return summarise(modules, diffs=not args.no_diffs)


if __name__ == "__main__":
    sys.exit(main())
