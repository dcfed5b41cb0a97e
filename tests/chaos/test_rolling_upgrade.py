"""Chaos: a rolling upgrade from release 4b4f865 (schema 0009) to this checkout drops nothing.

Rules: one embedded cluster (one ZooKeeper server) without supervised nodes; three nodes of
the old release (:mod:`tests.chaos.release`) on the schema its own ``allocator migrate`` made;
consumers claiming throughout. Then the upgrade in its order: today's ``allocator migrate``
takes the schema to head while the old nodes run (migrations after 0009 are expand-only), the
followers are replaced one at a time by nodes of this checkout, and the leader last, after
today's ``allocator step-down`` asked it (old znode data and old admin HTTP, read and called by
new code). The verdict: no claim failed (pool-empty answers are counted apart: the client
retries them), the checker finds nothing, every old node stopped cleanly, the leader was not
disturbed while the followers were replaced, and the one leader handover happened; its time is
printed, not asserted (a bound on it belongs to `allocator drill`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from allocator import __version__
from allocator.drill.consumers import Consumers
from allocator.local import nodes as nodes_mod
from allocator.local.tcp_ports import LOOPBACK
from allocator.postgres.migrate import head_revision
from tests.chaos import release
from tests.chaos.harness import ChaosCluster, ExtraNode, Leader, chaos_consumers, now_utc, wait_for

pytestmark = pytest.mark.integration

OLD_NODES = ("old-1", "old-2", "old-3")
CLAIMS_PER_STEP = 50
"""Blocks the consumers must receive after each step before the next one starts."""
COMMAND_TIMEOUT_S = 60
HANDOVER_POLL_S = 0.01
ROLES = ("allocator_node", "allocator_app", "allocator_consumer", "allocator_operator")
FUNCTION_GRANTS = ", ".join(f"has_function_privilege('{r}', p.oid, 'EXECUTE')" for r in ROLES)
COLUMN_GRANTS = ", ".join(f"has_column_privilege('{r}', c.oid, a.attnum, 'SELECT')" for r in ROLES)
SURFACE_SQL = f"""
SELECT 'function ' || p.oid::regprocedure::text,
       pg_get_function_result(p.oid) || ' ' || concat_ws(',', {FUNCTION_GRANTS})
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'allocator'
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname,
       format_type(a.atttypid, a.atttypmod) || ' ' || concat_ws(',', {COLUMN_GRANTS})
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE n.nspname = 'allocator' AND c.relkind IN ('r', 'v', 'm', 'p')
"""
"""What an older node or consumer may call or read: every function of the schema with its
result and who may execute it, every column of its tables and views with its type and who
may read it."""
HANDOVER_DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def old_release() -> Path:
    """The old release's folder (built once, then cached: see tests/chaos/release.py); a
    clone without its revision (shallow) skips, saying so."""
    try:
        return release.build()
    except release.NotInHistoryError as exc:
        pytest.skip(f"release {release.UPGRADE_FROM} cannot be built here: {exc}")


def run_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """Run an ``allocator`` command to its end (exit 0 expected); its stdout."""
    done = subprocess.run(
        list(argv),
        env={**nodes_mod.base_env(os.environ), **env},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{argv[-1]} exited {done.returncode}: {done.stderr}"
    return done.stdout


def node_version(node: ExtraNode) -> str | None:
    """The version a node reports in ``allocator_build_info`` on its ``/metrics``."""
    assert node.admin_url.startswith(f"http://{LOOPBACK}:"), node.admin_url
    url = f"{node.admin_url}/metrics"
    with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
        text = response.read().decode()
    found = re.search(r'^allocator_build_info\{[^}]*version="([^"]+)"', text, re.MULTILINE)
    return found.group(1) if found else None


def logged(node: ExtraNode, *levels: str) -> list[str]:
    """The lines of ``node``'s log at one of ``levels`` (``ERROR``, …)."""
    lines = node.log_path.read_text(errors="replace").splitlines()
    return [line for line in lines if any(f" {level} " in line for level in levels)]


