# One entry point for people, CI and hooks.
# The venv's interpreter: Debian's python3.11 where it has venv, else python3. Debian builds it
# with PGO and LTO and links it statically, as the image's python:3.11-slim is optimised; a
# default pyenv build is neither, and its API used 17 % more CPU a job (docs/benchmarks.md).
PYTHON ?= $(shell /usr/bin/python3.11 -c 'import ensurepip' 2>/dev/null && echo /usr/bin/python3.11 || echo python3)
VENV ?= .venv
BIN := $(VENV)/bin
LOCAL_PG ?= postgresql+psycopg://postgres@127.0.0.1:5432/postgres
LOCAL_REDIS ?= redis://127.0.0.1:6379/0

# The locks pin every dependency (and the build backend) with hashes, for any platform from
# Python 3.11: requirements.lock for images, requirements-dev.lock for people and CI.
LOCK = $(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command "make lock" pyproject.toml --group build $(LOCK_ARGS)

.PHONY: setup lock demo test lint docs unit e2e chaos cluster bench bench-fanout bench-memory bench-soak \
	bench-peers bench-peers-lock bench-capacity clean

$(BIN)/flowbeat: pyproject.toml requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --require-hashes -r requirements-dev.lock
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(BIN)/flowbeat

lock: setup
	$(LOCK) -o requirements.lock
	$(LOCK) --extra dev -o requirements-dev.lock

demo: setup
	env -u FLOWBEAT_DATABASE_URL -u FLOWBEAT_BROKER_URL $(BIN)/flowbeat run papers-digest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The reference pages from the code (settings, CLI, REST API, metrics), then the site into site/;
# --strict fails on a broken link or anchor, or a page left out of the nav.
docs: setup
	$(BIN)/python -m scripts.gen_reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The tiers, chosen by marker (tests/conftest.py marks each test by its folder): unit runs no
# processes (in-process API, engine, tasks and scheduler on PostgreSQL and Redis, under two
# minutes); e2e starts real workers, beat, the API and the CLI; chaos kills and restarts them.
# ARGS goes to pytest: make unit ARGS="--durations=20 tests/api".
PYTEST = FLOWBEAT_TEST_DATABASE_URL=$${FLOWBEAT_TEST_DATABASE_URL:-$(LOCAL_PG)} \
	FLOWBEAT_TEST_REDIS_URL=$${FLOWBEAT_TEST_REDIS_URL:-$(LOCAL_REDIS)} \
	$(BIN)/python -m pytest -q -p no:cacheprovider $(ARGS)

# The suite starts about 500 processes that import flowbeat; where the environment sets
# PYTHONDONTWRITEBYTECODE (this VM's does), each compiles flowbeat's modules from source again,
# about 0.1 s of CPU for an API and a worker. Python reads an empty value as unset.
test unit e2e chaos cluster: export PYTHONDONTWRITEBYTECODE :=

# Test processes (pytest-xdist). The e2e and chaos tests mostly wait on the processes they start,
# so three keep two cores busy: make test's pytest took 8.5 min with three, 12 with two. Four
# lost timing drills on a loaded machine. The unit tier is CPU-bound. Each test process holds
# one of the server's 15 free Redis DB numbers while it runs.
WORKERS ?= 3
UNIT_WORKERS ?= 2

# Every tier but cluster in one run, so the workers stay busy to the end, with lint and the
# docs site built beside it: the suite leaves about a quarter of the two cores idle, waiting on
# the processes it starts, and lint and docs fit in it. Their output follows the tests', and
# either failing fails the target. The cluster tier needs root and takes minutes alone: make
# cluster.
test: setup
	@$(MAKE) --no-print-directory lint docs > .checks.log 2>&1 & checks=$$!; \
	$(PYTEST) -n $(WORKERS) --dist worksteal --durations=20 -m "not cluster"; tests=$$?; \
	wait $$checks; lint=$$?; cat .checks.log; rm -f .checks.log; \
	[ $$lint -eq 0 ] || echo "make test: lint or the docs site failed"; \
	[ $$tests -eq 0 ] && [ $$lint -eq 0 ]

unit: setup
	$(PYTEST) -n $(UNIT_WORKERS) -m unit

e2e: setup
	$(PYTEST) -n $(WORKERS) --dist worksteal -m e2e

# The chaos scenarios at the reduced scale `make test` runs them at; FULL=1 runs them at full
# scale (about half an hour) and writes their rows into docs/guarantees.md's table.
chaos: setup
ifeq ($(FULL),1)
	rm -f .chaos.jsonl
	FLOWBEAT_CHAOS_SCALE=full FLOWBEAT_CHAOS_RESULTS=.chaos.jsonl $(PYTEST) -m chaos tests/chaos
	$(BIN)/python -m tests.chaos.report .chaos.jsonl docs/guarantees.md
else
	$(PYTEST) -n 2 -m chaos tests/chaos
endif

# Hosts in network namespaces, as root (docs/cluster-drills.md): one cluster, its scenarios in
# turn, their rows written into that page's table.
cluster: setup
	rm -f .cluster.jsonl
	FLOWBEAT_CLUSTER_RESULTS=.cluster.jsonl $(PYTEST) -m cluster tests/cluster
	$(BIN)/python -m tests.cluster.results .cluster.jsonl docs/cluster-drills.md

bench: setup
	$(BIN)/python -m bench.chain_throughput --jobs 1000 --rounds 5

bench-fanout: setup
	$(BIN)/python -m bench.fanout --items 10000

bench-memory: setup
	$(BIN)/python -m bench.worker_memory --steps 100000

# What a step costs PostgreSQL and Redis, on a cluster and a server of its own, and the steps/s a
# PostgreSQL of 2, 8 and 32 cores carries (docs/capacity.md).
bench-capacity: setup
	$(BIN)/python -m bench.capacity --jobs 2000 --rounds 2

# An hour at 28 jobs/s (100,000 jobs): samples, summary and plot go to bench/soak/.
bench-soak: setup
	$(BIN)/python -m bench.soak --minutes 62 --out bench/soak

# flowbeat beside raw Celery, Dramatiq, Procrastinate and Prefect 3 (docs/peers.md). The peers
# live in their own venv from their own lock, never in CI's install: Prefect pins libraries
# that flowbeat's locks pin otherwise. 38 minutes at this scale on two busy shared cores.
PEERS_VENV := .venv-peers
PEERS_LOCK := bench/peers/requirements.lock

$(PEERS_VENV)/bin/prefect: $(PEERS_LOCK)
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q --upgrade pip
	$(PEERS_VENV)/bin/pip install -q --require-hashes -r $(PEERS_LOCK)
	touch $@

bench-peers: setup $(PEERS_VENV)/bin/prefect
	$(BIN)/python -m bench.peers --chains 1000 --fanout 10000 --rounds 3 $(ARGS)

bench-peers-lock: setup
	$(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
		--custom-compile-command "make bench-peers-lock" bench/peers/requirements.in -o $(PEERS_LOCK)

clean:
	if [ -x $(BIN)/flowbeat ]; then FLOWBEAT_DATA_DIR=.flowbeat $(BIN)/flowbeat stop; fi
	rm -rf $(VENV) $(PEERS_VENV) .flowbeat .mypy_cache .ruff_cache .pytest_cache .hypothesis .chaos.jsonl .cluster.jsonl site
