"""Imported (as ``sitecustomize``) only by the node processes a chaos scenario runs under
libfaketime with this folder on ``PYTHONPATH`` (``tests.chaos.test_clock_skew.faketime_env``).

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails every
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` with EINVAL, and Python 3.11's
``time.sleep`` is built on it: a node whose ZooKeeper connection drops would lose kazoo's
connection thread (its reconnect loop sleeps) and with it the session, and one whose database
connection breaks would die in psycopg_pool's retry sleep, for a reason no real clock has.
``threading.Event().wait`` (a condition variable's timed wait) works under libfaketime, so
``time.sleep`` waits on one instead. Nothing else changes. The drill's shim does the same for
the nodes it skews (``allocator.drill.shim.sleep_on_a_condition``).
"""

from __future__ import annotations

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep
