# Temper: `make run` trains a tiny policy on the embedded stack; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
PYTEST_ARGS ?=
# pytest-xdist workers for the test targets. Two by default: the suite's processes wait on
# one another (NATS, Docker, subprocesses starting up), so two workers on two cores finish in
# about three quarters of one process's time (measured, the whole suite). Tests sharing a heavy
# resource (the CPU SGLang server, the Docker engine) stay on one worker (tests/conftest.py
# GROUPS). TEST_WORKERS= (empty) runs one process.
TEST_WORKERS ?= 2
# Each worker's torch (and what it starts) runs one thread: two workers with a thread per
# core each spin-wait against each other and run slower than one process.
WORKERS := $(if $(TEST_WORKERS),-n $(TEST_WORKERS) --dist loadgroup)
WORKER_ENV := $(if $(TEST_WORKERS),OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1})

.PHONY: venv sglang-venv run test test-fast test-unit test-integration compose-test bench lint fixtures schema clean

venv: $(STAMP)

# A copy of the dependencies installed once outside the clone (deploy/venv/build.sh, keyed by
# a hash of pyproject.toml, the torch version and python's), plus this clone editable.
$(STAMP): pyproject.toml deploy/venv/build.sh
	PYTHON=$(PYTHON) deploy/venv/build.sh $(VENV) $(TORCH_VERSION)
	touch $@

# The CPU SGLang server's own venv, cached outside the clone by a hash of its inputs (a no-op
# once built): the generator's SGLang tests run against that real server.
sglang-venv:
	deploy/sglang-cpu/build.sh >/dev/null

# The embedded stack trains the tiny policy on single-digit addition and prints the reward
# per learner step; it stops after TRAIN_MINUTES (Ctrl-C stops it earlier).
TRAIN_MINUTES ?= 10
run: venv
	$(BIN)/temper train --minutes $(TRAIN_MINUTES)

# The SGLang venv and the images build in the background (deploy/prebuild.sh: cached, so
# seconds once built) while the venv builds and the first tests run; a test that needs one
# sooner waits on its builder's lock.  pytest exits 5 when it collected nothing: a suite
# that tests nothing is a failure.
PREBUILD_LOG ?= .prebuild.log
test:
	@deploy/prebuild.sh $(PREBUILD_LOG) & prebuild=$$!; \
	$(MAKE) --no-print-directory venv \
	  && $(WORKER_ENV) $(BIN)/python -m pytest $(WORKERS) --durations=20 $(PYTEST_ARGS); \
	status=$$?; \
	wait $$prebuild || echo "make test: a background build failed (see $(PREBUILD_LOG))" >&2; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status

# The unit tier: no process, no server (tests/unit/conftest.py refuses them); minutes, not tens.
test-fast: venv
	$(BIN)/python -m pytest $(WORKERS) tests/unit --durations=20 $(PYTEST_ARGS)

test-unit: test-fast

test-integration: venv
	$(BIN)/python -m pytest $(WORKERS) tests/integration $(PYTEST_ARGS)

# The compose stack with host networking, end to end (deploy/compose/test.py): the offline
# image (cached), up, tasks until a policy update, two validators and two sandbox services,
# then down leaving nothing.  tests/integration/test_compose.py runs the same under `make test`.
compose-test: venv
	$(BIN)/python deploy/compose/test.py

bench: venv
	@for script in bench/bench_*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; echo; done

lint: venv
	$(BIN)/ruff check protocol services tests bench examples
	$(BIN)/ruff format --check protocol services tests bench examples
	$(BIN)/mypy

fixtures: venv
	$(BIN)/python tests/golden/make_fixtures.py

# docs/protocol.schema.json from protocol/messages.py (a unit test fails when it is stale).
schema: venv
	$(BIN)/python tests/golden/make_schema.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
