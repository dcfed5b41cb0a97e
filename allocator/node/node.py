"""An allocator node (``allocator run``): the collaborators composed, the run loop, the
exit.

Exit codes: 0 stopped on request; 3 ZooKeeper session lost (only with
``node.on_session_loss = "exit"``; the default rejoins); 4 fenced by a newer leader;
69/70/75/78 as for every command (missing prerequisite, bug, unavailable, bad
configuration; 78 also for a schema revision this release cannot use).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException, NoAuthError, NoNodeError

from allocator.config import Config, runway
from allocator.core import logs
from allocator.core.clock import wall_clock_ms
from allocator.core.errors import SchemaMismatchError
from allocator.core.health import NodeHealth
from allocator.core.leadership import SessionGuard, Term
from allocator.http.admin import AdminServer
from allocator.metrics import NodeMetrics
from allocator.node.blockers import Blockers
from allocator.node.candidacy import Candidacy, Taken
from allocator.node.cluster_view import ClusterView
from allocator.node.exits import EXIT_OK, EXIT_SESSION_LOST
from allocator.node.handover import Handover
from allocator.node.leading import Leading, TermFactory
from allocator.node.pacing import Pacing
from allocator.node.pool_watch import PoolWatch
from allocator.node.probe import Prober, ready
from allocator.node.schema_guard import SchemaGuard
from allocator.node.seams import LeaderJobsPort, NodeStore, ZooKeeperFactory
from allocator.node.session import ZooKeeperSession
from allocator.node.session_record import SessionRecorder
from allocator.node.signals import Signals
from allocator.node.step_clock import StepClock
from allocator.node.watermark import WatermarkKeeper
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.calls import ZooKeeperCallTimeoutError
from allocator.zookeeper.election import ElectionNodeLostError, Identity, Queue

log = logs.get_logger(__name__)


class Node:
    """One allocator node: what it talks to comes in (:mod:`allocator.node.seams`), the run
    does the I/O.

    It receives the store, a ZooKeeper client factory, the leader's jobs and the clock; the
    constructor does no I/O; :meth:`run` does it all and always cleans up.
    """

    def __init__(
        self,
        config: Config,
        *,
        store: NodeStore,
        zookeeper: ZooKeeperFactory,
        jobs: LeaderJobsPort,
        zookeeper_root: ZooKeeperFactory | None = None,
        metrics: NodeMetrics | None = None,
        health: NodeHealth | None = None,
        now_ms: Callable[[], int] = wall_clock_ms,
        host: str | None = None,
        pid: int | None = None,
        term_factory: TermFactory = Term,
        pacing: Pacing | None = None,
    ) -> None:
        self._config = config
        self.name = config.node.resolved_name()
        self._host = host or socket.gethostname()
        self._pid = pid or os.getpid()
        self._metrics = metrics or NodeMetrics()
        self._health = health or NodeHealth()
        self._store = store
        self._jobs = jobs
        self._pacing = pacing or Pacing()
        self._signals = Signals()
        self._guard = SessionGuard(config.zookeeper.session_timeout_ms / 1000)
        self._pool_watch = PoolWatch(store, config, self._metrics)
        ends_at_ms = config.layout.ends_at_ms
        self._metrics.layout_time_left_seconds.set_function(
            lambda: max(0.0, (ends_at_ms - now_ms()) / 1000)
        )
        self._blockers = Blockers(self.name, self._metrics, self._signals)
        self._watermark = WatermarkKeeper(self.name, self._blockers)
        self._handover = Handover(self.name, config, self._health, self._pool_watch, self._metrics)
        self._recorder = SessionRecorder(config, self.name, self._host, self._pid)
        self._schema = SchemaGuard(self.name, store)
        self._prober = Prober(
            self.name,
            config,
            store=store,
            now_ms=now_ms,
            health=self._health,
            metrics=self._metrics,
            pool_watch=self._pool_watch,
            guard=self._guard,
            closing=self._signals.closing,
            pacing=self._pacing,
            identity=self._identity,
            election=lambda: self._session.election,
            reconnected=self._check_schema_again,
        )
        self._leading = Leading(
            self.name,
            store=store,
            jobs=jobs,
            health=self._health,
            metrics=self._metrics,
            pool_watch=self._pool_watch,
            guard=self._guard,
            handover=self._handover,
            watermark=self._watermark,
            signals=self._signals,
            pacing=self._pacing,
            term_factory=term_factory,
            check_clock=self._prober.probe_once,
        )
        self._candidacy = Candidacy(
            self.name,
            self._host,
            self._pid,
            store=store,
            health=self._health,
            metrics=self._metrics,
            blockers=self._blockers,
            watermark=self._watermark,
            signals=self._signals,
            pacing=self._pacing,
            spent=lambda: self._leading.last_token,
        )
        self._session = ZooKeeperSession(
            config,
            self.name,
            factory=zookeeper,
            root_factory=zookeeper_root,
            guard=self._guard,
            metrics=self._metrics,
            signals=self._signals,
            pacing=self._pacing,
            recorder=self._recorder,
            identity=self._identity,
            pause_term=self._leading.pause_term,
        )
        self._cluster = ClusterView(self._read_queue, store)  # the status page's view
        self._admin = AdminServer(
            config.node.admin_address,
            config.node.admin_token.get_secret_value(),
            self._metrics,
            snapshot=self.snapshot,
            healthy=self._healthy,
            ready=lambda: ready(self._guard, self._health, self._pool_watch),
            step_down=self.request_step_down,
            cluster=self._cluster.to_json,
            max_threads=config.node.admin_max_threads,
            timeout_s=config.node.admin_timeout_s,
        )
        self._probe_thread: threading.Thread | None = None

    # -- requests from other threads (signals, admin HTTP) --------------------------------

    def request_stop(self, reason: str = "shutdown") -> None:
        """Ask the run to stop (a signal handler, the admin server): it hands over and exits
        0.
        """
        asked_at = time.monotonic()  # a handover's profile starts here
        log.info("stop_requested", reason=reason)
        self._signals.ask(self._signals.stop, asked_at)
        self._signals.interrupt.set()

    def request_step_down(self) -> bool:
        """Ask the leader to hand over; False when this node is not leading."""
        return self._leading.request_step_down()

    @property
    def metrics(self) -> NodeMetrics:
        """The node's metrics, for the admin server."""
        return self._metrics

    @property
    def health(self) -> NodeHealth:
        """What the node knows about its fitness to lead."""
        return self._health

    @property
    def role(self) -> str:
        """follower, blocked or leader (``/status``, the metric)."""
        return self._signals.role

    def session_credentials(self) -> tuple[int, bytes] | None:
        """(session id, password) of the live ZooKeeper session: for forced-expiry drills."""
        return self._session.credentials()

    def snapshot(self) -> dict[str, Any]:
        """What ``/status`` shows (docs/schemas/node-status.schema.json; never the session
        password)."""
        term = self._leading.term
        client_id = self.session_credentials()
        advert = self._health.advert()
        election = self._session.election
        return {
            "name": self.name,
            "host": self._host,
            "pid": self._pid,
            "role": self._signals.role,
            "epoch": term.epoch if term and not term.ended else None,
            "generation": term.token.generation if term and not term.ended else None,
            "may_write": bool(term and term.may_write()),
            "session": self._session.state(),
            "session_id": f"{client_id[0]:#x}" if client_id else None,
            "znode": election.znode if election else None,
            "admin_url": self._admin.url,
            "since": self._signals.since,
            "database_reachable": advert.db_ok,
            "clock_agrees": advert.clock_ok,
            "clock_offset_ms": self._health.offset_ms,
            "fence_ahead_of_zookeeper": self._blockers.fence_ahead,
            "database_behind_zookeeper": self._blockers.database_behind,
            "blocked": self._blockers.blocked,
            "handover_withheld": self._handover.withheld,
            "async_replication": self._health.async_replication,
            "async_replication_allowed": self._config.postgres.allow_async_replication,
            "ready": ready(self._guard, self._health, self._pool_watch),
            "pool": self._pool_snapshot(),
        }

    def _pool_snapshot(self) -> dict[str, Any] | None:
        """This node's last reading of the pool, with what it must cover."""
        status = self._pool_watch.last
        if status is None:
            return None
        return {
            "available_blocks": status.available_blocks,
            "claim_rate_blocks_per_s": status.claim_rate_blocks_per_s,
            "runway_s": status.runway_s,
            "runway_needed_s": runway.needed_runway_s(self._config),
            "covers_handover": runway.rate_warning(self._config, status.claim_rate_blocks_per_s)
            is None,
            "claims_paused": status.claims_paused,
        }

    def _identity(self) -> Identity:
        """What our election znode advertises."""
        advert = self._health.advert()
        return Identity(
            self.name,
            self._host,
            self._pid,
            self._admin.url,
            db_ok=advert.db_ok,
            clock_ok=advert.clock_ok,
            blocked=self._blockers.reason(),
        )

    def _healthy(self) -> bool:
        """``/healthz``: false only once the session is lost and the node will exit for it
        (``node.on_session_loss = "exit"``); a node rejoining after a loss is alive and
        working its way back, and a liveness probe must not kill it."""
        return not self._guard.lost or self._config.node.on_session_loss == "rejoin"

    def _read_queue(self) -> Queue | None:
        """The whole election for the status page; None while there is no session to ask."""
        election = self._session.election
        if election is None or not self._guard.connected:
            return None
        return election.queue()

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped, fenced or the session is lost; returns the exit code. A schema
        this release cannot use (:mod:`allocator.node.schema_guard`), at start or on a
        reconnect, raises :class:`SchemaMismatchError` (exit 78)."""
        config = self._config
        try:
            zkclient.check_node(config)  # before anything starts: no ACLs, no node
            self._session.warn_insecure()
            self._recorder.prepare()
            self._store.open(timeout=config.postgres.connect_timeout_s)
            self._schema.check("start")
            self._admin.start()
            self._jobs.start_scheduler()
            self._session.start()
            self._session.secure_znodes()
            log.info("started", name=self.name, admin_url=self._admin.url)
            self._warn_async_replication()
            self._probe_thread = threading.Thread(
                target=self._prober.loop, name="db-probe", daemon=True
            )
            self._probe_thread.start()
            self._cluster.start()
            code = self._loop()
        finally:
            self._shutdown()
        if self._schema.refusal is not None:  # met on a reconnect: the node stopped for it
            raise self._schema.refusal
        return code

    def _check_schema_again(self) -> None:
        """The database answers again after an outage: a schema this node cannot use stops
        it (handed over like a SIGTERM; the run then raises the refusal, exit 78)."""
        try:
            self._schema.check("reconnect")
        except SchemaMismatchError as exc:
            self._schema.refusal = exc
            self.request_stop("schema_refused")

    def _warn_async_replication(self) -> None:
        allowed = self._config.postgres.allow_async_replication
        self._metrics.async_replication_allowed.set(int(allowed))
        if allowed:
            log.warning(
                "async_replication_allowed",
                name=self.name,
                note="postgres.allow_async_replication is set; this node cuts even when "
                "no standby confirms commits, and a failover to such a standby can hand "
                "out IDs twice",
            )

    def _loop(self) -> int:
        signals = self._signals
        while not signals.stop.is_set():
            election = self._session.election
            assert election is not None
            if self._guard.check_timer():
                action = self._config.node.on_session_loss
                log.error(
                    "session_loss_handled",
                    name=self.name,
                    action=action,
                    reason=self._guard.lost_reason,
                )
                if action == "exit":
                    return EXIT_SESSION_LOST
                self._blockers.clear_all()  # judged again once first in the new session
                self._session.recover()  # keeps the session or gets a new one, old one closed
                continue
            try:
                election.join()
                if self._blockers.blocked is None:  # stays until the node leads or leaves
                    signals.role = "follower"
                if not election.wait_until_first(signals.interrupt, self._pacing.recheck_s):
                    continue
                steps = StepClock(election.woken_at)
                steps.lap("first_checked")
                taken = self._candidacy.take(election, steps)
                if isinstance(taken, Taken):
                    code = self._leading.lead(election, taken.token, taken.takeover, steps)
                else:
                    code = taken
                if code is not None:
                    return code
            except NoNodeError:
                self._session.recreate_chroot()
            except NoAuthError as exc:  # the ACL is another identity's: no retry can help
                raise zkclient.access_refused(self._config, "join the election") from exc
            except (KazooException, ElectionNodeLostError, ZooKeeperCallTimeoutError) as exc:
                log.warning("zookeeper_error", name=self.name, error=repr(exc))
                self._session.wait()
                signals.stop.wait(self._pacing.zookeeper_error_backoff_s)
        return EXIT_OK

    def _shutdown(self) -> None:
        self._signals.closing.set()
        self._signals.interrupt.set()
        term = self._leading.term
        if term is not None:
            term.end("shutdown")
        self._jobs.stop(self._pacing.job_stop_timeout_s)
        self._jobs.shutdown()
        self._session.close()
        if self._probe_thread is not None:
            self._probe_thread.join(timeout=self._pacing.job_stop_timeout_s)
        self._cluster.stop()
        self._store.close()
        self._admin.stop()
        log.info("stopped", name=self.name)
