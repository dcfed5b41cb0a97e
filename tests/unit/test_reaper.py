"""The reaper's decision (:func:`allocator.reaper.decide`): nothing attaches to a session
before its process is proved dead on this host; files of others are ignored, never acted
on; a paused (alive) process is never reaped. Plus the session file it reads."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from allocator import reaper, session_file
from allocator.reaper import Action, Self
from allocator.session_file import SessionRecord

ME = Self(zookeeper_hosts="127.0.0.1:2181/allocator", election_path="/election",
          name="node-1", host="host-a")  # fmt: skip
RECORD = SessionRecord(
    name="node-1",
    host="host-a",
    pid=4242,
    zookeeper_hosts="127.0.0.1:2181/allocator",
    session_id=0x1000001,
    session_password=b"\x01" * 16,
    written_at=1.0,
    election_path="/election",
    start_time=777,
    boot_id="boot-1",
)


def decide(record: SessionRecord | None, started: int | None = 777, **kwargs: object):  # type: ignore[no-untyped-def]
    return reaper.decide(
        record,
        ME,
        boot_id_now="boot-1",
        started=lambda _pid: started,
        **kwargs,  # type: ignore[arg-type]
    )


def test_no_file_means_nothing_to_do() -> None:
    assert decide(None).action is Action.NOTHING


def test_a_live_process_with_its_start_time_is_never_reaped() -> None:
    """SIGSTOPped or running: the pid still has the recorded start time."""
    decision = decide(RECORD, started=777)
    assert decision.action is Action.ALIVE
    assert "not reaped" in decision.reason


@pytest.mark.parametrize(("started", "why"), [(None, "no longer runs"), (778, "another process")])
def test_a_gone_or_reused_pid_is_reaped(started: int | None, why: str) -> None:
    decision = decide(RECORD, started=started)
    assert decision.action is Action.REAP
    assert why in decision.reason


def test_a_reboot_proves_the_process_dead() -> None:
    decision = reaper.decide(RECORD, ME, boot_id_now="boot-2", started=lambda _pid: 777)
    assert decision.action is Action.REAP
    assert "rebooted" in decision.reason


def test_the_supervisors_child_handle_proves_it_dead() -> None:
    assert decide(RECORD, started=777, exited_pid=4242).action is Action.REAP
    # a handle of another pid proves nothing about this file
    assert decide(RECORD, started=777, exited_pid=9).action is Action.ALIVE


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"zookeeper_hosts": "127.0.0.1:2181/other"}, "another cluster"),
        ({"election_path": "/other"}, "another cluster"),
        ({"name": "node-2"}, "another node"),
        ({"host": "host-b"}, "another host"),
    ],
)
def test_files_of_others_are_ignored_even_when_their_process_is_dead(
    change: dict[str, str], why: str
) -> None:
    decision = decide(dataclasses.replace(RECORD, **change), started=None, exited_pid=4242)  # type: ignore[arg-type]
    assert decision.action is Action.IGNORE
    assert why in decision.reason


def test_a_file_without_a_start_time_is_not_enough_to_reap_a_running_pid() -> None:
    assert decide(dataclasses.replace(RECORD, start_time=None), started=5).action is Action.ALIVE
    assert decide(dataclasses.replace(RECORD, start_time=None), started=None).action is Action.REAP


def test_an_unreadable_or_old_version_file_is_ignored_and_kept(tmp_path: Path) -> None:
    session_file.prepare(tmp_path)
    path = session_file.path_in(tmp_path)
    path.write_text('{"version": 1, "name": "node-1"}')
    decision = reaper.reap(tmp_path, ME, timeout_s=0.1)
    assert decision.action is Action.IGNORE
    assert "version" in decision.reason
    assert path.exists()
    path.write_text("not json")
    assert reaper.reap(tmp_path, ME, timeout_s=0.1).action is Action.IGNORE


def test_a_live_processs_file_is_kept(tmp_path: Path) -> None:
    """The test process itself: alive, with its real start time."""
    session_file.prepare(tmp_path)
    own = dataclasses.replace(
        RECORD, pid=os.getpid(), start_time=reaper.own_start_time(os.getpid()),
        boot_id=reaper.boot_id(),
    )  # fmt: skip
    session_file.write(tmp_path, own)
    assert reaper.reap(tmp_path, ME, timeout_s=0.1).action is Action.ALIVE
    assert session_file.read(tmp_path) is not None


def test_the_session_file_keeps_what_a_reaper_needs(tmp_path: Path) -> None:
    session_file.prepare(tmp_path)
    session_file.write(tmp_path, RECORD)
    read = session_file.read(tmp_path)
    assert read is not None
    assert (read.election_path, read.start_time, read.boot_id) == ("/election", 777, "boot-1")
    assert session_file.path_in(tmp_path).stat().st_mode & 0o777 == 0o600


def test_this_hosts_boot_id_and_own_start_time_are_known() -> None:
    assert reaper.boot_id()  # Linux
    assert reaper.own_start_time(os.getpid()) is not None
