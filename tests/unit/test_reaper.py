"""The reaper's decision (:func:`allocator.session.reaper.decide`): nothing attaches to a session
before its process is proved dead on this host: by the child handle, a reboot, the state
folder's lock its writer no longer holds, or its pid judged in the pid namespace the file
was written in; files of others are ignored, never acted on; a paused (alive) process is
never reaped; what the reaper cannot see (another pid namespace, an unreadable ``/proc``)
is alive. Plus the session file it reads (issue 19, item 5). The file it removes:
test_reaper_successor."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from allocator.local import processes
from allocator.session import file as session_file
from allocator.session import reaper
from allocator.session.file import SessionRecord
from allocator.session.reaper import Action, Self
from tests.namespaces import NEW_PID_NAMESPACE, NO_PROC, OUTER_PROC, why_not

ME = Self(zookeeper_hosts="127.0.0.1:2181/allocator", election_path="/election",
          name="node-1", host="host-a")  # fmt: skip
NS = 4026531836
"""The pid namespace the record was written in, and (unless a test says otherwise) the
reaper's own."""
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
    pid_namespace=NS,
)


def decide(record: SessionRecord | None, started: int | None = 777, **kwargs: object):  # type: ignore[no-untyped-def]
    kwargs.setdefault("boot_id_now", "boot-1")
    kwargs.setdefault("pid_namespace_now", NS)
    return reaper.decide(
        record,
        ME,
        started=lambda _pid: started,
        **kwargs,  # type: ignore[arg-type]
    )


def unreadable(pid: int) -> int | None:
    raise PermissionError(13, "Permission denied", f"/proc/{pid}/stat")


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
    decision = decide(RECORD, started=777, boot_id_now="boot-2")
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


# -- what the reaper cannot see is alive (issue 19, item 5) ---------------------------------


@pytest.mark.parametrize("started", [None, 778, 777])
def test_a_pid_of_another_pid_namespace_is_never_judged(started: int | None) -> None:
    """``docker compose run node-1 reap-session``, a ``kubectl debug`` container: the
    recorded pid means nothing here, whether no such pid runs here or another process (pid
    1, say) holds it."""
    decision = decide(RECORD, started=started, pid_namespace_now=NS + 1)
    assert decision.action is Action.ALIVE
    assert "another pid namespace" in decision.reason


def test_a_reboot_still_proves_death_across_pid_namespaces() -> None:
    decision = decide(RECORD, started=None, pid_namespace_now=NS + 1, boot_id_now="boot-2")
    assert decision.action is Action.REAP
    assert "rebooted" in decision.reason


def test_a_child_handle_proves_nothing_about_a_file_of_another_pid_namespace() -> None:
    """Our child runs in our pid namespace (a process never changes its own), so a file
    written in another one is not our child's, whatever pid it names."""
    decision = decide(RECORD, started=None, pid_namespace_now=NS + 1, exited_pid=4242)
    assert decision.action is Action.ALIVE
    assert "another pid namespace" in decision.reason


@pytest.mark.parametrize("started", [None, 778, 777])
def test_a_reaper_that_cannot_see_itself_judges_no_pid(started: int | None) -> None:
    """``/proc`` not mounted, unreadable, or another pid namespace's: "no such pid" there
    proves nothing."""
    decision = decide(RECORD, started=started, pid_namespace_now=None)
    assert decision.action is Action.ALIVE
    assert "cannot see itself" in decision.reason


def test_a_reaper_that_cannot_see_itself_still_trusts_a_reboot() -> None:
    decision = decide(RECORD, started=None, pid_namespace_now=None, boot_id_now="boot-2")
    assert decision.action is Action.REAP


def test_a_child_handle_of_a_supervisor_that_cannot_see_itself() -> None:
    """It cannot tell the file's pid namespace from its own: only an older file (no
    namespace) is taken as its child's, as before."""
    blind = decide(RECORD, started=None, pid_namespace_now=None, exited_pid=4242)
    assert blind.action is Action.ALIVE
    old = dataclasses.replace(RECORD, pid_namespace=None)
    assert decide(old, started=None, pid_namespace_now=None, exited_pid=4242).action is (
        Action.REAP
    )


@pytest.mark.parametrize("started", [None, 778, 777])
def test_a_file_that_does_not_name_its_pid_namespace_is_judged_only_by_proof_without_a_pid(
    started: int | None,
) -> None:
    """An older release's file: its pid may be of another namespace, so neither "no such
    pid" nor "another start time" proves anything; the child handle and a reboot still do."""
    old = dataclasses.replace(RECORD, pid_namespace=None)
    decision = decide(old, started=started)
    assert decision.action is Action.ALIVE
    assert "pid namespace" in decision.reason
    assert decide(old, started=started, exited_pid=4242).action is Action.REAP
    assert decide(old, started=started, boot_id_now="boot-2").action is Action.REAP


