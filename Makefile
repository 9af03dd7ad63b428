# The two commands: `make demo` (the main job) and `make test`. Both set themselves up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test setup lint bench bench-detection histories k8s stop clean

$(STAMP): pyproject.toml
	@bash infra/setup.sh
	@touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m infra.sandbox.demo

test: $(STAMP) lint
	bash infra/k8s/build.sh
	$(VENV)/bin/pytest

# ruff (lint + format), mypy (strict), and the import contracts (pyproject.toml: the floors)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) -m bench.mttr $(BENCH_ARGS)

bench-detection: $(STAMP)
	$(PY) -m bench.detection $(BENCH_ARGS)

# Record tests/histories anew from real runs (after a change meant to be incompatible).
histories: $(STAMP)
	bash infra/k8s/build.sh
	$(PY) -m tests.histories.record

k8s: $(STAMP)
	bash infra/k8s/build.sh

stop:
	-@GPUHEAL_K8S_DIR=.run/k8s infra/k8s/cluster.sh stop
	-@GPUHEAL_SLURM_DIR=.run/slurm infra/slurm/sandbox.sh stop
	-@GPUHEAL_TEMPORAL_DIR=.run/temporal infra/temporal/dev-server.sh stop

clean: stop
	rm -rf .run
