"""Chaos: every ZooKeeper server's data wiped while the nodes run; recovery by `fence rebase`.

Rules: the ensemble is stopped (SIGKILL), each server's ``data/version-2`` (snapshots and
transaction logs) deleted, and the ensemble started again on the same ports: a rebuilt
ensemble whose zxids restart low, below the epoch the fence holds. Both session-loss modes
are run: ``exit`` (the supervisor restarts the node) and ``rejoin`` (the node builds a new
client: the old one remembers a last zxid the rebuilt ensemble refuses).

What used to happen: every candidate got AL101 and retried forever, silently. What must hold
(docs/design.md §3, §11): the nodes recreate their chroot, join, find the fence ahead of ZooKeeper
and report it (metric, ``/status``, log) instead of churning; consumers keep claiming from
the pool; after ``allocator fence rebase`` a leader of the new generation cuts within
seconds; a write carrying a pre-rebase token is rejected; the checker finds nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import psycopg
import pytest
from kazoo.client import KazooClient

from allocator.local import nodes as nodes_mod
from allocator.local import zookeeper as zk_mod
from tests.chaos.harness import ChaosCluster, chaos_consumers, http_json, log_events, wait_for
from tests.fixtures.pg import LAYOUT_JSON

pytestmark = pytest.mark.integration

CLAIMS = 20
REASON = "chaos test: ensemble wiped"
REBASE_COMMAND = (sys.executable, "-m", "allocator.cli", "fence", "rebase")


OLD_ZXIDS = 400
"""Transactions the old ensemble makes before the nodes join. A wiped ensemble counts zxids
from 1 again; its sessions, chroot and znodes use some with every poll and rejoin. The old
fence must stay ahead of all of them for the test's whole run, else a rejoining node's new
czxid passes the old fence and it simply (and safely) takes over with generation 0."""


def age_the_ensemble(chaos: ChaosCluster) -> None:
    """``OLD_ZXIDS`` transactions, so the old leader's token is far ahead of a fresh count."""
    client = KazooClient(hosts=chaos.info().zk_hosts)
    client.start(timeout=10)
    try:
        path = client.create("/allocator-test-age", b"")
        for i in range(OLD_ZXIDS):  # bounded, loopback only
            client.set(path, str(i).encode())
        client.delete(path)
    finally:
        client.stop()
        client.close()


def wipe_ensemble(chaos: ChaosCluster) -> None:
    """Stop every server, delete its data, start them all again (same ports, same ids)."""
    servers = chaos.info().zk_servers
    for server in servers:
        chaos.cluster.stop_zk(server.id)
    for server in servers:
        shutil.rmtree(zk_mod.server_dir(chaos.state_dir, server.id) / "data" / "version-2")
    for server in servers:
        chaos.cluster.start_zk(server.id)


