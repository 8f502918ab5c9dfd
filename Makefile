# Two commands on a fresh machine:
#   make synth   install everything, then synthesise every recipe offline (no AWS account)
#   make test    install everything, then run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: synth test snapshots mutation plan bench calibrate memory-bench gpu-wheels gpu-smoke clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# pyproject.toml declares version ranges; constraints.txt pins the versions CI verified.
# torch is installed first so that no other package pulls a CUDA build.
CONSTRAINTS := constraints.txt
$(STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) torch==2.13.0
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[cdk,train,dev,plot]"
	touch $(STAMP)

# The pinned CDK CLI, and Node 22 (jsii warns on older Node); node_modules/.bin is first on PATH.
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $(NODE_STAMP)

plan: $(STAMP)
	$(VENV)/bin/tiered-training plan recipes/

synth: $(STAMP) $(NODE_STAMP)
	$(VENV)/bin/tiered-training plan recipes/
	cdk synth --no-notices -q -o cdk.out
	@echo "templates: $(CURDIR)/cdk.out/TieredTraining-*.template.json"

test: $(STAMP) $(NODE_STAMP)
	$(PY) -m pytest

# The construct snapshots (tests/constructs/snapshots/): the test run only compares, this writes them.
snapshots: $(STAMP) $(NODE_STAMP)
	UPDATE_SNAPSHOTS=1 $(PY) -m pytest -q tests/constructs/test_templates.py -k test_snapshots

# Mutation testing of the pure-Python core (mutmut), one module at a time with its fast tests;
# prints the score per module and each surviving mutant. Not part of make test (it takes long).
# MODULES="perf memory" limits it; docs/mutation.md records the scores and the equivalent survivors.
mutation: $(STAMP)
	$(PY) scripts/mutation.py $(MODULES)

bench: $(STAMP) $(NODE_STAMP)
	$(PY) bench/plan_bench.py
	$(PY) bench/synth_bench.py
	$(PY) bench/rehearse_bench.py

# Fit the performance model on the published runs (tiered_training/catalog/calibration.yaml)
# and the GPU-check results (bench/gpu/*.json); print predicted against published and the
# held-out error; store the fitted parameters in tiered_training/catalog/performance.yaml.
calibrate: $(STAMP)
	$(PY) -m tiered_training.calibration --write

# The planner's memory model against the peak of a real 2-rank trainer step, per checkpointing mode.
memory-bench: $(STAMP)
	$(PY) bench/memory_peak.py

# Wheels the GPU machine's image lacks (Python 3.12, x86_64), carried in .whl/ (ignored by git);
# pydantic-core for Python 3.11 too, for the CPU smoke below.
GPU_WHEELS := pydantic==2.14.3 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
	torchdata==0.11.0 torchao==0.17.0
PIP_DOWNLOAD := $(PY) -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform any -d .whl
gpu-wheels: $(STAMP)
	mkdir -p .whl
	$(PIP_DOWNLOAD) --python-version 3.12 $(GPU_WHEELS) pydantic-core==2.50.4
	$(PIP_DOWNLOAD) --python-version 3.11 pydantic-core==2.50.4
	@du -sh .whl

# training/gpu_check.sh --cpu-smoke in a clean venv that stands in for the GPU image: CPU torch
# (2.13.0: no CPU build of 2.11 can be had here), transformers 5.17, and only the carried wheels.
SMOKE_VENV ?= /tmp/tt-gpu-smoke
SMOKE_PYTHON ?= python3.11
gpu-smoke: gpu-wheels
	rm -rf $(SMOKE_VENV) && $(SMOKE_PYTHON) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/python -m pip install --quiet torch==2.13.0 "transformers==5.17.*"
	@# The image has no pydantic (its typer predates typer's pydantic dependency): neither does this venv.
	$(SMOKE_VENV)/bin/python -m pip uninstall --quiet -y pydantic pydantic-core annotated-types typing-inspection
	! $(SMOKE_VENV)/bin/python -c "import pydantic" 2>/dev/null
	env -u PYTHONPATH PYTHON=$(SMOKE_VENV)/bin/python bash training/gpu_check.sh --cpu-smoke --out $(SMOKE_VENV)/gpu_check.json

clean:
	rm -rf cdk.out bench/results .pytest_cache
