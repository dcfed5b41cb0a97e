"""An allocator node (`allocator run`): election, fence takeover, leader jobs, self-stop.

Rules (DESIGN §3, §4; the invariants I3 and I6):
- A node writes only inside a :class:`~allocator.leadership.Term`: after it is first in the
  election AND its fence takeover (token = czxid of its own znode) committed. Every write
  checks ``term.may_write()`` before it starts and again right before COMMIT.
- SUSPENDED pauses the term from the kazoo listener at once. Reconnecting with the same
  session resumes it only after the node re-checks that its znode still exists and is owned
  by this session with the same czxid. While leading, that check also runs every
  ``RECHECK_INTERVAL_S``; a missing node ends the term.
- Session loss (kazoo LOST, or suspended for a whole session timeout by our own timer):
  leader jobs stop first, then the node exits with ``EXIT_SESSION_LOST`` (a supervisor
  restarts it with a fresh session), or with ``node.on_session_loss = "rejoin"`` it re-enters
  the election with a new session. Followers do the same: they hold ephemeral nodes too.
- A write PostgreSQL rejects as fenced (AL100) means another node holds the fence: the node
  ends its term and exits with ``EXIT_FENCED``.
- Graceful step-down (`allocator step-down`, POST /step-down) and SIGTERM: stop the jobs,
  record the end of the term, delete the znode (the next node takes over at once); step-down
  then rejoins at the back of the queue, SIGTERM exits 0.
- The constructor does no I/O; :meth:`Node.run` does it all and always cleans up.

Exit codes: 0 stopped on request; 3 ZooKeeper session lost; 4 fenced by a newer leader;
69/70/75/78 as for every command (missing prerequisite, bug, unavailable, bad config).

Test hooks (tests/chaos only; off unless ``allocator run`` reads their variable, see
:mod:`allocator.commands.run`, which logs each one loudly at start):
- ``expose_session_password`` (``ALLOCATOR_TEST_EXPOSE_SESSION=1``): ``/status`` also shows
  the ZooKeeper session password, so a test can force a real server-side expiry. ``/status``
  always shows the session id (hex); never the password otherwise.
- ``unsafe_no_fence`` (``ALLOCATOR_TEST_UNSAFE_NO_FENCE=1``): a deliberate dual master, the
  proof that the chaos checker catches stale writes. The term's ``may_write`` ignores the
  session and the term's end; blocks are written by a plain INSERT (superuser URL needed),
  bypassing ``cut_blocks``' fence and mark checks; fenced maintenance writes that fail are
  ignored. Never set it outside a test.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from allocator.admin import AdminServer
from allocator.config import Config
from allocator.db import CommitCheck, CutResult, NodeDatabase
from allocator.election import (
    Election,
    ElectionNodeLostError,
    Identity,
    ZooKeeperCallTimeoutError,
)
from allocator.errors import (
    AllocatorError,
    DatabaseError,
    FencedError,
    StaleTakeoverError,
    ZooKeeperUnavailableError,
)
from allocator.leadership import SessionGuard, Term
from allocator.metrics import NodeMetrics
from jobs.context import LeaderContext, wall_clock_ms
from jobs.leader import LeaderJobs

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_SESSION_LOST = 3
EXIT_FENCED = 4

RECHECK_INTERVAL_S = 0.5
STALE_TAKEOVER_BACKOFF_S = 2.0
JOB_STOP_TIMEOUT_S = 10.0


class Node:
    def __init__(
        self,
        config: Config,
        *,
        host: str | None = None,
        pid: int | None = None,
        now_ms: Callable[[], int] = wall_clock_ms,
        expose_session_password: bool = False,
        unsafe_no_fence: bool = False,
    ) -> None:
        self._config = config
        self._now_ms = now_ms
        self.name = config.node.resolved_name()
        self._host = host or socket.gethostname()
        self._pid = pid or os.getpid()
        self._metrics = NodeMetrics()
        self._metrics.session.state("connecting")
        # Test hooks (module docstring): both False in production.
        self._expose_session_password = expose_session_password
        self._unsafe_no_fence = unsafe_no_fence
        database = _UnsafeNodeDatabase if unsafe_no_fence else NodeDatabase
        self._db = database(config.postgres, node_name=self.name)
        zk = config.zookeeper
        auth = zk.auth.get_secret_value()
        self._zk = KazooClient(
            hosts=zk.hosts,
            timeout=zk.session_timeout_ms / 1000,
            connection_retry=KazooRetry(
                max_tries=-1,
                delay=0.1,
                backoff=2,
                max_jitter=0.4,
                max_delay=zk.max_reconnect_delay_s,
            ),
            command_retry=KazooRetry(max_tries=3, delay=0.1, backoff=2, max_delay=1.0),
            auth_data=[("digest", auth)] if auth else None,
        )
        self._guard = SessionGuard(zk.session_timeout_ms / 1000)
        self._jobs = LeaderJobs()
        self._admin = AdminServer(
            config.node.admin_address,
            config.node.admin_token.get_secret_value(),
            self._metrics,
            snapshot=self.snapshot,
            healthy=lambda: not self._guard.lost,
            ready=lambda: self._guard.connected,
            step_down=self.request_step_down,
        )
        self._election: Election | None = None
        self._stop = threading.Event()
        self._interrupt = threading.Event()  # wakes a waiting follower: stop or session loss
        self._wake = threading.Event()  # wakes the leader's watch loop
        self._step_down = threading.Event()
        self._fenced = threading.Event()
        self._term: Term | None = None
        self._role = "starting"
        self._since = time.time()

    # -- requests from other threads (signals, admin HTTP) --------------------------------

    def request_stop(self, reason: str = "shutdown") -> None:
        log.info("event=stop_requested reason=%s", reason)
        self._stop.set()
        self._interrupt.set()
        self._wake.set()

    def request_step_down(self) -> bool:
        """Ask the leader to hand over; False when this node is not leading."""
        if self._term is None or self._term.ended:
            return False
        self._step_down.set()
        self._wake.set()
        return True

    @property
    def metrics(self) -> NodeMetrics:
        return self._metrics

    def session_credentials(self) -> tuple[int, bytes] | None:
        """(session id, password) of the live ZooKeeper session: for forced-expiry drills."""
        client_id: tuple[int, bytes] | None = self._zk.client_id
        return client_id

    def snapshot(self) -> dict[str, Any]:
        term = self._term
        client_id = self.session_credentials()
        snapshot = {
            "name": self.name,
            "host": self._host,
            "pid": self._pid,
            "role": self._role,
            "epoch": term.epoch if term and not term.ended else None,
            "may_write": bool(term and term.may_write()),
            "session": self._session_state(),
            "session_id": f"{client_id[0]:#x}" if client_id else None,
            "znode": self._election.znode if self._election else None,
            "admin_url": self._admin.url,
            "since": self._since,
        }
        if self._expose_session_password and client_id:  # TEST HOOK: never in production
            snapshot["session_password"] = client_id[1].hex()
        return snapshot

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped, fenced or the session is lost; returns the exit code."""
        config = self._config
        try:
            self._db.open(timeout=config.postgres.connect_timeout_s)
            self._admin.start()
            identity = Identity(self.name, self._host, self._pid, self._admin.url)
            self._election = Election(self._zk, config.zookeeper.election_path, identity)
            self._jobs.start_scheduler()
            self._zk.add_listener(self._on_session_state)
            try:
                self._zk.start(timeout=config.zookeeper.connect_timeout_s)
            except KazooTimeoutError as exc:
                raise ZooKeeperUnavailableError(
                    f"no ZooKeeper server answered at {config.zookeeper.hosts} "
                    f"within {config.zookeeper.connect_timeout_s} s"
                ) from exc
            log.info("event=started name=%s admin_url=%s", self.name, self._admin.url)
            return self._loop(self._election)
        finally:
            self._shutdown()

    def _loop(self, election: Election) -> int:
        while not self._stop.is_set():
            if self._guard.check_timer():
                action = self._config.node.on_session_loss
                log.error(
                    "event=session_loss_handled name=%s action=%s reason=%s",
                    self.name,
                    action,
                    self._guard.lost_reason,
                )
                if action == "exit":
                    return EXIT_SESSION_LOST
                self._rejoin(election)
                continue
            try:
                election.join()
                self._role = "follower"
                if not election.wait_until_first(self._interrupt, recheck_s=RECHECK_INTERVAL_S):
                    continue
                code = self._lead(election)
                if code is not None:
                    return code
            except (KazooException, ElectionNodeLostError, ZooKeeperCallTimeoutError) as exc:
                log.warning("event=zookeeper_error name=%s error=%r", self.name, exc)
                self._wait_for_session()
        return EXIT_OK

    def _lead(self, election: Election) -> int | None:
        token = election.token()
        try:
            takeover = self._db.take_fence(token, self.name, self._host, self._pid)
        except StaleTakeoverError as exc:
            log.error("event=fence_stale name=%s epoch=%s error=%s", self.name, token, exc)
            self._leave(election)
            self._stop.wait(STALE_TAKEOVER_BACKOFF_S)
            return None
        except DatabaseError as exc:
            log.error("event=takeover_failed name=%s epoch=%s error=%s", self.name, token, exc)
            self._leave(election)
            self._stop.wait(STALE_TAKEOVER_BACKOFF_S)
            return None
        term = (_UnsafeTerm if self._unsafe_no_fence else Term)(token, self._guard)
        self._term = term
        self._fenced.clear()
        term.activate()
        self._role = "leader"
        self._since = time.time()
        self._metrics.terms.inc()
        self._metrics.fence_epoch.set(token)
        self._metrics.is_leader.set(1)
        log.info(
            "event=elected name=%s epoch=%s previous_epoch=%s high_water_id=%s",
            self.name,
            token,
            takeover.previous_epoch,
            takeover.high_water_id,
        )
        log.info("event=fence_taken name=%s epoch=%s", self.name, token)
        self._jobs.start(
            LeaderContext(
                term,
                self._db,
                self._config,
                self._metrics,
                on_fenced=self._on_fenced,
                now_ms=self._now_ms,
            )
        )
        reason = self._watch_term(term, election)
        term.end(reason)
        self._metrics.is_leader.set(0)
        if not self._jobs.stop(JOB_STOP_TIMEOUT_S):
            log.error("event=job_stop_timeout name=%s epoch=%s", self.name, token)
        self._role = "stopping" if reason == "shutdown" else "follower"
        self._term = None
        log.info("event=stepped_down name=%s epoch=%s reason=%s", self.name, token, reason)
        if reason in ("shutdown", "stepped_down"):
            self._end_term(token, reason)
            self._leave(election)  # hands over at once; step-down rejoins at the back
            return None
        if reason == "fenced":
            return EXIT_FENCED
        if reason == "znode_lost":
            self._end_term(token, reason)
        return None

    def _watch_term(self, term: Term, election: Election) -> str:
        """Wait while leading; return why the term ends. Pauses/resumes on session flaps."""
        while True:
            self._wake.wait(RECHECK_INTERVAL_S)
            self._wake.clear()
            if self._guard.check_timer() or self._guard.lost:
                return "session_lost"
            if self._fenced.is_set():
                return "fenced"
            if self._stop.is_set():
                return "shutdown"
            if self._step_down.is_set():
                self._step_down.clear()
                return "stepped_down"
            if not self._guard.connected:
                term.pause()
                continue
            try:
                if not election.still_ours() or election.token() != term.epoch:
                    return "znode_lost"
            except (KazooException, ElectionNodeLostError, ZooKeeperCallTimeoutError):
                term.pause()
                continue
            if not term.may_write():
                log.info("event=resumed name=%s epoch=%s", self.name, term.epoch)
            term.activate()

    def _rejoin(self, election: Election) -> None:
        log.info("event=rejoin name=%s", self.name)
        self._guard.reset()
        self._interrupt.clear()
        if self._zk.connected:
            self._guard(KazooState.CONNECTED)
        self._wait_for_session()
        self._leave(election)  # only deletes a node this (new) session owns

    def _leave(self, election: Election) -> None:
        """Delete our znode; if ZooKeeper cannot be reached, closing the session will."""
        try:
            election.leave()
        except (KazooException, ZooKeeperCallTimeoutError) as exc:
            log.warning("event=leave_failed name=%s error=%r", self.name, exc)

    def _wait_for_session(self) -> None:
        while not self._stop.is_set():
            if self._guard.check_timer() or self._guard.connected:
                return
            self._guard.changed.wait(0.1)
            self._guard.changed.clear()

    def _end_term(self, epoch: int, reason: str) -> None:
        try:
            self._db.end_term(epoch, reason)
        except AllocatorError as exc:
            log.warning("event=end_term_failed epoch=%s error=%s", epoch, exc)

    def _on_fenced(self, exc: FencedError) -> None:
        log.error("event=fenced_write_rejected name=%s error=%s", self.name, exc)
        if self._term is not None:
            self._term.pause()
        self._fenced.set()
        self._wake.set()

    # kazoo listener: runs on the connection thread; only flips flags.
    def _on_session_state(self, state: KazooState) -> None:
        self._guard(state)
        if state != KazooState.CONNECTED and self._term is not None:
            self._term.pause()
        if state == KazooState.LOST:
            self._interrupt.set()
        self._metrics.session.state(self._session_state())
        if self._stop.is_set() and state == KazooState.LOST:
            log.info("event=session_closed name=%s", self.name)  # our own zk.stop()
        else:
            log.info("event=session_%s name=%s", str(state).lower(), self.name)
        self._wake.set()

    def _session_state(self) -> str:
        if self._guard.lost:
            return "lost"
        if self._guard.connected:
            return "connected"
        return "suspended" if self._role != "starting" else "connecting"

    def _shutdown(self) -> None:
        self._interrupt.set()
        term = self._term
        if term is not None:
            term.end("shutdown")
        self._jobs.stop(JOB_STOP_TIMEOUT_S)
        self._jobs.shutdown()
        try:
            self._zk.stop()
            self._zk.close()
        except KazooException as exc:
            log.warning("event=zookeeper_close_failed error=%r", exc)
        self._db.close()
        self._admin.stop()
        log.info("event=stopped name=%s", self.name)