def test_a_pid_proc_cannot_show_is_alive() -> None:
    """``/proc/<pid>`` unreadable (hidepid, a permission, a pid that exists but is hidden):
    not "gone"."""
    decision = reaper.decide(
        RECORD, ME, boot_id_now="boot-1", pid_namespace_now=NS, started=unreadable
    )
    assert decision.action is Action.ALIVE
    assert "cannot read" in decision.reason


# -- the writer's lock: a proof in any pid namespace ------------------------------------------

HELD = dataclasses.replace(RECORD, holds_lock=True)


@pytest.mark.parametrize(("started", "namespace_now"), [(None, NS), (778, NS + 1), (None, None)])
def test_a_writer_that_still_holds_the_lock_is_alive_whatever_its_pid_says(
    started: int | None, namespace_now: int | None
) -> None:
    """``docker compose run node-1 reap-session`` beside the live node (or a paused one):
    the lock is held, so neither a missing pid nor another pid namespace matters."""
    decision = decide(HELD, started=started, pid_namespace_now=namespace_now, lock_held=True)
    assert decision.action is Action.ALIVE
    assert "holds the state folder's lock" in decision.reason


@pytest.mark.parametrize(("started", "namespace_now"), [(777, NS + 1), (None, None), (777, NS)])
def test_a_lock_nobody_holds_proves_the_writer_gone_in_any_pid_namespace(
    started: int | None, namespace_now: int | None
) -> None:
    """A container restarted in a new pid namespace (Kubernetes, Compose) reaps its
    predecessor, though its pid 1 is not the recorded pid 1."""
    decision = decide(HELD, started=started, pid_namespace_now=namespace_now, lock_held=False)
    assert decision.action is Action.REAP
    assert "no longer holds the state folder's lock" in decision.reason


def test_without_the_lock_the_pid_rules_decide() -> None:
    """A lock that cannot be probed, or a writer that did not hold it (an older release):
    the pid rules, with what they cannot see."""
    assert decide(HELD, started=None, lock_held=None).action is Action.REAP
    assert decide(HELD, started=None, lock_held=None, pid_namespace_now=NS + 1).action is (
        Action.ALIVE
    )
    assert decide(RECORD, started=777, lock_held=False).action is Action.ALIVE
    assert decide(RECORD, started=None, lock_held=True).action is Action.REAP


