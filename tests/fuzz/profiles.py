"""Hypothesis profiles of the fuzz tests (issue 10: every input surface fuzzed).

Rules: the ``ci`` profile is loaded unless ``HYPOTHESIS_PROFILE`` names another
(``tests/conftest.py`` loads it for every test): derandomized (the same inputs on every run
and machine, no example database), no deadline (the machine is shared). ``deep``
(``HYPOTHESIS_PROFILE=deep``) is random, keeps failures in the example database and tries
:data:`DEEP_FACTOR` times as many inputs. Every test states its own input count as
``@settings(max_examples=examples(N))``: N is what ``ci`` (and so ``make test``) tries.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "ci"
DEEP_FACTOR = 20

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.register_profile(
    "deep",
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)


def load() -> None:
    """Load the profile ``HYPOTHESIS_PROFILE`` names (default ``ci``)."""
    settings.load_profile(os.environ.get(PROFILE_ENV, DEFAULT_PROFILE))


def examples(count: int) -> int:
    """``count`` inputs under ``ci``, :data:`DEEP_FACTOR` times as many under ``deep``."""
    return count * DEEP_FACTOR if os.environ.get(PROFILE_ENV) == "deep" else count
