"""``allocator pool pause`` / ``pool resume`` as an operator runs them: the CLI in a subprocess
against a database of its own (no ZooKeeper: pausing is the database's business).

Must show (issue 19, item 4): the pause is audited; claims are refused while paused and served
again after the resume; nothing is handed out while paused; ``pause`` returns only after every
claim begun before it has ended, and says so when one outlives ``--timeout``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from allocator.core.exits import Exit
from tests.fixtures.pg import claim, cut, layout_blocks, take_fence

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
EPOCH = 55
EX_USAGE, EX_TEMPFAIL = Exit.USAGE, Exit.TEMPFAIL
REASON = "restore INC-7 step 1"


def command(*args: str, url: str) -> list[str]:
    return [ALLOCATOR, "pool", *args, "--database-url", url]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")}


def cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args, url=url),
        env=environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def stocked(db_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        take_fence(conn, EPOCH)
        cut(conn, EPOCH, layout_blocks(10))
        yield conn


def claim_state(conn: psycopg.Connection[tuple[object, ...]]) -> str | None:
    """The SQLSTATE a claim gets now; None when it is served."""
    try:
        claim(conn, "app")
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def claims_paused(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether a pause has committed, as the pool's status says (no claim is attempted)."""
    row = conn.execute("SELECT claims_paused FROM allocator.pool_status").fetchone()
    return row is not None and bool(row[0])


def pause_has_listed(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether another session's latest statement, finished, listed the claims in flight.

    Finished, not merely begun: pg_stat_activity shows a statement from its start, and a
    claim that ends between that start and the function's read of the locks is not listed
    (the test then saw ``waited_for == []`` on a loaded machine)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        " AND query LIKE %s AND state <> 'active'",
        ("%FROM allocator.claims_in_flight()%",),
    ).fetchone()
    return row is not None and row[0] > 0


def test_pause_refuses_claims_records_why_and_resume_serves_them_again(
    db_url: str, stocked: psycopg.Connection[tuple[object, ...]]
) -> None:
    paused = cli("pause", "--reason", REASON, "--json", url=db_url)
    assert paused.returncode == 0, paused.stderr
    answer = json.loads(paused.stdout)
    assert answer["reason"] == REASON
    assert answer["already_paused"] is False
    assert answer["waited_for"] == []
    handed_out = stocked.execute(
        "SELECT count(*) FROM allocator.blocks WHERE claimed_at IS NOT NULL"
    ).fetchone()
    for _ in range(3):
        assert claim_state(stocked) == "AL004"
    assert (
        stocked.execute(
            "SELECT count(*) FROM allocator.blocks WHERE claimed_at IS NOT NULL"
        ).fetchone()
        == handed_out
    )

    again = cli("pause", "--reason", "twice", url=db_url)
    assert again.returncode == 0, again.stderr
    assert "claims were already paused" in again.stdout
    assert REASON in again.stdout

    resumed = cli("resume", "--reason", "restore done", "--json", url=db_url)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["was_paused"] is True
    assert claim_state(stocked) is None
    not_paused = cli("resume", "--reason", "again", url=db_url)
    assert not_paused.returncode == 0, not_paused.stderr
    assert "claims were not paused; nothing changed" in not_paused.stdout
    record = stocked.execute(
        "SELECT reason, resume_reason, paused_by = resumed_by FROM allocator.claim_pause_history"
    ).fetchall()
    assert record == [(REASON, "restore done", True)]


@pytest.mark.usefixtures("stocked")
def test_pause_waits_for_a_claim_begun_before_it(db_url: str) -> None:
    with psycopg.connect(db_url, application_name="slow-consumer") as holder:
        claim(holder, "slow")  # its transaction stays open: a claim in flight
        pause = subprocess.Popen(
            command("pause", "--reason", REASON, "--json", url=db_url),
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            with psycopg.connect(db_url, autocommit=True) as probe:
                # The pause has committed: read, not claimed (a probe's claim holds the
                # claims' lock for a moment, and the pause may list it beside ours: CI #26).
                while not claims_paused(probe):
                    assert pause.poll() is None, pause.communicate()
                # ... and has listed the claims in flight (it lists them again while it
                # waits): ending the claim before that listing would leave nothing to wait for.
                while not pause_has_listed(probe):
                    assert pause.poll() is None, pause.communicate()
            assert pause.poll() is None  # the claim in flight is still open
            holder.commit()
            out, err = pause.communicate(timeout=60)
        finally:
            if pause.poll() is None:
                pause.kill()
    assert pause.returncode == 0, err
    waited = json.loads(out)["waited_for"]
    assert [c["application_name"] for c in waited] == ["slow-consumer"]


@pytest.mark.usefixtures("stocked")
def test_a_claim_open_past_the_timeout_is_named_and_claims_stay_paused(db_url: str) -> None:
    with psycopg.connect(db_url, application_name="stuck-consumer") as holder:
        claim(holder, "stuck")
        done = cli("pause", "--reason", REASON, "--timeout", "500ms", url=db_url)
        assert done.returncode == EX_TEMPFAIL, done.stderr
        assert "claims are paused" in done.stderr
        assert f"pid {holder.info.backend_pid}" in done.stderr
        assert "'stuck-consumer'" in done.stderr
        assert "pg_terminate_backend" in done.stderr
        holder.rollback()
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert claim_state(conn) == "AL004"
    again = cli("pause", "--reason", "wait again", url=db_url)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pause", "--reason", "  "], "--reason must say why"),
        (["resume", "--reason", ""], "--reason must say why"),
        (["pause", "--reason", "x", "--timeout", "0s"], "--timeout"),
    ],
)
def test_bad_input_is_refused_before_any_change(db_url: str, args: list[str], message: str) -> None:
    done = cli(*args, url=db_url)
    assert done.returncode == EX_USAGE, done.stderr
    assert message in done.stderr
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT claims_paused FROM allocator.pool_status").fetchone() == (
            False,
        )
