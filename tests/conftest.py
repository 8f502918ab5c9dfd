"""Shared fixtures for the library's tests."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from support import write_yaml

# Property tests stay fast: few examples, no per-example deadline (2 shared CPUs). The
# mutation runs (scripts/mutation.py) use fewer, in a fixed order, so a verdict repeats.
settings.register_profile("default", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("mutation", max_examples=10, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _piped_output(monkeypatch):
    """Every test starts with its output to a pipe of no stated width, as a single pytest process has
    it: pytest-xdist's workers set COLUMNS=80 and LINES=24, which would wrap the CLI's one-line
    messages. A test about widths sets COLUMNS itself."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


# Fixtures wider than a test (a session's synth) see no user cache either.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tiered-training-cache-")


@pytest.fixture(autouse=True)
def _own_price_cache(monkeypatch, tmp_path_factory):
    """No test reads the developer's price cache (``~/.cache/tiered-training``) or price variables: each test
    starts with an empty cache directory of its own and no TIERED_TRAINING_PRICE_* set."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    for name in [n for n in os.environ if n.startswith("TIERED_TRAINING_PRICE_")]:
        monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _aws_calls_are_mapped(request):
    """In the tests of the commands that call AWS (tests/aws, tests/cli), every call of the package's
    clients, recorded with botocore's hooks (aws_calls.py), has its IAM request in
    constructs/access/cli_calls.yaml, which tests/constructs/test_operator_access.py proves the
    operator grant allows."""
    parts = Path(str(request.node.path)).parts
    if "tests" not in parts or parts[parts.index("tests") + 1] not in ("aws", "cli"):
        yield
        return
    from aws_calls import recording, unmapped

    with recording(request.node.nodeid) as recorder:
        yield
    missing = unmapped(recorder.calls)
    assert not missing, f"calls without an IAM mapping in constructs/access/cli_calls.yaml (and the operator grant): {missing}"


@pytest.fixture
def write_recipe(tmp_path):
    def write(data: dict | str, name: str = "recipe.yaml") -> Path:
        return write_yaml(tmp_path / name, data)

    return write


# -- scheduling over CPUs (`make test`: pytest-xdist, -n 2 --dist loadscope --no-loadscope-reorder) -------------
# A work unit goes to one worker: a test module, so that its module-scoped fixtures (a rehearsal, a torchrun)
# run once; tests/constructs as one unit, so that its session-scoped synth runs in one worker only; SPLIT
# modules test by test (their fixtures are cheap). Units run heaviest first, so that the last one to start
# is short (longest processing time first): HEAVY lists them by measured wall time (pytest --durations on
# 2 CPUs; tests/constructs is the longest unit); unlisted ones follow in collection order. A new module with a slow fixture belongs in HEAVY.
HEAVY = (
    "tests/constructs",
    "tests/trainer/test_multiprocess.py",
    "tests/rehearse/test_prepare_rehearsal.py",  # Prepare from raw examples, then two executions on 2 hosts
    "tests/rehearse/test_corpus_rehearsal.py",  # raw corpora: Prepare on 2 instances, training, a reusing rerun
    "tests/trainer/test_planner_vs_trainer.py",
    "tests/rehearse/test_runs_rehearsal.py",
    "tests/rehearse/test_sft_rehearsal.py",
    "tests/trainer/test_multihost_fixes.py",
    "tests/rehearse/test_rehearsal.py",
    "tests/trainer/test_lora.py",
    "tests/trainer/test_attention.py",  # compiled FlexAttention
    "tests/runtime/test_runtime_gpu_check.py",
    "tests/rehearse/test_lease_rehearsal.py",
    "tests/trainer/test_compile.py",
    "tests/test_mutation.py",
    "tests/trainer/test_model.py",
    "tests/rehearse/test_every_template.py",
    "tests/trainer/test_sft_end_to_end.py",  # two torchrun launches of an SFT run
    "tests/runtime/test_runtime_dockerfile.py",  # pip resolves against the package index: mostly waiting
    "tests/trainer/test_init_checkpoint_loss.py",
    "tests/trainer/test_dpo_oracle.py",  # trl's DPOTrainer built 7 times, tiny models
    "tests/trainer/test_dpo_train.py",  # two one-process DPO runs (full, LoRA) of 12 steps
    "tests/trainer/test_shard_checksums.py",  # one trainer process stopped by a truncated shard
    "tests/trainer/test_qlora.py",
    "tests/planning/test_perf.py",
    "tests/trainer/test_context_parallel.py",
    "tests/trainer/test_grad_sync.py",
    "tests/runtime/test_runtime_entry.py",
    "tests/runtime/test_runtime_probe.py",
    "tests/rehearse/test_stop.py",  # one BF16 rehearsal stopped by SIGTERM once its trainers run (about 35 s)
    "tests/rehearse/test_health_rehearsal.py",  # a Probe failing its health check, a training job's XID (about 30 s)
    "tests/trainer/test_corpus_prepare.py",  # every format, and two Prepare hosts on a local S3, rerun three times
    "tests/trainer/test_packing.py",
    "tests/trainer/test_optim_and_entry.py",
    "tests/test_packaging.py",
    "tests/planning/test_properties.py",
)

SPLIT = ("tests/rehearse/test_every_template.py",)  # one rehearsal per test, on a shared moto server per worker


def _unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in SPLIT:
        return nodeid
    return "tests/constructs" if module.startswith("tests/constructs/") else module


def _rank(nodeid: str) -> int:
    module = nodeid.split("::", 1)[0]
    for rank, prefix in enumerate(HEAVY):
        if module == prefix or module.startswith(prefix + "/"):
            return rank
    return len(HEAVY)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: a module's tests stay together, in order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope with the work units above (xdist's scope is the module or the class)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByUnit(config, log)
