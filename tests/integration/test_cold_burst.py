"""A cold pool absorbs a burst (issue 12): a node with the shipped pool defaults reports
ready (``/readyz``) only once the pool can take a burst, and 8,000 claims from 16
connections sent right after it turns ready all succeed, none "pool empty" (AL003).

The burst is the one a user met with node-postgres against a fresh cluster (16 connections,
~3k claims/s): with the old defaults (a 64-block floor, refills waiting for a measured
rate) 307 of 8,000 claims got AL003.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import psycopg
import pytest

from tests.fixtures.nodes import MakeNode, wait_for
from tests.fixtures.pg import claim

pytestmark = pytest.mark.integration

CONNECTIONS = 16
CLAIMS_PER_CONNECTION = 500  # 8,000 in all
POOL_EMPTY = "AL003"


def readyz(admin_url: str) -> int:
    try:
        with urllib.request.urlopen(f"{admin_url}/readyz", timeout=5) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_node_is_ready_only_when_the_pool_takes_a_burst(make_node: MakeNode, db_url: str) -> None:
    node = make_node("cold", fast=False, **{"zookeeper.session_timeout_ms": 2000})
    admin_url = node.admin_url
    wait_for(lambda: readyz(admin_url) == 200, "/readyz to answer ready")

    claimed: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(CONNECTIONS)

    def consumer(index: int) -> None:
        mine: list[int] = []
        with psycopg.connect(db_url, autocommit=True) as conn:
            start.wait()
            for _ in range(CLAIMS_PER_CONNECTION):
                try:
                    mine.extend(block for block, _first, _last in claim(conn, f"burst-{index}"))
                except psycopg.Error as exc:
                    with lock:
                        errors.append(exc.sqlstate or repr(exc))
        with lock:
            claimed.extend(mine)

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors.count(POOL_EMPTY) == 0, f"{errors.count(POOL_EMPTY)} claims found the pool empty"
    assert errors == []
    assert len(claimed) == CONNECTIONS * CLAIMS_PER_CONNECTION
    assert len(set(claimed)) == len(claimed)  # I1: no block handed out twice