# -- TEST HOOK: ALLOCATOR_TEST_UNSAFE_NO_FENCE=1 only (tests/chaos/test_checker_proof.py) --
# A deliberately broken leader, so the chaos checker can be shown to catch a dual master.
# The SQL lives here, not in allocator.sql, because no production path may ever use it.

_UNSAFE_POSITIONS = (
    "SELECT h.last_ticket, (SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END"
    " FROM allocator.claim_ticket s) FROM allocator.high_water h FOR UPDATE"
)
_UNSAFE_INSERT = (
    "INSERT INTO allocator.blocks (ticket, first_id, last_id, epoch)"
    " SELECT %(first_ticket)s + u.o - 1, u.f, u.l, %(epoch)s"
    " FROM unnest(%(first_ids)s::bigint[], %(last_ids)s::bigint[]) WITH ORDINALITY AS u(f, l, o)"
)
_UNSAFE_ADVANCE = (
    "UPDATE allocator.high_water SET last_id = greatest(last_id, %(last_id)s),"
    " last_ticket = greatest(last_ticket, %(last_ticket)s), updated_at = statement_timestamp()"
)


class _UnsafeTerm(Term):
    """TEST ONLY: may always write, whatever the session says and after the term ended."""

    def may_write(self) -> bool:
        return True


