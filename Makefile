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

.PHONY: synth test plan bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch is pinned first so that no other package pulls a CUDA build.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[cdk,train,dev,plot]"
	touch $(STAMP)

$(NODE_STAMP): package.json
	@if [ -f package.json ]; then npm install --no-audit --no-fund --loglevel=error; fi
	@mkdir -p node_modules && touch $(NODE_STAMP)

plan: $(STAMP)
	$(VENV)/bin/tiered-training plan recipes/

synth: $(STAMP) $(NODE_STAMP)
	$(VENV)/bin/tiered-training plan recipes/

test: $(STAMP) $(NODE_STAMP)
	$(PY) -m pytest

bench: $(STAMP) $(NODE_STAMP)
	$(PY) bench/plan_bench.py

clean:
	rm -rf cdk.out bench/results .pytest_cache
