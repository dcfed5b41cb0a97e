"""The environment the chaos tests skew a node's clock with keeps ``time.sleep`` working.

libfaketime 0.9.10 (with a true monotonic clock) fails Python 3.11's ``time.sleep`` with
EINVAL; kazoo's reconnect loop sleeps, so a skewed node lost its session at its first dropped
connection (a chaos clock test failed that way in CI, on a loaded machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.chaos.test_clock_skew import LIBFAKETIME, faketime_env

CHILD = [sys.executable, "-m", "tests.fakes.env_child"]


def run_child(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        CHILD, env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=True
    )
    report: dict[str, object] = json.loads(done.stdout)
    return report


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="Debian package faketime not installed")
@pytest.mark.parametrize("offset", ["+1h", "-1m"])
def test_a_skewed_node_can_sleep_as_kazoo_does(offset: str) -> None:
    assert run_child(faketime_env(offset))["sleep_error"] is None


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="Debian package faketime not installed")
def test_without_the_site_the_sleep_fails_under_libfaketime() -> None:
    """The reason for the site: libfaketime alone breaks the sleep (if a later libfaketime
    fixes it, this fails and the site can go)."""
    bare = {k: v for k, v in faketime_env("+1h").items() if k != "PYTHONPATH"}
    assert str(run_child(bare)["sleep_error"]).startswith("OSError")
