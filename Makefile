# gpuhealth — see README.md. `make test` does all set-up from a fresh machine.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_PATH := $(VENV)/.dev-path
PYTEST_ARGS ?=

.PHONY: all venv system-deps kube-bins node-bins lint typecheck unit integration image e2e test demo bench clean

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

# The development tooling (localkube, demo, bench; not in the wheel) on the venv's path, from any
# directory: a .pth names the repository root, where the product is not (it is in src/gpuhealth/).
$(DEV_PATH): $(STAMP)
	$(PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "gpuhealth-dev.pth").write_text(sys.argv[1] + "\n")' "$(CURDIR)"
	touch $@

venv: $(STAMP) $(DEV_PATH)

system-deps:
	@PYTHON=$(PYTHON) bash hack/system-deps.sh

kube-bins:
	@bash hack/kube-binaries.sh >/dev/null

# kubelet, kube-proxy, kube-controller-manager and CoreDNS for the real node of `make e2e`.
node-bins:
	@bash hack/kube-binaries.sh --node >/dev/null

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

unit: venv
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

# The node binaries too: kube-controller-manager computes PodDisruptionBudget status for the
# remediation tests (building needs no root; under CI=true a missing one fails the run).
integration: venv system-deps node-bins
	GPUHEALTH_ASSETS="$$(bash hack/kube-binaries.sh --node)" $(PY) -m pytest -q tests/integration $(PYTEST_ARGS)

# The container image (both entry points) as an OCI archive, without a daemon: dist/.
image: venv system-deps
	bash hack/image/build.sh

# The real-node suite: the image and the Helm chart on containerd + kubelet. It needs root;
# without it the suite skips (and fails under CI=true), so the image is built only as root.
e2e: venv system-deps kube-bins
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory node-bins image; fi
	GPUHEALTH_ASSETS="$$(bash hack/kube-binaries.sh $$([ "$$(id -u)" = 0 ] && echo --node))" \
	GPUHEALTH_IMAGE_ARCHIVE="$(CURDIR)/dist/gpuhealth-image.tar" \
	$(PY) -m pytest -q tests/e2e $(PYTEST_ARGS)

# system-deps first: on a fresh machine it installs what `make venv` needs (python3-venv).
test: system-deps venv kube-bins lint typecheck unit integration e2e

# REAL_NODE=1: the same scenario with its first node a real containerd + kubelet node
# (localkube's node harness; needs root and hack/system-deps.sh's packages).
REAL_NODE ?=
demo: venv kube-bins $(if $(REAL_NODE),system-deps node-bins)
	GPUHEALTH_ASSETS="$$(bash hack/kube-binaries.sh $(if $(REAL_NODE),--node))" \
	$(PY) -m demo $(if $(REAL_NODE),--real-node)

bench: venv kube-bins
	GPUHEALTH_ASSETS="$$(bash hack/kube-binaries.sh)" $(PY) -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
