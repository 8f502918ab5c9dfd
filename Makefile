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

.PHONY: synth test plan bench calibrate clean

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

bench: $(STAMP) $(NODE_STAMP)
	$(PY) bench/plan_bench.py
	$(PY) bench/synth_bench.py

# Fit the performance model on the published runs (tiered_training/catalog/calibration.yaml)
# and the GPU-check results (bench/gpu/*.json); print predicted against published and the
# held-out error; store the fitted parameters in tiered_training/catalog/performance.yaml.
calibrate: $(STAMP)
	$(PY) -m tiered_training.calibration --write

clean:
	rm -rf cdk.out bench/results .pytest_cache
