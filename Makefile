# The two commands: `make demo` (the main job) and `make test`. Both set themselves up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test setup lint bench bench-detection k8s stop clean

$(STAMP): pyproject.toml
	@bash infra/setup.sh
	@touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpuheal demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	bash infra/k8s/build.sh
	$(VENV)/bin/pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/mttr.py $(BENCH_ARGS)

bench-detection: $(STAMP)
	$(PY) bench/detection.py $(BENCH_ARGS)

k8s: $(STAMP)
	bash infra/k8s/build.sh

stop:
	-@GPUHEAL_K8S_DIR=.run/k8s infra/k8s/cluster.sh stop
	-@GPUHEAL_SLURM_DIR=.run/slurm infra/slurm/sandbox.sh stop
	-@GPUHEAL_TEMPORAL_DIR=.run/temporal infra/temporal/dev-server.sh stop

clean: stop
	rm -rf .run
