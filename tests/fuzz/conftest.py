"""Fuzz tests: what every one of them needs (the hypothesis profile itself is loaded by
``tests/conftest.py`` for every test folder, see :mod:`tests.fuzz.profiles`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from allocator.core import redact


@pytest.fixture(autouse=True)
def _forget_fuzzed_secrets() -> Iterator[None]:
    """Loading a config registers its secret values with :mod:`allocator.core.redact` for the
    rest of the process; fuzzed "secrets" are any text, which must not mask what later
    tests print."""
    saved = getattr(redact, "_registered", None)
    yield
    if saved is not None:
        redact._registered = saved
