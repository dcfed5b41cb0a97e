"""Fixture plugins shared by every test folder (servers start only when a test asks), the
``soak`` marker: long runs that only ``ALLOCATOR_SOAK=1`` enables (CI does not set it), and
the hypothesis profile (:mod:`tests.fuzz.profiles`: ``ci`` unless ``HYPOTHESIS_PROFILE``
says otherwise), loaded here so every property test runs under it, whichever runs first."""

from __future__ import annotations

import os

import pytest

from tests.fuzz import profiles

profiles.load()

pytest_plugins = [
    "tests.fixtures.cluster",
    "tests.fixtures.pg",
    "tests.fixtures.replication",
    "tests.fixtures.zk",
    "tests.fixtures.nodes",  # after the plugins it imports
    "tests.fixtures.artefacts",
]

SOAK_ENV = "ALLOCATOR_SOAK"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SOAK_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"soak test: set {SOAK_ENV}=1 to run it")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
