# The few commands people run. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The one version: pyproject.toml's. The image tag and deploy/ follow it (a test checks).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE   ?= ghcr.io/stackship/convergerd

.PHONY: install demo test lint typecheck unit bench bench-rounds bench-daemon soak sim image dist clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)  ## the package and its development tools, in .venv

demo: install  ## simulated fleet + database + daemon, on the embedded default
	$(BIN)/convergerd demo

sim: install  ## just the fleet simulator (50 clusters) with a kubeconfig in .demo/
	$(BIN)/convergerd sim --clusters 50 --listen 127.0.0.1:8181 --kubeconfig-out .demo/sim-kubeconfig

lint: install  ## ruff, and the layers (import-linter contracts in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

typecheck: install
	$(BIN)/mypy

test: install  ## lint, types, then the whole suite (real PostgreSQL, simulator, kubectl, promtool)
	bash .ci/install-tools
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(BIN)/pytest -q -n 2 --dist worksteal --durations=30

unit: install  ## the fast part: pure code only
	$(BIN)/pytest -q tests/unit

# Up to 10,000 clusters x 100 policies: about 45 minutes on 2 cores. The long interval only
# lifts the round deadline, so the first round at 1,000,000 objects is measured whole.
BENCH_ARGS ?= --clusters 10,100,1000,10000 --policies 10,100 --interval-minutes 120
# The whole daemon (`convergerd run`, needs PostgreSQL): 2,000 x 50 at the 45 s interval the
# issue measured, and 10,000 x 100 at an interval its in-sync round fits in (engine: ~54 s).
# Daemon settings are its defaults (add e.g. --env CONVERGERD_PROBE_PERIOD_SECONDS=20). Each of
# the --points ends with 20 rollouts in progress (issue 37: gate CPU, rounds and memory with them).
DAEMON_BENCH_ARGS ?= --points 2000x50@45,10000x100@180 --save-points 5000,10000 --rollouts 20
bench: bench-rounds bench-daemon  ## benchmark figures (not a test): the round engine, then the whole daemon

bench-rounds: install  ## the round engine: up to 10,000 clusters x 100 policies
	$(BIN)/python bench/rounds.py $(BENCH_ARGS)

bench-daemon: install  ## `convergerd run` as deployed: rounds, rows and WAL in PostgreSQL, /status, detection, saves
	$(BIN)/python bench/daemon.py $(DAEMON_BENCH_ARGS)

soak: install  ## resources over 30 faulty rounds, 200 clusters (needs PostgreSQL; see bench/README.md)
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

image: install  ## the container image $(IMAGE):$(VERSION) (podman; no registry needed, see README)
	bash .ci/install-tools image
	IMAGE=$(IMAGE) VERSION=$(VERSION) PYTHON=$(BIN)/python bash .ci/build-image

dist: install  ## wheel and sdist in dist/
	$(BIN)/python -m build --outdir dist .

clean:
	rm -rf $(VENV) .demo .mypy_cache .ruff_cache .pytest_cache *.egg-info build dist