class _UnsafeNodeDatabase(NodeDatabase):
    """TEST ONLY: block writes by plain INSERT, with no fence and no high-water check."""

    def cut_blocks(
        self,
        epoch: int,
        ranges: Sequence[tuple[int, int]],
        commit_if: CommitCheck | None = None,
    ) -> CutResult:
        what = "cut blocks (UNSAFE: unfenced test hook)"
        log.warning(
            "event=unsafe_unfenced_write epoch=%s blocks=%d first_id=%s (TEST HOOK)",
            epoch,
            len(ranges),
            ranges[0][0] if ranges else None,
        )
        with self._connection(what) as conn, conn.transaction():
            row = conn.execute(_UNSAFE_POSITIONS).fetchone()
            if row is None:
                raise DatabaseError(f"{what}: the database returned no row")
            first_ticket = max(int(row[0]), int(row[1])) + 1
            conn.execute(
                _UNSAFE_INSERT,
                {
                    "first_ticket": first_ticket,
                    "epoch": epoch,
                    "first_ids": [first for first, _ in ranges],
                    "last_ids": [last for _, last in ranges],
                },
            )
            last_ticket = first_ticket + len(ranges) - 1
            conn.execute(_UNSAFE_ADVANCE, {"last_id": ranges[-1][1], "last_ticket": last_ticket})
        return CutResult(high_water_id=ranges[-1][1], last_ticket=last_ticket)

    def requeue_stranded(self, epoch: int, commit_if: CommitCheck | None = None) -> int:
        try:
            return super().requeue_stranded(epoch, commit_if)
        except FencedError:
            return 0  # a stale unsafe leader carries on regardless

    def prune_claimed(
        self,
        epoch: int,
        claimed_before: datetime,
        limit: int,
        commit_if: CommitCheck | None = None,
    ) -> int:
        try:
            return super().prune_claimed(epoch, claimed_before, limit, commit_if)
        except FencedError:
            return 0