def schema_surface(chaos: ChaosCluster) -> dict[str, str]:
    """:data:`SURFACE_SQL`'s rows, as superuser."""
    with chaos._connect() as conn:
        return {str(what): str(shape) for what, shape in conn.execute(SURFACE_SQL).fetchall()}


def wait_claims(consumers: Consumers, more: int, what: str) -> None:
    """Until the consumers have received ``more`` blocks beyond what they had."""
    target = consumers.record_count() + more
    wait_for(lambda: consumers.record_count() >= target, f"{more} claims {what}")


def replace(chaos: ChaosCluster, old: ExtraNode, new_name: str) -> tuple[ExtraNode, float]:
    """Stop ``old`` (it must exit 0), start ``new_name`` from this checkout, wait until it
    follows; the new node and the seconds the swap took."""
    started = time.monotonic()
    assert old.stop() == 0, f"{old.name} did not stop cleanly"
    new = chaos.start_extra_node(new_name)
    chaos.wait_role(new.admin_url, "follower", f"{new_name} to follow")
    assert node_version(new) == __version__, "the new node runs another release"
    return new, time.monotonic() - started


def today(*args: str) -> list[str]:
    """``allocator ARGS…`` of this checkout."""
    return [sys.executable, "-m", "allocator.cli", *args]


def operator_env(chaos: ChaosCluster) -> dict[str, str]:
    """What an operator's ``allocator status``/``step-down`` needs to reach the cluster."""
    info = chaos.info()
    return {
        "ALLOCATOR_ZOOKEEPER_HOSTS": info.node_zk_hosts,
        "ALLOCATOR_ZOOKEEPER_AUTH": info.zk_auth,
        "ALLOCATOR_NODE_ADMIN_TOKEN": info.admin_token,
        "ALLOCATOR_POSTGRES_URL": info.node_database_url,
    }


def assert_status_reads_all(chaos: ChaosCluster, leader: str, contenders: int) -> None:
    """Today's ``allocator status`` parses every node's election znode, old or new."""
    data = json.loads(run_command(today("status", "--json"), operator_env(chaos)))
    assert data["leader"]["name"] == leader, data["leader"]
    assert data["election"]["unparsable"] == [], data["election"]
    problems = [(c["name"], c["problem"], c["db_ok"]) for c in data["contenders"]]
    assert len(problems) == contenders, problems
    assert all(problem is None and db_ok for _, problem, db_ok in problems), problems


def step_down(chaos: ChaosCluster, leader: Leader) -> tuple[Leader, float]:
    """Today's ``allocator step-down`` against ``leader``; the next leader and the seconds
    from the step-down's answer until the fence named it."""
    out = run_command(today("step-down", "--json"), operator_env(chaos))
    answered = time.monotonic()
    assert json.loads(out)["leader"] == leader.name, out

    def next_leader() -> Leader | None:
        now = chaos.leader()
        return now if now is not None and now.epoch > leader.epoch else None

    deadline = answered + HANDOVER_DEADLINE_S
    while (successor := next_leader()) is None:
        assert time.monotonic() < deadline, f"no leader took over from {leader.name}"
        time.sleep(HANDOVER_POLL_S)
    return successor, time.monotonic() - answered


def leaderless_s(chaos: ChaosCluster, before: Leader, after: Leader) -> tuple[float, str]:
    """How long the database had no term between ``before`` and ``after`` (the old term's
    ``ended_at`` to the new one's ``elected_at``), and why the old term ended."""
    terms = {term.epoch: term for term in chaos.history()}
    ended, elected = terms[before.epoch], terms[after.epoch]
    assert ended.ended_at is not None, f"term {before.epoch} of {before.name} never ended"
    return (elected.elected_at - ended.ended_at).total_seconds(), str(ended.end_reason)


