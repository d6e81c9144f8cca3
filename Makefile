# The two commands users need: `make demo` and `make test` (see README.md).
# Everything installs itself: a venv with the Python deps, Go modules, the cached
# control-plane build (~/.cache/warmwatch), the Go test client.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO_DIR ?= /tmp/warmwatch-demo

.PHONY: test lint unit e2e demo demo-down binaries image clean lock

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

binaries: $(VENV)/.installed
	$(PY) -m loadtest.cluster build

# The sidecar's image, localhost/warmwatch:dev, with podman (docker where its daemon runs),
# on a Debian base built here (cached) unless PYTHON_IMAGE names one, e.g.
# `make image PYTHON_IMAGE=python:3.11-slim-bookworm` where a registry is reachable.
image: $(VENV)/.installed
	$(PY) -m loadtest.images warmwatch $(if $(PYTHON_IMAGE),--python-image $(PYTHON_IMAGE))

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	cd tests/goclient && go vet ./... && go test ./...
	cd tests/crmanager && go vet ./... && go test ./...
	cd loadtest/fanoutwatch && go vet ./... && go test ./...

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit

e2e: binaries
	$(PY) -m pytest tests/e2e

# The test command: lint, unit tests, then the end-to-end suite against a real control plane.
test: lint binaries
	$(PY) -m pytest tests

demo: binaries
	$(PY) -m loadtest.demo --dir $(DEMO_DIR)

demo-down: $(VENV)/.installed
	$(PY) -m loadtest.cluster down --dir $(DEMO_DIR)

# requirements.lock: the runtime dependencies resolved from pyproject.toml in a clean venv,
# pinned for the Dockerfile.
LOCK_VENV := /tmp/warmwatch-lock-venv
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet .
	{ sed -n '1,3p' requirements.lock; $(LOCK_VENV)/bin/pip freeze --exclude warmwatch \
	  | sed 's/^uvloop==\(.*\)$$/uvloop==\1 ; sys_platform != "win32"/'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock
	rm -rf $(LOCK_VENV)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
