# Two entry points (see README): `make demo` runs the system, `make test` runs every check.
# `make check` is the fast tier: lint, types and every test that needs no server (no Java,
# no PostgreSQL), for a contributor's edit-test loop.
# Both install what they need first: Debian packages (scripts/install-system-deps.sh) and a
# virtualenv with the project (.venv).

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Two workers, one test file each at a time (module fixtures stay whole); each worker runs its
# own ZooKeeper and PostgreSQL (tests/fixtures/cluster.py). PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2

.PHONY: all demo test check lint unit system-deps test-deps venv releases clean schema-snapshot

all: test

system-deps:
	@bash scripts/install-system-deps.sh

test-deps:
	@bash scripts/install-system-deps.sh --tests

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# Up to 0.1.0 the distribution was called `allocator`; it owns the same import package.
	@if $(BIN)/pip show -q allocator >/dev/null 2>&1; then $(BIN)/pip uninstall -q -y allocator; fi
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

lint: venv
	$(BIN)/ruff check allocator jobs migrations tests
	$(BIN)/ruff format --check allocator jobs migrations tests
	$(BIN)/mypy --strict allocator jobs
	@# The fakes are held to the ports by type too: FakeStore must satisfy NodeStore and LeaderStore.
	$(BIN)/mypy --strict tests/fakes tests/contract

# The earlier release the rolling-upgrade test runs (tests/chaos/release.py), in a virtualenv
# of its own under .cache/releases/ (not in git): built once (about a minute), then reused.
releases: venv
	$(BIN)/python -m tests.chaos.release

test: test-deps venv lint releases
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=20 $(PYTEST_ARGS)

# Tests that ask for the servers must be marked `integration` (tests/conftest.py refuses to
# collect them otherwise), so deselecting the marker leaves no server to start.
check: venv lint
	$(BIN)/pytest -n $(PYTEST_WORKERS) -m "not integration" $(PYTEST_ARGS)

unit: venv
	$(BIN)/pytest tests/unit -m "not integration" $(PYTEST_ARGS)

demo: system-deps venv
	$(BIN)/allocator demo

# migrations/schema.sql: the schema the migrations make, from a throwaway PostgreSQL server.
schema-snapshot: venv
	$(BIN)/python -m allocator.local.schema_snapshot

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .cache
