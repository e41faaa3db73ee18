# The two commands of the README: `make demo` and `make test`. Both set everything up first.
VENV ?= .venv
PY := $(VENV)/bin/python
# A local CPU wheel of torch, when the machine has one, spares the 3 GB CUDA build from PyPI.
WHEELS := $(wildcard /opt/wheels)
PIP_FLAGS := $(if $(WHEELS),--find-links $(WHEELS),)
# `make demo DURATION=120` stops the demo after 120 s; empty (the default) runs it until Ctrl-C.
DURATION ?=
# `make stress TEST=tests/integration/test_trainer.py::... N=20 LOAD=2`: the selection N times in
# a row, stopping at the first failure, while LOAD busy loops keep that many cores busy.
TEST ?=
N ?= 20
LOAD ?= 2

.PHONY: setup system-deps kafka-jars registry-dist lint test test-unit stress demo bench chaos clean

setup: system-deps $(VENV)/.installed kafka-jars

system-deps:
	@infra/install-system-deps.sh

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_FLAGS) -e '.[test]'
	touch $@

kafka-jars: $(VENV)/.installed
	@$(PY) -c "from streamtrain.infra.kafka_broker import ensure_kafka_jars; print('kafka jars:', ensure_kafka_jars())"

# The schema registry (for Avro topics) only the tests and `streamtrain up --registry` need.
registry-dist: $(VENV)/.installed
	@$(PY) -c "from streamtrain.infra.schema_registry import ensure_registry_dist; print('schema registry:', ensure_registry_dist())"

# ruff over everything Python (the packages, tests/, bench/); mypy over the packages, through
# tests/typecheck.py, which names each module as it installs (streamtrain.<folder>); both read
# their settings from pyproject.toml. Any finding fails the target.
lint: $(VENV)/.installed
	$(PY) -m ruff check
	$(PY) tests/typecheck.py

test: setup registry-dist lint
	$(PY) -m pytest

test-unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit

stress: setup
	@tests/stress.sh "$(N)" "$(LOAD)" $(TEST)

# `make bench BENCH_ARGS="--records 200000"`: the end-to-end bench (bench/e2e.py), whole jobs
# against the bare PyTorch loop on the same records.
BENCH_ARGS ?=
bench: setup
	$(PY) -m bench.e2e $(BENCH_ARGS)

# `make chaos CHAOS_ARGS="--profile full"`: a job under kills, freezes and service restarts,
# checked by ledger, with recovery times (bench/chaos.py); the CI profile by default.
CHAOS_ARGS ?=
chaos: setup
	$(PY) -m bench.chaos $(CHAOS_ARGS)

demo: setup
	$(VENV)/bin/streamtrain demo $(if $(DURATION),--duration $(DURATION),)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
