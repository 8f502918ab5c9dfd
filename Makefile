# Two commands on a fresh machine:
#   make synth   install what planning and synthesis need (.[cdk]), then synthesise every recipe offline
#   make test    install everything (torch, transformers, moto...), then run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SYNTH_STAMP := $(VENV)/.installed-synth
TEST_STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: synth test rehearse-deps lint determinism snapshots mutation plan bench suite-cost calibrate memory-bench gpu-wheels gpu-smoke image-login image clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# pyproject.toml declares version ranges; constraints.txt pins the versions CI verified.
# torch is installed first so that no other package pulls a CUDA build.
# The SageMaker SDK (the oracle of tests/pipeline/test_sdk_oracle.py) goes in last, without its declared
# requirements, which conflict with the pins above (requirements-oracle.txt says which and why).
CONSTRAINTS := constraints.txt
# uv installs from the same constraints as pip would, in seconds instead of minutes. uv does not read
# pip's configuration: it is given pip's find-links, where a machine may keep its CPU build of torch.
# --compile-bytecode writes the .pyc files at install, as pip does: without them (uv's default) a
# process compiles what it imports (torch and transformers, seconds each time), and where
# PYTHONDONTWRITEBYTECODE is set, every process does so again.
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install --quiet --compile-bytecode --python $(PY) -c $(CONSTRAINTS)
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
$(UV): $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) uv
	touch $(UV)

# Planning and synthesis: the package and its cdk extra (boto3 included), no torch.
$(SYNTH_STAMP): pyproject.toml $(CONSTRAINTS) | $(UV)
	$(UV_INSTALL) -e ".[cdk]"
	touch $(SYNTH_STAMP)

# The test suite: every extra (the trainer's torch and transformers, moto, cfn-lint...).
ORACLE := requirements-oracle.txt
$(TEST_STAMP): pyproject.toml $(CONSTRAINTS) $(ORACLE) | $(UV)
	$(UV_INSTALL) $(addprefix --find-links ,$(FIND_LINKS)) torch==2.13.0
	$(UV_INSTALL) -e ".[cdk,train,dev,plot,rehearse]"
	$(UV_INSTALL) --no-deps -r $(ORACLE)
	touch $(TEST_STAMP) $(SYNTH_STAMP)

# The pinned CDK CLI, and Node 22 (jsii warns on older Node); node_modules/.bin is first on PATH.
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $(NODE_STAMP)

plan: $(SYNTH_STAMP)
	$(VENV)/bin/tiered-training plan recipes/

# The plan table lists the quotas to raise, so synth acknowledges their warnings (quotas_listed) instead of
# printing them again; the CLI's "Supply a stack id" line is left out (the templates' path follows).
CDK_SYNTH := --no-notices -q -o cdk.out -c quotas_listed=true
synth: $(SYNTH_STAMP) $(NODE_STAMP)
	$(VENV)/bin/tiered-training plan recipes/
	@echo "cdk synth $(CDK_SYNTH)"
	@set -o pipefail; cdk synth $(CDK_SYNTH) 2>&1 | grep -v '^Supply a stack id'
	@echo "templates: $(CURDIR)/cdk.out/TieredTraining-*.template.json"

# Two pytest-xdist workers share the CPUs: a module (or tests/constructs) is one unit, heaviest first
# (tests/conftest.py). TEST_WORKERS=0 runs in one process.
# make lint runs beside the tests, its output shown after theirs: on a fresh clone mypy spends about 90 s
# of one CPU with no cache, which before left the other CPU idle. Either failing fails make test.
TEST_WORKERS ?= 2
test: $(TEST_STAMP) $(NODE_STAMP)
	@lint_log=$$(mktemp); $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) lint >$$lint_log 2>&1 & lint=$$!; \
	echo "make lint: running beside the tests"; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder; tests=$$?; \
	wait $$lint; linted=$$?; cat $$lint_log; rm -f $$lint_log; \
	if [ $$linted -ne 0 ]; then echo "make lint failed" >&2; exit $$linted; fi; exit $$tests

# What `tiered-training rehearse` needs beyond make synth (torch, transformers, moto): make test's install, no tests.
rehearse-deps: $(TEST_STAMP)

