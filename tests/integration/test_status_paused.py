"""Paused claims as the operator and a node see them (issue 19, item 4): ``allocator status``
(text and ``--json``, the JSON checked against docs/schemas/status.schema.json), a node's pool
reading (``/status``'s ``pool`` and the ``allocator_claims_paused`` metric)."""

from __future__ import annotations

import json
import math

import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest

from allocator import cli
from allocator.cluster_status import gather
from allocator.config import Config, load_config
from allocator.metrics import NodeMetrics
from allocator.node.pool_watch import PoolWatch
from allocator.postgres import store as db
from tests import output_schemas

pytestmark = pytest.mark.integration

REASON = "restore INC-9"


@pytest.fixture
def config(zk_hosts: str, db_url: str) -> Config:
    return load_config(overrides={"zookeeper.hosts": zk_hosts, "postgres.url": db_url}, env={})


def pause(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT * FROM allocator.pause_claims(%s)", (REASON,))


def test_status_says_claims_are_paused_by_whom_and_why(config: Config, db_url: str) -> None:
    served = gather(config).to_json()
    assert served["pool"]["claims_paused"] is False
    assert served["claims_pause"] is None
    # The bound on an ID's age (migration 0011): no leader of this release has written one.
    assert served["block_age"] == {
        "max_block_age_s": None,
        "oldest_unclaimed_age_s": None,
        "leader_serves": False,
        "serve_aged_without_leader": None,
        "heartbeat_at": None,
    }
    pause(db_url)
    data = gather(config).to_json()
    assert data["pool"]["claims_paused"] is True
    assert data["claims_pause"]["reason"] == REASON
    assert data["claims_pause"]["paused_by"] == "postgres"
    env = {"ALLOCATOR_ZOOKEEPER_HOSTS": config.zookeeper.hosts, "ALLOCATOR_POSTGRES_URL": db_url}
    text = CliRunner().invoke(cli.main, ["status"], env=env)
    assert text.exit_code == 0, text.output
    assert "ID age      pool empty, no bound set yet; NO LEADER SERVES" in text.output
    assert f"!! CLAIMS PAUSED since {data['claims_pause']['paused_at']} by postgres: {REASON}" in (
        text.output
    )
    # The JSON as printed: no node in the election, claims paused (docs/schemas/)
    printed = CliRunner().invoke(cli.main, ["status", "--json"], env=env)
    assert printed.exit_code == 0, printed.output
    document = json.loads(printed.stdout)
    assert (document["leader"], document["claims_pause"]["reason"]) == (None, REASON)
    output_schemas.assert_valid("status", document)
    output_schemas.assert_required_keys_matter("status", document)


def sample(metrics: NodeMetrics) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("allocator_claims_paused "):
            return float(line.split()[1])
    raise AssertionError("allocator_claims_paused is not exported")


def test_a_nodes_pool_reading_exports_the_pause(config: Config, db_url: str) -> None:
    metrics = NodeMetrics()
    assert math.isnan(sample(metrics))  # no reading yet: no value, never a made-up 0
    with db.NodeDatabase(config.postgres, node_name="t") as store:
        watch = PoolWatch(store, config, metrics)
        watch.read()
        assert sample(metrics) == 0
        pause(db_url)
        status = watch.read()
    assert status is not None
    assert status.claims_paused
    assert sample(metrics) == 1