def test_the_child_handle_comes_before_the_lock_and_the_lock_before_a_reboot() -> None:
    """The supervisor saw its child exit: a held lock is its restarted successor's. A held
    lock proves a live kernel holds it: a reaper reading another boot id (a sandbox with
    a kernel of its own) is not told the writer died."""
    assert decide(HELD, started=None, lock_held=True, exited_pid=4242).action is Action.REAP
    assert decide(HELD, lock_held=True, boot_id_now="boot-2").action is Action.ALIVE
    assert decide(HELD, lock_held=False, boot_id_now="boot-2").action is Action.REAP


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_reap_probes_the_lock_of_the_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose writer (of another pid namespace) holds the folder's lock in another
    process: alive; once that process is killed, the lock is free and it is reaped."""
    session_file.prepare(tmp_path)
    record = _own_record(pid=4242, pid_namespace=NS + 1)
    session_file.write(tmp_path, record)
    raw = json.loads(session_file.path_in(tmp_path).read_text())
    raw["holds_lock"] = True  # as its writer (write with hold) said
    session_file.path_in(tmp_path).write_text(json.dumps(raw))
    monkeypatch.setattr(reaper, "close_session", lambda *_args: True)
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        alive = reaper.reap(tmp_path, ME, timeout_s=0.1)
        assert alive.action is Action.ALIVE, alive.reason
        assert session_file.read(tmp_path) is not None
        holder.kill()  # by its pid: ours
        holder.wait(30)
    reaped = reaper.reap(tmp_path, ME, timeout_s=0.1)
    assert reaped.action is Action.REAP, reaped.reason
    assert session_file.read(tmp_path) is None


# -- what this process sees of itself and of a pid ------------------------------------------


def test_this_processs_pid_namespace_is_the_inode_of_proc_self_ns_pid() -> None:
    assert reaper.pid_namespace() == os.stat("/proc/self/ns/pid").st_ino


def _fake_proc(tmp_path: Path, status: str) -> Path:
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns" / "pid").write_text("")
    (tmp_path / "self" / "status").write_text(f"Name:\tpython\n{status}Uid:\t0\n")
    return tmp_path


def test_a_proc_of_this_pid_namespace_names_its_namespace(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, f"NSpid:\t{os.getpid()}\n")
    assert reaper.pid_namespace(proc) == (proc / "self" / "ns" / "pid").stat().st_ino


@pytest.mark.parametrize(
    "status",
    [
        "NSpid:\t12345\t{pid}\n",  # a /proc of an outer namespace (no --mount-proc)
        "NSpid:\t1\n",  # some other process's view
        "",  # a kernel that does not say (before 4.1)
    ],
    ids=["outer-namespace", "another-process", "kernel-says-nothing"],
)
def test_a_proc_in_which_this_process_is_not_itself_names_no_namespace(
    tmp_path: Path, status: str
) -> None:
    """(Test ids and values do not hold the pid: every pytest worker collects the same.)"""
    status = status.format(pid=os.getpid())
    assert reaper.pid_namespace(_fake_proc(tmp_path, status)) is None


def test_no_proc_names_no_namespace(tmp_path: Path) -> None:
    assert reaper.pid_namespace(tmp_path / "empty") is None


def test_start_time_of_a_live_a_gone_and_a_zombie_pid() -> None:
    own = os.getpid()
    assert reaper.start_time_of(own) == processes.start_time(own)
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert reaper.start_time_of(child.pid) is None
    child.wait()
    assert reaper.start_time_of(child.pid) is None  # gone


def test_start_time_of_a_pid_that_runs_but_proc_does_not_show_raises(tmp_path: Path) -> None:
    """Not in ``/proc`` (hidden, or a /proc that is not ours) but it runs: cannot say."""
    with pytest.raises(OSError, match="does not show"):
        reaper.start_time_of(os.getpid(), proc=tmp_path)
    (tmp_path / str(os.getpid()) / "stat").mkdir(parents=True)  # unreadable as a file
    with pytest.raises(OSError):  # noqa: PT011 - any read error
        reaper.start_time_of(os.getpid(), proc=tmp_path)


def test_this_hosts_boot_id_and_own_start_time_are_known() -> None:
    assert reaper.boot_id()  # Linux
    assert reaper.own_start_time(os.getpid()) is not None


@pytest.fixture
def unshare() -> None:
    reason = why_not()
    if reason:
        pytest.skip(reason)


@pytest.mark.usefixtures("unshare")
@pytest.mark.parametrize(
    ("wrapper", "sees_itself"), [(NEW_PID_NAMESPACE, True), (OUTER_PROC, False), (NO_PROC, False)]
)
def test_a_process_in_a_new_pid_namespace_or_without_proc(
    wrapper: list[str], sees_itself: bool
) -> None:
    """With its own /proc it names its own (new) namespace; with the outer /proc, or none,
    it cannot see itself and names none."""
    code = "from allocator.session import reaper; print(reaper.pid_namespace())"
    done = subprocess.run(
        [*wrapper, sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = done.stdout.strip()
    if sees_itself:
        assert seen.isdigit()
        assert int(seen) != reaper.pid_namespace()
    else:
        assert seen == "None"


# -- reading and reaping --------------------------------------------------------------------


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


def _own_record(**change: object) -> SessionRecord:
    """A file the test process itself (alive, real start time and namespace) wrote."""
    own = dataclasses.replace(
        RECORD, pid=os.getpid(), start_time=reaper.own_start_time(os.getpid()),
        boot_id=reaper.boot_id(), pid_namespace=reaper.pid_namespace(),
    )  # fmt: skip
    return dataclasses.replace(own, **change)  # type: ignore[arg-type]


def test_a_live_processs_file_is_kept(tmp_path: Path) -> None:
    session_file.prepare(tmp_path)
    session_file.write(tmp_path, _own_record())
    assert reaper.reap(tmp_path, ME, timeout_s=0.1).action is Action.ALIVE
    assert session_file.read(tmp_path) is not None


def test_the_session_file_keeps_what_a_reaper_needs(tmp_path: Path) -> None:
    session_file.prepare(tmp_path)
    session_file.write(tmp_path, RECORD)
    read = session_file.read(tmp_path)
    assert read is not None
    assert (read.election_path, read.start_time, read.boot_id, read.pid_namespace) == (
        "/election", 777, "boot-1", NS,
    )  # fmt: skip
    assert session_file.path_in(tmp_path).stat().st_mode & 0o777 == 0o600


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(("alive", "said"), [(True, ""), (False, "gone already")])
def test_a_reaped_sessions_file_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alive: bool, said: str
) -> None:
    session_file.prepare(tmp_path)
    session_file.write(tmp_path, _own_record(pid=_dead_pid()))
    closed: list[int] = []

    def close(_hosts: str, credentials: tuple[int, bytes], _timeout_s: float) -> bool:
        closed.append(credentials[0])
        return alive

    monkeypatch.setattr(reaper, "close_session", close)
    decision = reaper.reap(tmp_path, ME, timeout_s=0.1)
    assert decision.action is Action.REAP
    assert said in decision.reason
    assert closed == [RECORD.session_id]
    assert session_file.read(tmp_path) is None


def test_a_file_that_cannot_be_removed_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_file.prepare(tmp_path)
    session_file.write(tmp_path, _own_record(pid=_dead_pid()))
    monkeypatch.setattr(reaper, "close_session", lambda *_args: True)

    def refuse(_state_dir: Path, **_kwargs: object) -> bool:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(session_file, "remove", refuse)
    decision = reaper.reap(tmp_path, ME, timeout_s=0.1)
    assert decision.action is Action.REAP
    assert "could not be removed" in decision.reason