def test_rolling_upgrade_from_4b4f865_drops_nothing(old_release: Path) -> None:
    with ChaosCluster(nodes=0, migrate=False) as chaos:
        # The old release's schema, made by its own migrate; then the login roles.
        run_command(
            release.allocator_command(old_release, "migrate", "--database-url", chaos.database_url),
            release.OLD_CODE_ENV,
        )
        assert chaos.schema_revision() == release.UPGRADE_FROM_SCHEMA
        info = chaos.up(0)
        surface_before = schema_surface(chaos)
        old = {
            name: chaos.start_extra_node(
                name,
                release.OLD_CODE_ENV,
                command=release.allocator_command(old_release, "run"),
            )
            for name in OLD_NODES
        }
        leader = chaos.wait_leader()
        for name, node in old.items():
            role = "leader" if name == leader.name else "follower"
            chaos.wait_role(node.admin_url, role, f"old {name} to be {role}")
            assert node_version(node) == release.UPGRADE_FROM_VERSION, f"{name} runs today's code"

        with chaos_consumers(info.consumer_database_url) as consumers:
            wait_claims(consumers, CLAIMS_PER_STEP, "from the old release")

            # 1. The schema to head under the running old nodes; the old leader keeps cutting.
            migrated_at = now_utc()
            run_command(today("migrate", "--database-url", chaos.database_url), {})
            assert chaos.schema_revision() == head_revision()
            # Expand-only: nothing the old release could call or read was dropped or changed.
            surface_after = schema_surface(chaos)
            changed = {
                what: (shape, surface_after.get(what))
                for what, shape in surface_before.items()
                if surface_after.get(what) != shape
            }
            assert changed == {}, changed
            chaos.wait_cutting(leader.epoch, migrated_at)
            wait_claims(consumers, CLAIMS_PER_STEP, "on the migrated schema")

            # 2. Followers first, one at a time; the old leader leads throughout.
            swaps: list[str] = []
            followers = [name for name in OLD_NODES if name != leader.name]
            for index, name in enumerate(followers, start=1):
                new, took_s = replace(chaos, old[name], f"new-{index}")
                swaps.append(f"{name} -> {new.name} {took_s:.2f} s")
                assert chaos.fence() == (leader.epoch, leader.name), f"{new.name} disturbed"
                assert_status_reads_all(chaos, leader.name, len(OLD_NODES))
                wait_claims(consumers, CLAIMS_PER_STEP, f"after {new.name} joined")

            # 3. The leader last: stepped down, then replaced like a follower.
            successor, seen_s = step_down(chaos, leader)
            gap_s, end_reason = leaderless_s(chaos, leader, successor)
            assert successor.name.startswith("new-"), successor
            # The old node steps down into a follower of a new leader (a mixed cluster again).
            chaos.wait_role(old[leader.name].admin_url, "follower", f"{leader.name} to follow")
            assert_status_reads_all(chaos, successor.name, len(OLD_NODES))
            cut_from = now_utc()
            _, took_s = replace(chaos, old[leader.name], f"new-{len(OLD_NODES)}")
            swaps.append(f"{leader.name} -> new-{len(OLD_NODES)} {took_s:.2f} s")
            chaos.wait_cutting(successor.epoch, cut_from)
            wait_claims(consumers, CLAIMS_PER_STEP, "on the new release")

            records = chaos.assert_clean(consumers)
            totals = consumers.totals()

        assert totals.errors == 0, consumers.describe()
        # No write of an old node failed on the migrated schema, nor anything else.
        for node in old.values():
            assert logged(node, "ERROR", "CRITICAL") == [], f"{node.name} logged errors"
        assert chaos.schema_revision() == head_revision()
        print(
            f"rolling upgrade {release.UPGRADE_FROM} -> this checkout: {len(records)} blocks "
            f"claimed, {totals.errors} errors, {totals.pool_empty} pool-empty answers; "
            f"leader handover {leader.name} -> {successor.name}: {gap_s * 1000:.0f} ms without "
            f"a term (old term {end_reason} -> new term elected, database clock), new epoch "
            f"seen {seen_s * 1000:.0f} ms after step-down answered; swaps: {'; '.join(swaps)}"
        )
