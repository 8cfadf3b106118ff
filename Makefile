# The two commands a newcomer needs are `make run` and `make test`.
# Everything installs into .venv from the project's own files; the control
# plane's binaries are built from Go modules into ~/.cache/gpuclaimctl once.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run run-clean test install controlplane lint typecheck chart-schema bench bench-workqueue \
        bench-informers bench-placement bench-controller bench-http bench-handoffs bench-watch clean

# The runtime dependencies at the exact versions the image ships
# (deploy/requirements.txt), then the project and its test tools.
$(STAMP): setup.cfg deploy/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r deploy/requirements.txt
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

controlplane: $(STAMP)
	$(PY) -m gpuclaimctl.controlplane build

# The local cluster is kept across runs (~/.cache/gpuclaimctl/local);
# run-clean wipes it and starts a fresh one.
run: controlplane
	$(VENV)/bin/gpuclaimctl run --local

run-clean: controlplane
	$(VENV)/bin/gpuclaimctl run --local --fresh

test: controlplane
	$(PY) -m pytest $(PYTEST_ARGS)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy gpuclaimctl informers workqueue metrics

lint: $(STAMP)
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy gpuclaimctl informers workqueue metrics

# The chart's `flags` schema and _flags.tpl, from `gpuclaimctl run`'s options;
# tests/test_chart.py fails until this is run after an option changes.
chart-schema: $(STAMP)
	$(PY) -m gpuclaimctl.cmd.chartschema

bench: bench-workqueue bench-placement bench-handoffs bench-watch bench-http bench-informers bench-controller

bench-workqueue: $(STAMP)
	$(PY) -m benchmarks.workqueue_bench

# Builds its client-go reference (benchmarks/go/informer) itself, first.
bench-informers: controlplane
	$(PY) -m benchmarks.informer_bench $(BENCH_INFORMERS_ARGS)

bench-http: controlplane
	$(PY) -m benchmarks.http_bench $(BENCH_HTTP_ARGS)

bench-handoffs: $(STAMP)
	$(PY) -m benchmarks.handoff_bench

bench-watch: controlplane
	$(PY) -m benchmarks.watch_floor_bench $(BENCH_WATCH_ARGS)

bench-placement: $(STAMP)
	$(PY) -m benchmarks.placement_bench

# BENCH_CONTROLLER_ARGS="--pods 100 --nodes 10" for a quick run; --help lists the rest.
bench-controller: controlplane
	$(PY) -m benchmarks.controller_bench $(BENCH_CONTROLLER_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
	$(PY) -m benchmarks.preempt_bench
