"""Imported (as ``sitecustomize``) only by the node processes a chaos scenario runs under
libfaketime with this folder on ``PYTHONPATH`` (``tests.chaos.test_clock_skew.faketime_env``).

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails Python 3.11's ``time.sleep``
with EINVAL: kazoo's reconnect loop and psycopg_pool's retry would die of it, for a reason no
real clock has. The fix is the drill's (``allocator.drill.shim.sleep_on_a_condition``: the
repository is on the same ``PYTHONPATH``); nothing else changes.
"""

from __future__ import annotations

from allocator.drill.shim import sleep_on_a_condition

sleep_on_a_condition()