def fence_rebase(chaos: ChaosCluster) -> dict[str, object]:
    """`allocator fence rebase` as an operator would run it (superuser URL here)."""
    info = chaos.info()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")},
        "ALLOCATOR_ZOOKEEPER_HOSTS": info.node_zk_hosts,
        "ALLOCATOR_ZOOKEEPER_AUTH": info.zk_auth,
        "ALLOCATOR_POSTGRES_URL": chaos.database_url,
    }
    done = subprocess.run(
        [*REBASE_COMMAND, "--reason", REASON, "--yes", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def fence_ahead_reported(chaos: ChaosCluster) -> bool:
    for node in chaos.info().nodes:
        try:
            if http_json(f"{node.admin_url}/status").get("fence_ahead_of_zookeeper"):
                return True
        except OSError:
            continue  # restarting
    return False


@pytest.mark.parametrize("mode", ["exit", "rejoin"])
def test_a_wiped_ensemble_is_reported_and_one_rebase_brings_the_cluster_back(mode: str) -> None:
    """Breaks: ZooKeeper's whole state (every server wiped), under running nodes.

    Must hold: the fence-ahead state is reported; no node takes the fence or cuts until the
    re-base; consumers keep claiming; after `fence rebase` a generation-1 leader cuts; a
    pre-rebase token can neither write nor take the fence; checker clean. Cost: ~20 s.
    """
    env = {"ALLOCATOR_NODE_ON_SESSION_LOSS": mode}
    with ChaosCluster(zk=3, nodes=0, node_env=env) as chaos:
        age_the_ensemble(chaos)
        chaos.up(nodes=2)
        old = chaos.wait_leader()
        assert old.epoch & 0xFFFF_FFFF > OLD_ZXIDS
        consumers = chaos_consumers(chaos.info().consumer_database_url).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the fault")
            chaos.wait_pool(1000)  # the pool must outlast the outage and the re-base
            terms_before = len(chaos.history())
            wipe_ensemble(chaos)
            wait_for(lambda: fence_ahead_reported(chaos), "a node to report the fence ahead")
            assert chaos.fence() == (old.epoch, old.name) or chaos.fence()[0] == old.epoch
            assert len(chaos.history()) == terms_before  # nobody took the fence meanwhile
            since = time.time()
            wait_for(lambda: consumers.count(since=since) >= CLAIMS, "claims during the outage")

            rebase = fence_rebase(chaos)
            assert rebase["new_generation"] == 1
            new = wait_for(lambda: _generation_leader(chaos), "a generation-1 leader")
            wait_for(lambda: _blocks_of_generation(chaos, 1) > 0, "the new leader to cut")
            assert not fence_ahead_reported(chaos) or _reports_cleared(chaos)
            since = time.time()
            wait_for(lambda: consumers.count(since=since) >= CLAIMS, "claims after the rebase")
            chaos.assert_clean(consumers)
        finally:
            consumers.stop()
        _assert_old_token_refused(chaos, old.epoch)
        history = chaos.history()
        assert any(t.end_reason == "rebased" for t in history)
        assert new[0] == 1
        logs = [nodes_mod.log_path(chaos.state_dir, node.name) for node in chaos.info().nodes]
        assert any(log_events(path, "fence_ahead_of_zookeeper") for path in logs if path.exists())


def _generation_leader(chaos: ChaosCluster) -> tuple[int, int, str] | None:
    with psycopg.connect(chaos.database_url, autocommit=True) as conn:
        row = conn.execute("SELECT generation, epoch, holder FROM allocator.fence").fetchone()
    if row is None or row[0] < 1 or row[2] is None:
        return None
    return int(row[0]), int(row[1]), str(row[2])


def _blocks_of_generation(chaos: ChaosCluster, generation: int) -> int:
    with psycopg.connect(chaos.database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM allocator.blocks WHERE generation = %s", (generation,)
        ).fetchone()
    return int(row[0]) if row else 0


def _reports_cleared(chaos: ChaosCluster) -> bool:
    wait_for(lambda: not fence_ahead_reported(chaos), "the fence-ahead reports to clear")
    return True


def _assert_old_token_refused(chaos: ChaosCluster, old_epoch: int) -> None:
    """The pre-rebase token (generation 0, the old czxid) can neither write nor take over."""
    with psycopg.connect(chaos.database_url, autocommit=True) as conn:
        for statement, params, sqlstate in [
            (
                "SELECT * FROM allocator.cut_blocks(0, %s, ARRAY[1::bigint], ARRAY[2::bigint],"
                " %s, 1000)",
                (old_epoch, LAYOUT_JSON),
                "AL100",
            ),
            ("SELECT allocator.requeue_stranded(0, %s)", (old_epoch,), "AL100"),
            (
                "SELECT * FROM allocator.take_fence(0, %s, 'old', 'h', 1, %s)",
                (old_epoch + (1 << 40), LAYOUT_JSON),
                "AL101",
            ),
        ]:
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(statement, params)
            assert caught.value.sqlstate == sqlstate, statement


def test_an_unreadable_generation_blocks_the_first_node_until_a_rebase_rewrites_it() -> None:
    """Breaks: the fence generation znode is overwritten with a number past bigint (2^64),
    then the only node restarts, so it must take the fence again.

    Must hold (issue 19, item 8): the node does not guess a generation: it stays first,
    ``blocked`` with the reason ``fence_generation_unreadable`` (``/status``, metric) and
    takes no fence; `allocator fence rebase` rewrites the znode and the node leads under the
    new generation. Before, it waited silently as a follower. Cost: ~10 s.
    """
    with ChaosCluster(zk=1, nodes=1) as chaos:
        old = chaos.wait_leader()
        info = chaos.info()
        client = KazooClient(hosts=info.node_zk_hosts, auth_data=[("digest", info.zk_auth)])
        client.start(timeout=10)
        try:
            client.ensure_path("/fence-generation")
            client.set("/fence-generation", str(2**64).encode())
        finally:
            client.stop()
            client.close()
        chaos.cluster.stop_node(old.name)
        chaos.cluster.start_node(old.name)
        admin_url = chaos.node(old.name).admin_url

        def blocked() -> dict[str, object] | None:
            state = http_json(f"{admin_url}/status")
            return state if state["role"] == "blocked" else None

        state = wait_for(blocked, "the node to report itself blocked", ignore=(OSError,))
        reason = state["blocked"]
        assert isinstance(reason, dict)
        assert reason["reason"] == "fence_generation_unreadable"
        assert chaos.fence()[0] == old.epoch  # no takeover

        rebase = fence_rebase(chaos)
        assert rebase["new_generation"] == 1
        new = wait_for(lambda: _generation_leader(chaos), "a generation-1 leader")
        assert new[2] == old.name
        assert http_json(f"{admin_url}/status")["blocked"] is None
