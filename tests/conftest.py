"""Fixture plugins shared by every test folder (servers start only when a test asks), the
``soak`` marker: long runs that only ``ALLOCATOR_SOAK=1`` enables (CI does not set it), and
the hypothesis profile (:mod:`tests.fuzz.profiles`: ``ci`` unless ``HYPOTHESIS_PROFILE``
says otherwise), loaded here so every property test runs under it, whichever runs first;
and the process's logging put back after every test (:func:`process_logging_restored`)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator

import pytest

from allocator.core import logs
from tests.fuzz import profiles

profiles.load()

pytest_plugins = [
    "tests.fixtures.cluster",
    "tests.fixtures.pg",
    "tests.fixtures.pg_versions",
    "tests.fixtures.pgbouncer",
    "tests.fixtures.replication",
    "tests.fixtures.zk",
    "tests.fixtures.nodes",  # after the plugins it imports
    "tests.fixtures.artefacts",
]

SOAK_ENV = "ALLOCATOR_SOAK"
SERVER_FIXTURES_MODULE = "tests.fixtures.cluster"
"""Where the session's ZooKeeper and PostgreSQL start: every server fixture depends on it."""


@pytest.fixture(autouse=True)
def process_logging_restored() -> Iterator[None]:
    """``allocator run`` invoked in this process (click's CliRunner) configures the process:
    the root logger's handlers, warnings routed to logging, the thread and unraisable hooks.
    Put them back after each test, or a later test in the same process (a pytest worker runs
    files in no fixed order) sees them: ``logging.captureWarnings(True)`` is a no-op while an
    earlier capture is still on, so that test's warnings never reach its own handler."""
    root = logging.getLogger()
    level, hooks = root.level, (threading.excepthook, sys.unraisablehook)
    yield
    logging.captureWarnings(False)
    for handler in root.handlers[:]:  # only those logs.configure made: pytest keeps its own
        if isinstance(handler.formatter, logs.RedactingFormatter | logs.JsonFormatter):
            root.removeHandler(handler)
    root.setLevel(level)
    threading.excepthook, sys.unraisablehook = hooks


def _starts_servers(item: pytest.Item) -> bool:
    """Whether the item's fixtures, followed through, reach the session's servers."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(  # the last definition of a name is the one in force (a test may override)
        definitions[-1].func.__module__ == SERVER_FIXTURES_MODULE
        for definitions in info.name2fixturedefs.values()
        if definitions
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if item.get_closest_marker("integration") is None and _starts_servers(item)
    ]
    if unmarked:
        # `make check` runs `-m "not integration"` and promises no servers: keep it true.
        raise pytest.UsageError(
            "these tests start the servers but are not marked integration: " + ", ".join(unmarked)
        )
    if os.environ.get(SOAK_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"soak test: set {SOAK_ENV}=1 to run it")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
