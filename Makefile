# The two commands a newcomer needs are `make run` and `make test`.
# Everything installs into .venv from the project's own files; the control
# plane's binaries are built from Go modules into ~/.cache/gpuclaimctl once.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# The Kubernetes minor of the plane `make run` and `make test` start (1.35,
# 1.36, 1.37; empty: the newest). `make test-versions` proves the older ones.
K8S_VERSION ?=
OLDER_K8S_VERSIONS := 1.35 1.36
ifneq ($(K8S_VERSION),)
export GPUCLAIMCTL_K8S_VERSION := $(K8S_VERSION)
endif

.PHONY: run run-clean test test-versions install controlplane lint typecheck chart-schema bench bench-workqueue \
        bench-informers bench-placement bench-controller bench-http bench-handoffs bench-watch bench-scale clean

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

# The version-dependent real-plane stories (tests/versionstories.py) on each
# older supported minor, each on its own plane; builds only that minor's
# kube-apiserver, kube-scheduler and kube-controller-manager (once). Every
# minor runs even when one fails; the exit code says whether any did.
test-versions: $(STAMP)
	@failed=; for v in $(OLDER_K8S_VERSIONS); do \
	    echo "== Kubernetes $$v: the version stories"; start=$$(date +%s); \
	    if GPUCLAIMCTL_K8S_VERSION=$$v $(PY) -m gpuclaimctl.controlplane build >/dev/null && \
	       GPUCLAIMCTL_K8S_VERSION=$$v $(PY) -m pytest --version-stories $(PYTEST_ARGS); \
	    then echo "== Kubernetes $$v: passed in $$(( $$(date +%s) - start ))s"; \
	    else echo "== Kubernetes $$v: FAILED"; failed="$$failed $$v"; fi; \
	done; \
	if [ -n "$$failed" ]; then echo "test-versions failed on:$$failed"; exit 1; fi

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
	$(PY) -m benchmarks.preempt_bench
	$(PY) -m benchmarks.dra_bench

# BENCH_CONTROLLER_ARGS="--pods 100 --nodes 10" for a quick run; --help lists the rest.
bench-controller: controlplane
	$(PY) -m benchmarks.controller_bench $(BENCH_CONTROLLER_ARGS)

# The controller at 100, 1,000 and 5,000 kwok nodes, a fresh plane each (about
# 45 minutes on 2 cores); BENCH_SCALE_ARGS="--sizes 100,1000" for a shorter
# curve, --help for the rest.
bench-scale: controlplane
	$(PY) -m benchmarks.scale_bench $(BENCH_SCALE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
