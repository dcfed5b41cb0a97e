"""Nodes in threads against the real ensemble and PostgreSQL: election, fence, self-stop.

Faults here use real mechanisms: a forced server-side session expiry (a second client on
the victim's session id, then closed: KAZOO-NOTES "Testing"), a fence moved under the
leader's feet, a leader whose clock is behind the mark. Waits poll observable state with a
deadline; nothing sleeps to let things settle.
"""

from __future__ import annotations

import itertools
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from allocator.commands.run import build_node
from allocator.config import load_config
from allocator.core.clock import wall_clock_ms
from allocator.core.errors import ConfigError
from allocator.fence import Watermark, watermark_path
from allocator.node import EXIT_CONFIG, EXIT_FENCED, EXIT_OK, EXIT_SESSION_LOST, Node
from allocator.session import file as session_file
from tests import output_schemas
from tests.fixtures import zk
from tests.fixtures.nodes import DEADLINE_S, SESSION_TIMEOUT_MS, RunningNode, wait_for
from tests.fixtures.pg import claim, take_fence

pytestmark = pytest.mark.integration


def fence(db_url: str) -> tuple[int, str | None]:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT epoch, holder FROM allocator.fence").fetchone()
    assert row is not None
    return int(row[0]), row[1]


def available(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()
    return int(row[0]) if row else 0


def ledger(db_url: str) -> list[tuple[int, int, int, int]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT block_id, first_id, last_id, epoch"
            " FROM allocator.block_ledger ORDER BY block_id"
        ).fetchall()
    return [(int(a), int(b), int(c), int(d)) for a, b, c, d in rows]


def assert_ledger_sound(db_url: str) -> None:
    """I1/I2 on the ledger: ranges disjoint, first IDs strictly increasing in cut order."""
    rows = ledger(db_url)
    for (_, _, prev_last, _), (_, first, last, _) in itertools.pairwise(rows):
        assert first > prev_last
        assert last >= first


def expire_session(zk_hosts: str, node: Node) -> None:
    """A real server-side expiry of ``node``'s session, seen by the node (it dropped or
    replaced those credentials)."""
    credentials = node.session_credentials()
    assert credentials is not None
    zk.expire_session(zk_hosts, credentials, lambda: node.session_credentials() != credentials)


def test_one_leader_fills_the_pool_and_hands_over_on_shutdown(
    make_node: Callable[..., RunningNode], db_url: str
) -> None:
    first = make_node("a")
    wait_for(lambda: fence(db_url)[1] == "a", "a to take the fence")
    second = make_node("b")
    wait_for(lambda: available(db_url) >= 40, "the pool to fill")
    wait_for(lambda: second.node.snapshot()["role"] == "follower", "b to queue")
    epoch_a = fence(db_url)[0]
    assert first.stop() == EXIT_OK
    wait_for(lambda: fence(db_url)[1] == "b", "b to take over")
    assert fence(db_url)[0] > epoch_a
    with psycopg.connect(db_url, autocommit=True) as conn:
        claim(conn, "app", 30)
    wait_for(lambda: available(db_url) >= 40, "b to refill")
    assert_ledger_sound(db_url)
    with psycopg.connect(db_url) as conn:
        history = conn.execute(
            "SELECT holder, end_reason FROM allocator.leader_history ORDER BY epoch"
        ).fetchall()
    assert history[0] == ("a", "shutdown")
    assert history[1] == ("b", None)


def test_leader_whose_session_expires_stops_itself(
    make_node: Callable[..., RunningNode], db_url: str, zk_hosts: str
) -> None:
    leader = make_node("a", **{"node.on_session_loss": "exit"})
    wait_for(lambda: fence(db_url)[1] == "a", "a to lead")
    follower = make_node("b")
    wait_for(lambda: follower.node.snapshot()["role"] == "follower", "b to queue")
    expire_session(zk_hosts, leader.node)
    leader.thread.join(DEADLINE_S)
    assert leader.exit_code == EXIT_SESSION_LOST
    wait_for(lambda: fence(db_url)[1] == "b", "b to take over")
    assert_ledger_sound(db_url)


def test_rejoin_mode_reenters_the_election_with_a_new_session(
    make_node: Callable[..., RunningNode], db_url: str, zk_hosts: str
) -> None:
    node = make_node("a")  # rejoin: the default
    wait_for(lambda: fence(db_url)[1] == "a", "a to lead")
    first_epoch = fence(db_url)[0]
    expire_session(zk_hosts, node.node)
    wait_for(lambda: fence(db_url)[0] > first_epoch, "a to lead again with a new epoch")
    assert node.thread.is_alive()
    assert fence(db_url)[1] == "a"


def test_leader_fenced_by_a_newer_epoch_exits(
    make_node: Callable[..., RunningNode], db_url: str
) -> None:
    leader = make_node("a")
    wait_for(lambda: available(db_url) >= 40, "the pool to fill")
    epoch = fence(db_url)[0]
    with psycopg.connect(db_url, autocommit=True) as conn:
        # someone else takes the fence (as a newer leader would) ...
        take_fence(conn, epoch + 1000, holder="usurper")
        claim(conn, "app", 35)  # ... and the pool runs low, so `a` tries to write
    leader.thread.join(DEADLINE_S)
    assert leader.exit_code == EXIT_FENCED
    assert all(block_epoch == epoch for *_, block_epoch in ledger(db_url))
    registry = leader.node.metrics.registry
    assert (registry.get_sample_value("allocator_fenced_writes_rejected_total") or 0) >= 1


@pytest.mark.parametrize("skew_ms", [-60_000, 3_600_000])
def test_leader_whose_clock_disagrees_cuts_nothing_and_hands_over_only_to_a_fit_contender(
    make_node: Callable[..., RunningNode], db_url: str, skew_ms: int
) -> None:
    """docs/design.md §11: a clock a minute behind or an hour ahead of the database's. The skewed
    leader takes the fence but cuts nothing; alone, it keeps leading (handover withheld, the
    pool serves); once a node with a good clock queues, it hands over to it."""
    first = make_node("a")
    wait_for(lambda: available(db_url) >= 40, "the pool to fill")
    assert first.stop() == EXIT_OK
    mark_before = ledger(db_url)[-1][2]
    skewed = make_node(
        "skewed",
        now_ms=lambda: wall_clock_ms() + skew_ms,
        **{"leader.clock_skew_handover_s": 1.0},
    )
    wait_for(lambda: fence(db_url)[1] == "skewed", "the skewed node to lead")
    metrics = skewed.node.metrics.registry
    wait_for(lambda: metrics.get_sample_value("allocator_clock_skew_alert") == 1, "the alert")
    wait_for(
        lambda: metrics.get_sample_value("allocator_handover_withheld") == 1,
        "the handover to be withheld: nobody would do better",
    )
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert len(claim(conn, "app", 10)) == 10  # the pool still serves
    assert ledger(db_url)[-1][2] == mark_before  # nothing cut
    assert skewed.node.snapshot()["clock_agrees"] is False
    make_node("good")
    wait_for(lambda: fence(db_url)[1] == "good", "the good node to take over")
    wait_for(lambda: ledger(db_url)[-1][2] > mark_before, "the good node to cut")
    with psycopg.connect(db_url) as conn:
        reasons = conn.execute(
            "SELECT holder, end_reason FROM allocator.leader_history ORDER BY elected_at"
        ).fetchall()
    assert ("skewed", "clock_skew") in reasons


def test_a_database_with_an_asynchronous_standby_gets_no_cut_unless_it_is_allowed(
    make_node: Callable[..., RunningNode], db_url: str, async_standby_slot: str
) -> None:
    """Issue 9: a failover to a standby no commit waited for loses acknowledged claims. The
    leader takes the fence but cuts nothing, says why (metric, /status); a node with
    ``postgres.allow_async_replication`` cuts, and says that it was allowed."""
    careful = make_node("careful")
    wait_for(lambda: fence(db_url)[1] == "careful", "careful to lead")
    metrics = careful.node.metrics.registry
    wait_for(lambda: metrics.get_sample_value("allocator_async_replication") == 1, "the metric")
    assert metrics.get_sample_value("allocator_async_replication_allowed") == 0
    snapshot = careful.node.snapshot()
    assert (snapshot["async_replication"], snapshot["async_replication_allowed"]) == (True, False)
    assert ledger(db_url) == []  # nothing cut
    assert careful.stop() == EXIT_OK
    allowed = make_node("allowed", **{"postgres.allow_async_replication": True})
    wait_for(lambda: available(db_url) >= 40, "the allowed node to cut")
    metrics = allowed.node.metrics.registry
    assert metrics.get_sample_value("allocator_async_replication") == 1
    assert metrics.get_sample_value("allocator_async_replication_allowed") == 1


def test_a_database_without_standbys_is_not_asynchronous(
    make_node: Callable[..., RunningNode], db_url: str
) -> None:
    node = make_node("plain")
    wait_for(lambda: available(db_url) >= 40, "the pool to fill")
    assert node.node.metrics.registry.get_sample_value("allocator_async_replication") == 0
    assert node.node.snapshot()["async_replication"] is False


def read_watermark(zk_hosts: str) -> Watermark | None:
    client = KazooClient(hosts=zk_hosts, auth_data=[("digest", zk.ZK_AUTH)])
    client.start(timeout=10)
    try:
        data, _stat = client.get(watermark_path("/election"))
    except NoNodeError:
        return None
    finally:
        client.stop()
        client.close()
    return Watermark.from_bytes(data)


def move_mark(db_url: str, by: int) -> None:
    """What a restore does to the mark (the rest of the database is left alone here)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE allocator.high_water SET last_id = last_id + %s", (by,))


def test_a_database_that_went_backwards_gets_no_write_and_no_takeover(
    make_node: Callable[..., RunningNode], db_url: str, zk_hosts: str
) -> None:
    """Issue 9 item 4, the database's side simulated by moving its mark back: ZooKeeper's
    watermark follows the leader's cuts; a leader whose database falls below it writes
    nothing (no requeue, no cut), a new leader does not take the fence, both say why; once
    the mark is past the watermark again (an operator's reset), all goes on."""
    a = make_node("a")
    wait_for(lambda: available(db_url) >= 40, "the pool to fill")
    cut_mark = ledger(db_url)[-1][2]
    wait_for(
        lambda: (w := read_watermark(zk_hosts)) is not None and w.high_water_id >= cut_mark,
        "the watermark to follow the cuts",
    )
    assert read_watermark(zk_hosts).token == (0, fence(db_url)[0])  # type: ignore[union-attr]

    move_mark(db_url, -10_000_000)
    metrics = a.node.metrics.registry
    wait_for(
        lambda: metrics.get_sample_value("allocator_database_behind_zookeeper") == 1,
        "the leader to notice",
    )
    refill_runs = "allocator_refill_duration_seconds_count"
    runs = metrics.get_sample_value(refill_runs) or 0
    blocks = len(ledger(db_url))
    with psycopg.connect(db_url, autocommit=True) as conn:
        claim(conn, "app", 40)  # below the low watermark: a refill would cut now
    wait_for(
        lambda: (
            (metrics.get_sample_value("allocator_refill_duration_seconds_count") or 0) >= runs + 3
        ),
        "three more refill runs",
    )
    assert len(ledger(db_url)) == blocks  # nothing cut
    behind = a.node.snapshot()["database_behind_zookeeper"]
    assert "high-water mark" in behind["reason"]
    assert a.stop() == EXIT_OK

    b = make_node("b")
    wait_for(lambda: b.node.snapshot()["role"] == "blocked", "b to refuse the takeover")
    assert fence(db_url)[1] == "a"
    assert b.node.metrics.registry.get_sample_value("allocator_database_behind_zookeeper") == 1

    move_mark(db_url, 10_000_000)  # what `allocator pool reset --after-restore` will do
    wait_for(lambda: fence(db_url)[1] == "b", "b to take over")
    wait_for(lambda: available(db_url) >= 40, "b to cut")
    assert b.node.snapshot()["database_behind_zookeeper"] is None


def test_step_down_hands_over_at_once_and_rejoins_at_the_back(
    make_node: Callable[..., RunningNode], db_url: str
) -> None:
    first = make_node("a")
    wait_for(lambda: fence(db_url)[1] == "a", "a to lead")
    second = make_node("b")
    wait_for(lambda: second.node.snapshot()["role"] == "follower", "b to queue")
    assert not second.node.request_step_down()  # only a leader can step down
    assert first.node.request_step_down()
    wait_for(lambda: fence(db_url)[1] == "b", "b to take over")
    wait_for(lambda: first.node.snapshot()["role"] == "follower", "a to queue again")
    assert first.thread.is_alive()
    with psycopg.connect(db_url) as conn:
        reasons = conn.execute(
            "SELECT holder, end_reason FROM allocator.leader_history ORDER BY epoch"
        ).fetchall()
    assert reasons[0] == ("a", "stepped_down")


def test_retention_prunes_old_claimed_blocks_only(
    make_node: Callable[..., RunningNode], db_url: str
) -> None:
    make_node("a", **{"pool.retention_s": 0.5, "pool.min_blocks": 20})
    wait_for(lambda: available(db_url) >= 20, "the pool to fill")
    with psycopg.connect(db_url, autocommit=True) as conn:
        claimed = claim(conn, "app", 5)
        unclaimed = {
            int(row[0])
            for row in conn.execute(
                "SELECT block_id FROM allocator.block_ledger WHERE claimed_by IS NULL"
            )
        }
    assert len(unclaimed) >= 15

    def pruned() -> bool:
        ids = {block_id for block_id, *_ in ledger(db_url)}
        return not ids & {block_id for block_id, *_ in claimed}

    wait_for(pruned, "retention to delete the claimed blocks")
    # Unclaimed blocks are never pruned. Compare identities, not the pool level: whether
    # a refill has topped the pool up again by now is a race with the refill job.
    remaining = {block_id for block_id, *_ in ledger(db_url)}
    assert unclaimed <= remaining
    assert_ledger_sound(db_url)


def _http(url: str, method: str = "GET", token: str | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(url, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_admin_http_serves_metrics_health_status_and_guards_step_down(
    make_node: Callable[..., RunningNode], db_url: str
) -> None:
    import json

    token = "s3cret-0123456789abcdefghij"
    leader = make_node("a", **{"node.admin_token": token})
    wait_for(lambda: fence(db_url)[1] == "a", "a to lead")
    base = wait_for(lambda: leader.node.snapshot()["admin_url"], "the admin server")
    # The fence row is the database's; the node says it leads a moment later (its term
    # begins after take_fence returns).
    wait_for(lambda: b"allocator_is_leader 1.0" in _http(f"{base}/metrics")[1], "a to say it leads")
    assert _http(f"{base}/metrics")[0] == 200
    assert _http(f"{base}/healthz")[0] == 200
    # ready once the pool reached pool.min_blocks (allocator.pool_watch)
    wait_for(lambda: _http(f"{base}/readyz")[0] == 200, "a to be ready")
    status, body = _http(f"{base}/status")
    assert status == 200
    snapshot = json.loads(body)
    assert snapshot["role"] == "leader"
    assert snapshot["ready"] is True
    assert snapshot["pool"]["available_blocks"] >= 40
    assert snapshot["pool"]["runway_needed_s"] == SESSION_TIMEOUT_MS / 1000 + 5.0
    output_schemas.assert_valid("node-status", snapshot)
    output_schemas.assert_required_keys_matter("node-status", snapshot)
    # /cluster: the first look finds no read yet, and wakes the node's reading thread
    status, body = _http(f"{base}/cluster")
    assert status == 200
    output_schemas.assert_valid("cluster", json.loads(body))

    def cluster_read() -> dict[str, Any] | None:
        view: dict[str, Any] = json.loads(_http(f"{base}/cluster")[1])
        leader = view["leader"]
        return view if view["observed_at"] is not None and leader and leader["since"] else None

    cluster = wait_for(cluster_read, "a complete /cluster view")
    assert cluster["leader"]["name"] == "a"
    output_schemas.assert_valid("cluster", cluster)
    output_schemas.assert_required_keys_matter("cluster", cluster)
    assert _http(f"{base}/step-down", "POST")[0] == 401
    assert _http(f"{base}/step-down", "POST", token="wrong")[0] == 403
    assert _http(f"{base}/nothing")[0] == 404
    epoch = fence(db_url)[0]
    assert _http(f"{base}/step-down", "POST", token=token)[0] == 202
    # the only contender: it hands over to itself, with a new znode and so a new epoch
    wait_for(lambda: fence(db_url)[0] > epoch, "a new term after the step-down")


def test_step_down_over_http_is_refused_without_a_configured_token(
    make_node: Callable[..., RunningNode], db_url: str
) -> None:
    leader = make_node("a")
    wait_for(lambda: fence(db_url)[1] == "a", "a to lead")
    base = wait_for(lambda: leader.node.snapshot()["admin_url"], "the admin server")
    assert _http(f"{base}/step-down", "POST", token="")[0] == 403


def test_a_node_with_another_layout_refuses_to_lead_and_exits_78_naming_both(
    make_node: Callable[..., RunningNode], db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design.md §11: the layout is recorded by the first takeover and checked by every later
    takeover and cut (in SQL, AL104); a misconfigured node stops as a configuration error."""
    first = make_node("a")
    wait_for(lambda: available(db_url) >= 40, "the pool to fill")
    assert first.stop() == EXIT_OK
    cut_before = len(ledger(db_url))
    other = make_node("b", **{"cluster.datacenter_id": 1})
    other.thread.join(DEADLINE_S)
    assert other.exit_code == EXIT_CONFIG
    mismatch = [r.getMessage() for r in caplog.records if "layout_mismatch" in r.getMessage()]
    assert mismatch
    assert "datacenter_id=1" in mismatch[0]
    assert "datacenter_id=0" in mismatch[0]
    assert len(ledger(db_url)) == cut_before
    with psycopg.connect(db_url) as conn:
        recorded = conn.execute("SELECT datacenter_id FROM allocator.layout").fetchone()
    assert recorded == (0,)
    assert fence(db_url)[1] == "a"  # the misconfigured node never took the fence


def test_a_mark_an_hour_ahead_of_every_clock_never_stalls_the_cluster(
    make_node: Callable[..., RunningNode], db_url: str
) -> None:
    """A mark already ahead (a restore, or written before the clock bound): the leader
    cuts densely straight after it, never moving it further ahead than it already was, and
    exports the lead; claims never run dry."""
    first = make_node("a")
    wait_for(lambda: available(db_url) >= 40, "the pool to fill")
    assert first.stop() == EXIT_OK
    hour_ms = 3_600_000
    with psycopg.connect(db_url, autocommit=True) as conn:
        # As a restored database would look: the mark an hour ahead of the database clock,
        # recorded with that lead at its cut.
        shift = hour_ms << 22
        conn.execute(
            "UPDATE allocator.high_water SET last_id = last_id + %s, marked_at = clock_timestamp()",
            (shift,),
        )
        claim(conn, "drain", 1000)  # empty the pool: only new cuts can serve from here on
    leader = make_node("b")
    wait_for(lambda: available(db_url) >= 40, "cuts after a mark an hour ahead")
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert len(claim(conn, "app", 20)) == 20
        (ahead_ms,) = conn.execute("SELECT mark_ahead_ms FROM allocator.pool_status").fetchone()  # type: ignore[misc]
    assert hour_ms - 60_000 < ahead_ms <= hour_ms + 1000  # kept, not grown
    registry = leader.node.metrics.registry
    wait_for(
        lambda: (registry.get_sample_value("allocator_mark_ahead_seconds") or 0) > 3000,
        "the mark's lead to be exported",
    )


# -- the session file (node.state_dir) --------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_node_keeps_its_session_in_a_private_file_and_removes_it_on_a_clean_exit(
    make_node: Callable[..., RunningNode], db_url: str, tmp_path: Path
) -> None:
    """Issue 10: the session password is only in ``<node.state_dir>/session.json`` (0600 in
    a 0700 folder the node creates), never in ``/status``; a clean exit removes the file."""
    state_dir = tmp_path / "state" / "a"
    node = make_node("a", **{"node.state_dir": str(state_dir)})
    wait_for(lambda: fence(db_url)[1] == "a", "a to lead")
    path = session_file.path_in(state_dir)
    assert _mode(state_dir) == 0o700
    assert _mode(path) == 0o600
    record = session_file.read(state_dir)
    assert record is not None
    assert (record.session_id, record.session_password) == node.node.session_credentials()
    assert (record.name, record.pid) == ("a", os.getpid())
    status = node.node.snapshot()
    assert status["session_id"] == f"{record.session_id:#x}"
    assert "session_password" not in status
    assert record.session_password.hex() not in json.dumps(status, default=str)
    assert node.stop() == EXIT_OK
    assert not path.exists()
    assert state_dir.is_dir()  # the folder stays: it is the node's


def test_every_new_session_is_recorded_and_a_lost_one_is_removed(
    make_node: Callable[..., RunningNode], db_url: str, zk_hosts: str, tmp_path: Path
) -> None:
    """Rejoin mode: the new session replaces the expired one in the file. Exit mode: the
    node that lost its session leaves no file naming it."""
    rejoining = make_node(
        "a", **{"node.on_session_loss": "rejoin", "node.state_dir": str(tmp_path / "a")}
    )
    wait_for(lambda: fence(db_url)[1] == "a", "a to lead")
    first = session_file.read(tmp_path / "a")
    assert first is not None
    expire_session(zk_hosts, rejoining.node)

    def recorded_again() -> session_file.SessionRecord | None:
        record = session_file.read(tmp_path / "a")
        return record if record is not None and record.session_id != first.session_id else None

    second = wait_for(recorded_again, "the new session in the file")
    assert (second.session_id, second.session_password) == rejoining.node.session_credentials()
    assert rejoining.stop() == EXIT_OK

    leaving = make_node(
        "b", **{"node.on_session_loss": "exit", "node.state_dir": str(tmp_path / "b")}
    )
    wait_for(lambda: fence(db_url)[1] == "b", "b to lead")
    assert session_file.read(tmp_path / "b") is not None
    expire_session(zk_hosts, leaving.node)
    leaving.thread.join(DEADLINE_S)
    assert leaving.exit_code == EXIT_SESSION_LOST
    assert session_file.read(tmp_path / "b") is None


def test_a_state_dir_others_may_write_stops_the_node_before_it_joins(
    db_url: str, zk_hosts: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    config = load_config(
        None,
        {
            "zookeeper.hosts": zk_hosts,
            "zookeeper.auth": zk.ZK_AUTH,
            "postgres.url": db_url,
            "node.name": "a",
            "node.admin_address": "127.0.0.1:0",
            "node.state_dir": str(shared),
        },
        env={},
    )
    with pytest.raises(ConfigError, match=r"node.state_dir: .* writable by group or others"):
        build_node(config).run()
    assert not session_file.path_in(shared).exists()
