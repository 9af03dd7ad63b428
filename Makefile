# The two commands: `make demo` (the main job) and `make test`. Both set themselves up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test check setup lint soak bench bench-slurm bench-detection bench-webhook-storm bench-storm bench-fleet-state bench-kube bench-simulate histories k8s stop clean

$(STAMP): pyproject.toml infra/setup.sh
	@bash infra/setup.sh
	@touch $(STAMP)

setup: $(STAMP)

# make demo [SLURM=22.05|24.11|26.05] [BACKEND=cli|rest] [K8S=0] [TEMPORAL=dev|cluster]
SLURM ?= 26.05
BACKEND ?= cli
K8S ?= 1
TEMPORAL ?= dev
demo: $(STAMP)
	$(PY) -m infra.sandbox.demo --slurm $(SLURM) --backend $(BACKEND) --temporal $(TEMPORAL) \
	  $(if $(filter 0,$(K8S)),--no-k8s,)

# The sandbox's builds (Kubernetes, the Temporal cluster, the newer Slurm roots) go beside the
# tests that need none of them; then the rest (infra/test.sh).
test: $(STAMP) lint
	bash infra/test.sh

# The inner loop: lint, then every test that needs no daemon (unit, property, time-skipping
# workflow tests), spread over processes: their time is mostly waiting on the test server.
check: $(STAMP) lint
	$(VENV)/bin/pytest -m "not integration" -n 4 -q

# ruff (lint + format), mypy (strict), the import contracts (pyproject.toml: the floors),
# shellcheck over infra's scripts, and the docs site built strictly (a broken link fails)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/shellcheck -x $$(git ls-files '*.sh' 2>/dev/null || find infra tests -name '*.sh')
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q --site-dir .run/site

# The chaos soak: `make soak [MINUTES=60] [SEED=1]` (infra/soak; docs/tests-and-benchmarks.md)
MINUTES ?= 60
SEED ?= 1
soak: $(STAMP)
	bash infra/k8s/build.sh
	$(PY) -m infra.soak --minutes $(MINUTES) --seed $(SEED) $(SOAK_ARGS)

bench: $(STAMP)
	$(PY) -m bench.mttr $(BENCH_ARGS)

bench-slurm: $(STAMP)
	$(PY) -m bench.slurm $(BENCH_ARGS)

bench-detection: $(STAMP)
	$(PY) -m bench.detection $(BENCH_ARGS)

# 1,000 nodes' alerts through Alertmanager to one webhook process: bench/results/webhook-storm.md
bench-webhook-storm: $(STAMP)
	$(PY) -m bench.webhook_storm $(BENCH_ARGS)

# The coordinator's state in a 10,000-node fleet's worst week: bench/results/fleet-state.md
bench-fleet-state: $(STAMP)
	$(PY) -m bench.fleet_state $(BENCH_ARGS)

# 1,000 failure reports against the cluster's coordinator (budget 5%): bench/results/storm.md
bench-storm: $(STAMP)
	$(PY) -m bench.storm $(BENCH_ARGS)

# cordon + taint for 1,000 incidents on a kwok cluster of 10,000 Nodes: bench/results/kube.md
bench-kube: $(STAMP)
	bash infra/k8s/build.sh
	$(PY) -m bench.kube $(BENCH_ARGS)

# gpuheal simulate's engine over traces from Llama 3's published failures, with `make bench`'s
# timings (bench/results/mttr.json): bench/results/simulate.md and goodput.svg
bench-simulate: $(STAMP)
	$(PY) -m bench.simulate $(BENCH_ARGS)

# Record tests/histories anew from real runs (after a change meant to be incompatible), and the
# coordinator's paths from its time-skipping tests (tests/histories/recording.py).
histories: $(STAMP)
	bash infra/k8s/build.sh
	$(PY) -m tests.histories.record
	GPUHEAL_RECORD_HISTORIES=tests/histories/coordinator/$$(git rev-parse --short HEAD) $(PY) -m pytest -q \
	  tests/test_coordinator_faults.py tests/test_coordinator_books.py tests/test_coordinator_carry.py \
	  tests/test_coordinator_queue.py

k8s: $(STAMP)
	bash infra/k8s/build.sh

stop:
	-@[ -x $(PY) ] && $(PY) -m infra.sandbox.stack stop .run
	-@GPUHEAL_K8S_DIR=.run/k8s infra/k8s/cluster.sh stop
	-@GPUHEAL_SLURM_DIR=.run/slurm infra/slurm/sandbox.sh stop
	-@for v in 24.11 26.05; do [ -d .run/slurm-$$v ] && GPUHEAL_SLURM_DIR=.run/slurm-$$v \
	  GPUHEAL_SLURM_ROOT=$$(infra/slurm/roots.sh path $$v) infra/slurm/sandbox.sh stop; done; true
	-@GPUHEAL_TEMPORAL_DIR=.run/temporal infra/temporal/dev-server.sh stop
	-@GPUHEAL_TEMPORAL_DIR=.run/temporal-cluster infra/temporal/cluster/cluster.sh stop

clean: stop
	rm -rf .run
