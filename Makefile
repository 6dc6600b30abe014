# gpuhealth — see README.md. `make test` does all set-up from a fresh machine.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: all venv system-deps kube-bins lint typecheck unit integration test demo bench clean

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

system-deps:
	@bash hack/system-deps.sh

kube-bins:
	@bash hack/kube-binaries.sh >/dev/null

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

unit: venv
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

integration: venv system-deps kube-bins
	GPUHEALTH_ASSETS="$$(bash hack/kube-binaries.sh)" $(PY) -m pytest -q tests/integration $(PYTEST_ARGS)

test: venv system-deps kube-bins lint typecheck unit integration

demo: venv kube-bins
	GPUHEALTH_ASSETS="$$(bash hack/kube-binaries.sh)" $(PY) -m demo

bench: venv kube-bins
	GPUHEALTH_ASSETS="$$(bash hack/kube-binaries.sh)" $(PY) -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