# The layers (import-linter's contracts), lint and types, as configured in pyproject.toml.
lint: $(TEST_STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The float comparisons with derived tolerances, with 1 and 2 threads per worker and on a single CPU:
# each must hold on any machine, not only on the one where it was written.
FRAGILE := tests/trainer/test_context_parallel.py tests/trainer/test_init_checkpoint.py tests/trainer/test_init_checkpoint_loss.py tests/trainer/test_model.py \
	tests/trainer/test_float8.py tests/trainer/test_compile.py \
	"tests/trainer/test_multiprocess.py::test_checkpointing_does_not_change_the_math" \
	"tests/trainer/test_multiprocess.py::test_resume_on_another_world_keeps_the_global_batch_and_the_data"
determinism: $(TEST_STAMP)
	for threads in 1 2; do TT_TEST_THREADS=$$threads OMP_NUM_THREADS=$$threads $(PY) -m pytest -q $(FRAGILE) || exit 1; done
	TT_TEST_THREADS=2 OMP_NUM_THREADS=2 taskset -c 0 $(PY) -m pytest -q $(FRAGILE)

# The construct snapshots (tests/constructs/snapshots/), the reviewed plans (tests/golden/plans.json) and the calibration report (tests/golden/calibration.json):
# the test run only compares, this writes them.
snapshots: $(TEST_STAMP) $(NODE_STAMP)
	UPDATE_SNAPSHOTS=1 $(PY) -m pytest -q tests/constructs/test_templates.py -k test_snapshots
	UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/planning/test_plan_golden.py tests/planning/test_calibration.py

# Mutation testing of the pure-Python core (mutmut), one module at a time with its fast tests;
# prints the score per module and each surviving mutant. Not part of make test (it takes long).
# MODULES="perf memory" limits it; docs/mutation.md records the scores and the equivalent survivors.
mutation: $(TEST_STAMP)
	$(PY) scripts/mutation.py $(MODULES)

bench: $(TEST_STAMP) $(NODE_STAMP)
	$(PY) bench/plan_bench.py
	$(PY) bench/synth_bench.py
	$(PY) bench/rehearse_bench.py

# Where make test's CPU time goes, by process kind and test module, and the floor that the
# processes it starts set (their imports alone): runs the whole suite once, traced.
suite-cost: $(TEST_STAMP) $(NODE_STAMP)
	$(PY) bench/suite_cost.py

# Fit the performance model on the published runs (tiered_training/catalog/calibration.yaml)
# and the GPU-check results (bench/gpu/*.json); print predicted against published and the
# leave-one-source-out error (each source refitted without it: about 5 minutes on one CPU);
# store the fitted parameters and those errors in tiered_training/catalog/performance.yaml,
# and the leave-one-source-out table in bench/calibration_loso.json.
calibrate: $(SYNTH_STAMP)
	$(PY) -m tiered_training.planning.calibration --write --json bench/calibration_loso.json

# The planner's memory model against the peak of a real 2-rank trainer step, per checkpointing mode.
memory-bench: $(TEST_STAMP)
	$(PY) bench/memory_peak.py

# Wheels the GPU machine's image lacks (Python 3.12, x86_64), carried in .whl/ (ignored by git);
# pydantic-core for Python 3.11 too, for the CPU smoke below.
GPU_WHEELS := pydantic==2.14.3 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
	torchdata==0.11.0 torchao==0.17.0
PIP_DOWNLOAD := $(PY) -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform any -d .whl
gpu-wheels: $(SYNTH_STAMP)
	mkdir -p .whl
	$(PIP_DOWNLOAD) --python-version 3.12 $(GPU_WHEELS) pydantic-core==2.50.4
	$(PIP_DOWNLOAD) --python-version 3.11 pydantic-core==2.50.4
	@du -sh .whl

# training/tools/gpu_check.sh --cpu-smoke in a clean venv that stands in for the GPU image: CPU torch
# (2.13.0: no CPU build of 2.11 can be had here), transformers 5.17, and only the carried wheels.
SMOKE_VENV ?= /tmp/tt-gpu-smoke
SMOKE_PYTHON ?= python3.11
gpu-smoke: gpu-wheels
	rm -rf $(SMOKE_VENV) && $(SMOKE_PYTHON) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/python -m pip install --quiet torch==2.13.0 "transformers==5.17.*"
	@# The image has no pydantic (its typer predates typer's pydantic dependency): neither does this venv.
	$(SMOKE_VENV)/bin/python -m pip uninstall --quiet -y pydantic pydantic-core annotated-types typing-inspection
	! $(SMOKE_VENV)/bin/python -c "import pydantic" 2>/dev/null
	env -u PYTHONPATH PYTHON=$(SMOKE_VENV)/bin/python bash training/tools/gpu_check.sh --cpu-smoke --out $(SMOKE_VENV)/gpu_check.json

# Log Docker in to the base image's ECR registry before `cdk deploy` builds the training image.
# The registry's account differs by region; it comes from tiered_training/catalog/base_images.yaml.
#   make image-login REGION=eu-south-1
# `make image REGION=...` also builds the image here (docker build), as cdk deploy would.
IMAGE_TAG ?= tiered-training
image-login:
	@test -n "$(REGION)" || { echo "usage: make image-login REGION=<aws region>" >&2; exit 2; }
	@set -o pipefail; registry=$$($(PY) -m tiered_training.catalog.images registry $(REGION)) || exit 2; \
	echo "docker login to $$registry"; \
	aws ecr get-login-password --region $(REGION) | docker login --username AWS --password-stdin $$registry

image: image-login
	docker build -f training/Dockerfile --build-arg BASE_IMAGE=$$($(PY) -m tiered_training.catalog.images uri $(REGION)) -t $(IMAGE_TAG) .

clean:
	rm -rf cdk.out bench/results .pytest_cache
