"""An allocator node (`allocator run`): election, fence takeover, leader jobs, self-stop.

Rules (DESIGN §3, §4, §11; the invariants I3 and I6):
- A node writes only inside a :class:`~allocator.leadership.Term`: after it is first in the
  election AND its fence takeover committed. The token is ``(generation, czxid)``
  (:mod:`allocator.fence`): the czxid of its own znode and the generation its own session
  reads beside the election path. Every write checks ``term.may_write()`` before it starts
  and again right before COMMIT.
- SUSPENDED pauses the term from the kazoo listener at once. Reconnecting with the same
  session resumes it only after the node re-checks that its znode still exists and is owned
  by this session with the same czxid. While leading, that check also runs every
  ``RECHECK_INTERVAL_S``; a missing node ends the term.
- Session loss (kazoo LOST, or suspended for a whole session timeout by our own timer):
  leader jobs stop first, then the node exits with ``EXIT_SESSION_LOST`` (a supervisor
  restarts it with a fresh session), or with ``node.on_session_loss = "rejoin"`` it re-enters
  the election with a new session from a *new* ZooKeeper client (the factory's): an old
  client remembers the last zxid it saw, and an ensemble rebuilt from nothing refuses it.
- A write PostgreSQL rejects as fenced (AL100) means another node holds the fence: the node
  ends its term and exits with ``EXIT_FENCED``. A layout the database does not know
  (AL104) is a configuration error: exit ``EXIT_CONFIG``.
- A takeover refused as stale (AL101) is either a race (another node took a newer token:
  leave, back off, rejoin) or the fence is *ahead of ZooKeeper* (an ensemble wiped or
  restored): nobody could take the fence, so leaving would only churn.
- *Blocked*: first in the election, but no takeover can succeed. The node says why (role
  ``blocked``, ``/status`` ``blocked``, ``allocator_blocked{reason}``, its advert) and
  retries slowly: ``fence_ahead_of_zookeeper`` and ``fence_generation_unreadable`` (an
  operator runs ``allocator fence rebase``), ``database_behind_zookeeper`` (``allocator pool
  reset --after-restore``) stay first, as every node would find the same;
  ``database_unreachable`` is this node's own: it leaves at once when a contender
  advertises a reachable database and an agreeing clock, and stays first only while nobody
  does. The watermark is compared inside the takeover's transaction: no fence is taken
  without a completed comparison.
- Every node probes the database (:mod:`allocator.health`) and advertises in its znode
  whether it reaches it and whether its clock agrees with the database's. A leader whose
  clock has disagreed for ``leader.clock_skew_handover_s`` or whose writes have all failed
  for ``leader.db_unreachable_s`` steps down, but only when some contender advertises both;
  otherwise it keeps leading and reports the handover as withheld (no churn). A leader whose
  clock disagrees while the pool holds less than a handover's runway hands over at once.
- Graceful step-down (`allocator step-down`, POST /step-down) and SIGTERM: stop the jobs,
  record the end of the term, delete the znode (the next node takes over at once); step-down
  then rejoins at the back of the queue, SIGTERM exits 0.
- ZooKeeper access (:mod:`allocator.zkclient`): without ``zookeeper.auth`` the node refuses
  to start unless ``zookeeper.insecure`` (then a WARNING and ``allocator_zookeeper_insecure``
  at every start). At start it gives the cluster's persistent znodes our ACL where they
  carry another (an older version's open ACL); everything it creates carries it. A
  ``NoAuth`` answer is a configuration error (exit 78), never retried. Every
  ``ELECTION_SCAN_INTERVAL_S`` it reads the whole election and reports, by metric and one
  log line per change, znodes ignored for the order or holding data that does not parse.
- After each probe the node reads the pool itself (:mod:`allocator.pool_watch`): the pool
  metrics never depend on which node leads, and ``/readyz`` answers ready only while
  ZooKeeper is connected, the database answered and the pool can take a burst. A leader's
  own gauges are reset when its term ends (:meth:`NodeMetrics.leadership_ended`).
- The node receives its collaborators (:mod:`allocator.ports`): the store, a ZooKeeper
  client factory, the leader jobs, the clock. The constructor does no I/O; :meth:`Node.run`
  does it all and always cleans up.

Exit codes: 0 stopped on request; 3 ZooKeeper session lost; 4 fenced by a newer leader;
69/70/75/78 as for every command (missing prerequisite, bug, unavailable, bad config).

The session: ``/status`` shows its id (hex), never its password. With ``node.state_dir``
set, the node checks that folder before anything else (a bad one: exit 78) and keeps the id
and password of every new session in ``session.json`` there, mode 0600
(:mod:`allocator.session_file`); the file is removed once the node has closed its session
on the way out, so only a process that died without its shutdown leaves one behind.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from allocator import fence, health, logs, reaper, session_file, zkclient
from allocator.admin import AdminServer
from allocator.cluster_view import ClusterView
from allocator.config import Config, runway
from allocator.election import (
    Contender,
    Election,
    ElectionNodeLostError,
    Identity,
    Queue,
    ZooKeeperCallTimeoutError,
)
from allocator.errors import (
    AllocatorError,
    DatabaseBehindError,
    DatabaseError,
    DatabaseUnavailableError,
    FencedError,
    LayoutMismatchError,
    StaleTakeoverError,
    ZooKeeperUnavailableError,
)
from allocator.health import NodeHealth
from allocator.leadership import SessionGuard, Term
from allocator.metrics import NodeMetrics
from allocator.pool_watch import PoolWatch
from allocator.ports import LeaderHooks, LeaderJobsPort, NodeStore, ZooKeeperFactory

log = logs.get_logger(__name__)

EXIT_OK = 0
EXIT_SESSION_LOST = 3
EXIT_FENCED = 4
EXIT_CONFIG = 78

RECHECK_INTERVAL_S = 0.5
STALE_TAKEOVER_BACKOFF_S = 2.0
FENCE_AHEAD_BACKOFF_S = 5.0
JOB_STOP_TIMEOUT_S = 10.0
HANDOVER_CHECK_INTERVAL_S = 1.0
ZOOKEEPER_ERROR_BACKOFF_S = 1.0
ELECTION_SCAN_INTERVAL_S = 5.0
"""How often a node reads the whole election to report znodes it ignores or cannot parse."""

TermFactory = Callable[[fence.Token, SessionGuard], Term]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _first(items: tuple[str, ...], shown: int = 10) -> str:
    """Up to ``shown`` items for a log line (strangers could be many)."""
    more = f"; and {len(items) - shown} more" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more


def chroot_of(hosts: str) -> str:
    """The chroot suffix of a ZooKeeper hosts string (``zk1:2181/a/b`` → ``/a/b``), or ""."""
    _servers, slash, chroot = hosts.partition("/")
    return slash + chroot if slash else ""


class Node:
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
    ) -> None:
        self._config = config
        self._now_ms = now_ms
        self.name = config.node.resolved_name()
        self._host = host or socket.gethostname()
        self._pid = pid or os.getpid()
        self._metrics = metrics or NodeMetrics()
        self._metrics.session.state("connecting")
        self._health = health or NodeHealth()
        self._state_dir = config.node.state_path()
        self._state_dir_ready = False  # checked by session_file.prepare at the start of run()
        self._db = store
        self._zk_factory = zookeeper
        self._zk_root = zookeeper_root  # no chroot: to recreate ours after a wipe
        self._zk: Any = zookeeper()
        self._term_factory = term_factory
        self._guard = SessionGuard(config.zookeeper.session_timeout_ms / 1000)
        self._jobs = jobs
        self._pool_watch = PoolWatch(store, config, self._metrics)
        ends_at_ms = config.layout.ends_at_ms
        self._metrics.layout_time_left_seconds.set_function(
            lambda: max(0.0, (ends_at_ms - self._now_ms()) / 1000)
        )
        self._cluster = ClusterView(self._read_queue, store)  # the status page's view
        self._admin = AdminServer(
            config.node.admin_address,
            config.node.admin_token.get_secret_value(),
            self._metrics,
            snapshot=self.snapshot,
            healthy=lambda: not self._guard.lost,
            ready=self._ready,
            step_down=self.request_step_down,
            cluster=self._cluster.to_json,
            max_threads=config.node.admin_max_threads,
            timeout_s=config.node.admin_timeout_s,
        )
        self._election: Election | None = None
        self._stop = threading.Event()
        self._closing = threading.Event()  # the run is over: background threads end
        self._interrupt = threading.Event()  # wakes a waiting follower: stop or session loss
        self._wake = threading.Event()  # wakes the leader's watch loop
        self._step_down = threading.Event()
        self._fenced = threading.Event()
        self._fatal: AllocatorError | None = None
        self._term: Term | None = None
        self._role = "starting"
        self._since = time.time()
        self._fence_ahead: dict[str, Any] | None = None
        self._database_behind: dict[str, Any] | None = None
        self._blocked: dict[str, str] | None = None
        """Why this node, first in the election, cannot take the fence (reason, detail)."""
        self._watermark: fence.Watermark | None = None
        """ZooKeeper's watermark as we last read or raised it."""
        self._watermark_lock = threading.Lock()
        self._watermark_pending: int | None = None
        self._watermark_raised_at = 0.0
        self._handover_withheld: str | None = None
        self._probe_thread: threading.Thread | None = None
        self._probe_call: threading.Thread | None = None
        """The probe in flight (one at a time: see :meth:`_probe_loop`)."""
        self._published: Identity | None = None
        """What our znode advertises, as we last wrote it (None: not written yet)."""
        self._scanned_at = 0.0
        self._election_findings: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        """(unparsable, ignored) znodes as last reported, so each change logs once."""

    # -- requests from other threads (signals, admin HTTP) --------------------------------

    def request_stop(self, reason: str = "shutdown") -> None:
        log.info("stop_requested", reason=reason)
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

    @property
    def health(self) -> NodeHealth:
        return self._health

    @property
    def role(self) -> str:
        return self._role

    def _ready(self) -> bool:
        """What ``/readyz`` answers (:mod:`allocator.pool_watch`)."""
        return bool(
            self._guard.connected and self._health.advert().db_ok and self._pool_watch.pool_ready
        )

    def session_credentials(self) -> tuple[int, bytes] | None:
        """(session id, password) of the live ZooKeeper session: for forced-expiry drills."""
        client_id: tuple[int, bytes] | None = self._zk.client_id
        return client_id

    def snapshot(self) -> dict[str, Any]:
        """What ``/status`` shows (never the session password)."""
        term = self._term
        client_id = self.session_credentials()
        advert = self._health.advert()
        return {
            "name": self.name,
            "host": self._host,
            "pid": self._pid,
            "role": self._role,
            "epoch": term.epoch if term and not term.ended else None,
            "generation": term.token.generation if term and not term.ended else None,
            "may_write": bool(term and term.may_write()),
            "session": self._session_state(),
            "session_id": f"{client_id[0]:#x}" if client_id else None,
            "znode": self._election.znode if self._election else None,
            "admin_url": self._admin.url,
            "since": self._since,
            "database_reachable": advert.db_ok,
            "clock_agrees": advert.clock_ok,
            "clock_offset_ms": self._health.offset_ms,
            "fence_ahead_of_zookeeper": self._fence_ahead,
            "database_behind_zookeeper": self._database_behind,
            "blocked": self._blocked,
            "handover_withheld": self._handover_withheld,
            "async_replication": self._health.async_replication,
            "async_replication_allowed": self._config.postgres.allow_async_replication,
            "ready": self._ready(),
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

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped, fenced or the session is lost; returns the exit code."""
        config = self._config
        try:
            zkclient.check_node(config)  # before anything starts: no ACLs, no node
            self._warn_insecure()
            if self._state_dir is not None:
                session_file.prepare(self._state_dir)
                self._state_dir_ready = True
                self._reap_predecessor()
            self._db.open(timeout=config.postgres.connect_timeout_s)
            self._admin.start()
            self._jobs.start_scheduler()
            self._election = self._start_session()
            self._secure_znodes()
            log.info("started", name=self.name, admin_url=self._admin.url)
            self._metrics.async_replication_allowed.set(
                int(config.postgres.allow_async_replication)
            )
            if config.postgres.allow_async_replication:
                log.warning(
                    "async_replication_allowed",
                    name=self.name,
                    note="postgres.allow_async_replication is set; this node cuts even when "
                    "no standby confirms commits, and a failover to such a standby can hand "
                    "out IDs twice",
                )
            self._probe_thread = threading.Thread(
                target=self._probe_loop, name="db-probe", daemon=True
            )
            self._probe_thread.start()
            self._cluster.start()
            return self._loop()
        finally:
            self._shutdown()

    def _identity(self) -> Identity:
        advert = self._health.advert()
        blocked = self._blocked  # once: the main thread may clear it meanwhile
        return Identity(
            self.name,
            self._host,
            self._pid,
            self._admin.url,
            db_ok=advert.db_ok,
            clock_ok=advert.clock_ok,
            blocked=blocked["reason"] if blocked else None,
        )

    def _start_session(self) -> Election:
        """Start the current ZooKeeper client and build the election on it."""
        config = self._config
        self._zk.add_listener(self._on_session_state)
        try:
            self._zk.start(timeout=config.zookeeper.connect_timeout_s)
        except KazooTimeoutError as exc:
            raise ZooKeeperUnavailableError(
                f"no ZooKeeper server answered at {config.zookeeper.hosts} "
                f"within {config.zookeeper.connect_timeout_s} s"
            ) from exc
        self._record_session()
        return Election(
            self._zk,
            config.zookeeper.election_path,
            self._identity(),
            acl=zkclient.acl(config),
        )

    def _warn_insecure(self) -> None:
        """``zookeeper.insecure``: a WARNING at every start, and a metric (alertable)."""
        insecure = zkclient.credentials(self._config) is None
        self._metrics.zookeeper_insecure.set(int(insecure))
        if insecure:
            log.warning("zookeeper_insecure", name=self.name, note=zkclient.INSECURE_WARNING)

    def _secure_znodes(self) -> None:
        """Our ACL on the cluster's persistent znodes that carry another one (an older
        version's open ACL: :func:`allocator.zkclient.secure`). A refusal is fatal (a
        ConfigError); a connection problem is not: the next start looks again."""
        timeout_s = self._config.zookeeper.connect_timeout_s
        try:
            zkclient.secure(self._zk, self._config, lambda pending: pending.get(timeout=timeout_s))
        except (KazooException, KazooTimeoutError) as exc:
            log.warning("zookeeper_acl_check_failed", name=self.name, error=repr(exc))

    def _reap_predecessor(self) -> None:
        """Close the session a dead predecessor of this name left (:mod:`allocator.reaper`),
        so the election does not wait for ZooKeeper to expire it. Only with a stable name."""
        assert self._state_dir is not None
        if not self._config.node.name:
            log.info(
                "session_reap_skipped",
                name=self.name,
                reason="node.name is not set: the default <hostname>-<pid> changes at every "
                "start, so a dead predecessor cannot be recognised (set node.name to reap)",
            )
            return
        reaper.reap(
            self._state_dir,
            reaper.self_of(self._config, self._host),
            timeout_s=self._config.zookeeper.connect_timeout_s,
        )

    def _record_session(self) -> None:
        """Keep the new session's id and password in the session file (module rules)."""
        client_id = self.session_credentials()
        if self._state_dir is None or not self._state_dir_ready or client_id is None:
            return
        record = session_file.SessionRecord(
            name=self.name,
            host=self._host,
            pid=self._pid,
            zookeeper_hosts=self._config.zookeeper.hosts,
            session_id=client_id[0],
            session_password=client_id[1],
            election_path=self._config.zookeeper.election_path,
            start_time=reaper.own_start_time(self._pid),
            boot_id=reaper.boot_id(),
            pid_namespace=reaper.pid_namespace(),
        )
        try:
            path = session_file.write(self._state_dir, record, hold=True)
        except OSError as exc:
            # The node can do its job without it; only a later clean-up of this session
            # from outside cannot. Remove a file of ours naming an older session.
            log.error(
                "session_file_failed",
                name=self.name,
                dir=self._state_dir,
                error=exc.strerror or str(exc),
            )
            self._forget_session()
            return
        log.info("session_recorded", name=self.name, session_id=f"{client_id[0]:#x}", path=path)

    def _forget_session(self) -> None:
        """Remove the session file this process wrote (one another process wrote since is
        not this node's to remove), then let go of the state folder's lock."""
        if self._state_dir is None or not self._state_dir_ready:
            return
        me = (self._pid, reaper.own_start_time(self._pid), reaper.pid_namespace())

        def written_by_me(record: session_file.SessionRecord) -> bool:
            return (record.pid, record.start_time, record.pid_namespace) == me

        try:
            session_file.remove(self._state_dir, only_if=written_by_me)
        except OSError as exc:
            log.warning(
                "session_file_remove_failed",
                name=self.name,
                dir=self._state_dir,
                error=exc.strerror or str(exc),
            )
        finally:
            session_file.release(self._state_dir)

    def _loop(self) -> int:
        while not self._stop.is_set():
            election = self._election
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
                self._rejoin()
                continue
            try:
                election.join()
                if self._blocked is None:  # "blocked" stays until the node leads or leaves
                    self._role = "follower"
                if not election.wait_until_first(self._interrupt, recheck_s=RECHECK_INTERVAL_S):
                    continue
                code = self._lead(election)
                if code is not None:
                    return code
            except NoNodeError:
                self._recreate_chroot()
            except NoAuthError as exc:  # the ACL is another identity's: no retry can help
                raise zkclient.access_refused(self._config, "join the election") from exc
            except (KazooException, ElectionNodeLostError, ZooKeeperCallTimeoutError) as exc:
                log.warning("zookeeper_error", name=self.name, error=repr(exc))
                self._wait_for_session()
                self._stop.wait(ZOOKEEPER_ERROR_BACKOFF_S)
        return EXIT_OK

    def _recreate_chroot(self) -> None:
        """The chroot is gone (an ensemble wiped or rebuilt): create it from the root, so the
        node can join and report what it finds (usually a fence ahead of ZooKeeper)."""
        chroot = chroot_of(self._config.zookeeper.hosts)
        if self._zk_root is None or not chroot:
            log.warning("zookeeper_path_missing", name=self.name)
            self._stop.wait(ZOOKEEPER_ERROR_BACKOFF_S)
            return
        root = self._zk_root()
        try:
            root.start(timeout=self._config.zookeeper.connect_timeout_s)
            if root.exists(chroot) is not None:  # not the chroot: a path below it vanished
                log.warning("zookeeper_path_missing", name=self.name)
                self._stop.wait(ZOOKEEPER_ERROR_BACKOFF_S)
                return
            log.warning("zookeeper_chroot_missing", name=self.name, chroot=chroot)
            timeout_s = self._config.zookeeper.connect_timeout_s
            zkclient.ensure_chroot(
                root,
                chroot,
                zkclient.acl(self._config),
                lambda pending: pending.get(timeout=timeout_s),
            )
            log.info("zookeeper_chroot_created", name=self.name, chroot=chroot)
        except (KazooException, KazooTimeoutError) as exc:
            log.warning("zookeeper_chroot_create_failed", name=self.name, error=repr(exc))
            self._stop.wait(ZOOKEEPER_ERROR_BACKOFF_S)
        finally:
            root.stop()
            root.close()

    def _token(self, election: Election) -> fence.Token | None:
        """Our token, or None when the generation znode holds garbage: then the node is
        blocked (every node reads the same znode; ``allocator fence rebase`` rewrites it)."""
        czxid = election.token()
        try:
            generation = election.generation()
        except ValueError as exc:
            self._block("fence_generation_unreadable", str(exc))
            return None
        return fence.Token(generation, czxid)

    def _lead(self, election: Election) -> int | None:
        """First in the election: take the fence and lead, or say why not (blocked)."""
        token = self._token(election)
        if token is None:
            self._pause(FENCE_AHEAD_BACKOFF_S)  # stay first: every node would find the same
            return None
        if self._health.advert().db_ok is False:
            # The probe already failed: a takeover would only wait out the dead path.
            self._database_unreachable(election, "the last probe did not reach the database")
            return None
        watermark = self._read_watermark(election)
        try:
            # The watermark comparison runs in the takeover's own transaction: no takeover
            # without a completed comparison (a failed one is an unreachable database).
            takeover = self._db.take_fence(token, self.name, self._host, self._pid, watermark)
        except DatabaseBehindError as exc:
            assert watermark is not None
            held = fence.Token(exc.generation, exc.epoch)
            self._set_database_behind(exc.reason, held, exc.high_water_id, watermark)
            self._block("database_behind_zookeeper", exc.reason)
            self._pause(FENCE_AHEAD_BACKOFF_S)  # stay first: every node would find the same
            return None
        except StaleTakeoverError as exc:
            if self._report_fence_ahead(election, token):
                self._pause(FENCE_AHEAD_BACKOFF_S)  # stay first: leaving would only churn
                return None
            log.error("fence_stale", name=self.name, token=str(token), error=str(exc))
            self._leave(election)
            self._pause(STALE_TAKEOVER_BACKOFF_S)
            return None
        except LayoutMismatchError as exc:
            self._metrics.layout_mismatch.set(1)
            log.critical("layout_mismatch", name=self.name, error=str(exc))
            self._leave(election)
            return EXIT_CONFIG
        except DatabaseUnavailableError as exc:
            log.error("takeover_failed", name=self.name, token=str(token), error=str(exc))
            if self._health.advert().db_ok:
                # The probe reaches the database: a lock or statement timeout (a paused
                # ex-leader's open transaction holds the fence row), not a dead path. Stay
                # first and try again; the next probe tells if the path died meanwhile.
                self._pause(STALE_TAKEOVER_BACKOFF_S)
            else:
                self._database_unreachable(election, str(exc))
            return None
        except DatabaseError as exc:
            log.error("takeover_failed", name=self.name, token=str(token), error=str(exc))
            self._leave(election)
            self._pause(STALE_TAKEOVER_BACKOFF_S)
            return None
        self._clear_fence_ahead()
        self._clear_database_behind()
        self._unblock()
        term = self._term_factory(token, self._guard)
        self._term = term
        self._fenced.clear()
        term.activate()
        self._role = "leader"
        self._since = time.time()
        self._health.term_started()
        self._metrics.terms.inc()
        self._metrics.fence_epoch.set(token.epoch)
        self._metrics.fence_generation.set(token.generation)
        self._metrics.is_leader.set(1)
        log.info(
            "elected",
            name=self.name,
            epoch=token.epoch,
            generation=token.generation,
            previous_epoch=takeover.previous_epoch,
            previous_generation=takeover.previous_generation,
            high_water_id=takeover.high_water_id,
        )
        log.info("fence_taken", name=self.name, token=str(token))
        self._check_clock_at_takeover()
        self._watermark_pending = None
        self._raise_watermark(election, fence.Watermark(token, takeover.high_water_id))
        self._jobs.start(
            term,
            LeaderHooks(
                health=self._health,
                on_fenced=self._on_fenced,
                on_fatal=self._on_fatal,
                database_went_back=self._database_went_back,
                cut_recorded=self._record_cut,
                pool_read=self._pool_watch.observe,
            ),
        )
        reason = self._watch_term(term, election)
        term.end(reason)
        if reason == "db_unreachable":
            # Hand over before anything else: every database call (the jobs in flight, the
            # end of the term) would wait out the dead path's timeouts first.
            self._leave(election)
        self._metrics.leadership_ended()
        self._handover_withheld = None
        self._health.term_ended()
        if not self._jobs.stop(JOB_STOP_TIMEOUT_S):
            log.error("job_stop_timeout", name=self.name, token=str(token))
        self._metrics.leadership_ended()  # again: the run that was in flight may have set one
        # Every term end, "fenced" too: the cuts the rate limit held back are committed, and
        # a restore's reset reads the watermark (a bounded, best-effort ZooKeeper call).
        self._flush_watermark(election, token)
        self._role = "stopping" if reason in ("shutdown", "fatal") else "follower"
        self._term = None
        log.info("stepped_down", name=self.name, token=str(token), reason=reason)
        if reason == "fatal":
            self._end_term(token, reason)
            self._leave(election)
            return self._fatal.exit_code if self._fatal else EXIT_CONFIG
        if reason == "db_unreachable":
            return None  # the successor's takeover ends our term ('superseded'); we left above
        if reason in ("shutdown", "stepped_down", "clock_skew"):
            self._end_term(token, reason)
            self._leave(election)  # hands over at once; the others rejoin at the back
            return None
        if reason == "fenced":
            return EXIT_FENCED
        if reason == "znode_lost":
            self._end_term(token, reason)
        return None

    def _watch_term(self, term: Term, election: Election) -> str:
        """Wait while leading; return why the term ends. Pauses/resumes on session flaps."""
        next_handover_check = time.monotonic()
        while True:
            self._wake.wait(RECHECK_INTERVAL_S)
            self._wake.clear()
            if self._guard.check_timer() or self._guard.lost:
                return "session_lost"
            if self._fatal is not None:
                return "fatal"
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
                if time.monotonic() >= next_handover_check:
                    next_handover_check = time.monotonic() + HANDOVER_CHECK_INTERVAL_S
                    reason = self._handover_due(election)
                    if reason is not None:
                        return reason
            except (KazooException, ElectionNodeLostError, ZooKeeperCallTimeoutError):
                term.pause()
                continue
            if not term.may_write():
                log.info("resumed", name=self.name, epoch=term.epoch)
            term.activate()
            self._watermark_catch_up(election, term.token)

    def _handover_due(self, election: Election) -> str | None:
        """A reason to step down now, if one applies AND a fit contender would take over."""
        leader = self._config.leader
        reason = self._health.handover_reason(leader.clock_skew_handover_s, leader.db_unreachable_s)
        if reason is None and self._cannot_cut_and_pool_short():
            reason = health.CLOCK_SKEW  # at once: waiting out the handover delay drains the pool
        if reason is None:
            if self._handover_withheld is not None:
                log.info("handover_no_longer_needed", name=self.name)
            self._handover_withheld = None
            self._metrics.handover_withheld.set(0)
            return None
        fit = self._fit_contenders(election)
        if fit:
            log.warning("handing_over", name=self.name, reason=reason, to=fit[0].identity.name)
            return reason
        if self._handover_withheld != reason:
            log.error(
                "handover_withheld",
                name=self.name,
                reason=reason,
                note="no contender advertises a reachable database and an agreeing clock; "
                "keeping the lead, serving the pool",
            )
        self._handover_withheld = reason
        self._metrics.handover_withheld.set(1)
        return None

    def _cannot_cut_and_pool_short(self) -> bool:
        """True while this leader's clock disagrees with the database's (it may not cut) and
        the pool holds less than the runway a handover needs (or nothing): a cold cluster
        whose first leader's clock is wrong must not wait ``leader.clock_skew_handover_s``
        with an empty pool while a sound contender queues."""
        disagreeing_s = self._health.clock_disagreeing_for_s()
        if disagreeing_s is None or disagreeing_s < self._config.leader.probe_interval_s:
            return False  # not on one noisy reading
        status = self._pool_watch.last
        if status is None:
            return False
        if status.available_blocks == 0:
            return True
        return status.runway_s is not None and status.runway_s < runway.needed_runway_s(
            self._config
        )

    def _fit_contenders(self, election: Election) -> list[Contender]:
        """Other contenders that advertise a reachable database and an agreeing clock (in
        data that parses: an advert we cannot read in full is no reason to hand over)."""
        own = election.znode
        return [
            c
            for c in election.contenders()
            if c.znode != own and c.problem is None and c.identity.fit
        ]

    def _pause(self, seconds: float) -> None:
        """A back-off that ends early on a stop request or a session loss."""
        self._interrupt.wait(seconds)

    # -- the fence ahead of ZooKeeper ----------------------------------------------------------

    def _report_fence_ahead(self, election: Election, token: fence.Token) -> bool:
        """After a stale takeover: True (and reported) if ZooKeeper is behind the fence."""
        try:
            held = self._db.fence().token
            newest = election.newest_zxid()
        except (AllocatorError, KazooException) as exc:
            log.warning("fence_check_failed", name=self.name, error=str(exc))
            return False
        if not fence.ahead_of_zookeeper(held, token.generation, newest):
            return False
        state = {
            "fence": {"generation": held.generation, "epoch": held.epoch},
            "zookeeper": {"generation": token.generation, "newest_zxid": newest},
        }
        if self._fence_ahead != state:
            log.critical(
                "fence_ahead_of_zookeeper",
                name=self.name,
                fence=str(held),
                zookeeper_generation=token.generation,
                newest_zxid=f"{newest:#x}",
                note="the ensemble was wiped or restored; nobody can take the fence until an "
                "operator runs `allocator fence rebase`",
            )
        self._fence_ahead = state
        self._metrics.fence_ahead_of_zookeeper.set(1)
        self._block(
            "fence_ahead_of_zookeeper",
            f"the fence {held} is newer than anything this ensemble issued (generation "
            f"{token.generation}, newest zxid {newest:#x})",
        )
        return True

    def _clear_fence_ahead(self) -> None:
        if self._fence_ahead is not None:
            log.info("fence_ahead_cleared", name=self.name)
        self._fence_ahead = None
        self._metrics.fence_ahead_of_zookeeper.set(0)

    # -- blocked: first in the election, but no takeover can succeed -----------------------

    def _block(self, reason: str, detail: str) -> None:
        """Report (role, ``/status``, advert, ``allocator_blocked``; a log line per new
        reason) why this node, first in the election, does not take the fence."""
        if self._blocked is None or self._blocked["reason"] != reason:
            log.error("blocked", name=self.name, reason=reason, detail=detail)
        self._blocked = {"reason": reason, "detail": detail}
        self._role = "blocked"
        self._metrics.blocked_by(reason)

    def _unblock(self) -> None:
        if self._blocked is not None:
            log.info("unblocked", name=self.name, reason=self._blocked["reason"])
        self._blocked = None
        self._metrics.blocked_by(None)

    def _database_unreachable(self, election: Election, detail: str) -> None:
        """First in the election without a database: make way for a contender that reaches
        it; when nobody does, stay first (rotating the queue would be churn for nothing,
        DESIGN §11), blocked, until a fit contender queues or the database answers again."""
        if self._make_way(election):
            return
        self._block("database_unreachable", detail)
        deadline = time.monotonic() + FENCE_AHEAD_BACKOFF_S
        while not self._interrupt.wait(RECHECK_INTERVAL_S):
            if self._make_way(election) or self._health.advert().db_ok:
                return  # made way, or reachable again: the loop tries the takeover now
            if time.monotonic() >= deadline:
                return

    def _make_way(self, election: Election) -> bool:
        """Leave the election if a contender advertises a reachable database and an agreeing
        clock (it takes over at once; we queue again at the back). True if we left."""
        fit = self._fit_contenders(election)
        if not fit:
            return False
        log.warning(
            "making_way", name=self.name, reason="database_unreachable", to=fit[0].identity.name
        )
        self._leave(election)
        self._role = "follower"
        self._pause(STALE_TAKEOVER_BACKOFF_S)
        return True

    # -- ZooKeeper's watermark: a database that went backwards -------------------------------

    def _read_watermark(self, election: Election) -> fence.Watermark | None:
        """ZooKeeper's watermark for the takeover's comparison; one that does not parse is
        reported and ignored (it cannot make a node refuse to lead)."""
        try:
            copy = election.watermark()
        except ValueError as exc:
            log.error("watermark_unreadable", name=self.name, error=str(exc), note="ignored")
            copy = None
        self._watermark = copy
        return copy

    def _database_went_back(self, high_water_id: int) -> bool:
        """The leader's jobs: True (and reported) if the database's mark fell below ours."""
        copy = self._watermark
        term = self._term
        if copy is None or term is None or high_water_id >= copy.high_water_id:
            if self._database_behind is not None and copy is not None:
                self._clear_database_behind()
            return False
        reason = fence.database_behind(term.token, high_water_id, copy)
        assert reason is not None
        self._set_database_behind(reason, term.token, high_water_id, copy)
        return True

    def _set_database_behind(
        self, reason: str, token: fence.Token, high_water_id: int, copy: fence.Watermark
    ) -> None:
        state = {
            "reason": reason,
            "database": {
                "generation": token.generation,
                "epoch": token.epoch,
                "high_water_id": high_water_id,
            },
            "watermark": copy.to_json(),
        }
        if self._database_behind != state:
            log.critical(
                "database_behind_zookeeper",
                name=self.name,
                reason=reason,
                note="the database was restored or failed over to a standby that missed "
                "commits; no takeover and no cut until an operator resets the pool",
            )
        self._database_behind = state
        self._metrics.database_behind_zookeeper.set(1)

    def _clear_database_behind(self) -> None:
        if self._database_behind is not None:
            log.info("database_behind_cleared", name=self.name)
        self._database_behind = None
        self._metrics.database_behind_zookeeper.set(0)

    def _record_cut(self, high_water_id: int) -> None:
        """A committed cut (a job thread): noted only. The leader's loop raises the watermark
        (:meth:`_watermark_catch_up`, at most once a second): a ZooKeeper call here would
        hold the refill up to a call timeout while the session is suspended, stretching it
        into a successor's term."""
        with self._watermark_lock:
            pending = self._watermark_pending
            self._watermark_pending = max(high_water_id, pending if pending is not None else -1)

    def _watermark_catch_up(self, election: Election, token: fence.Token) -> None:
        """The leader's loop: a cut the rate limit held back is written once it may be."""
        with self._watermark_lock:
            if self._watermark_pending is None:
                return
            if time.monotonic() - self._watermark_raised_at < fence.WATERMARK_INTERVAL_S:
                return
        self._flush_watermark(election, token)

    def _flush_watermark(self, election: Election, token: fence.Token) -> None:
        """At the end of a term: the cuts the rate limit held back."""
        with self._watermark_lock:
            mark, self._watermark_pending = self._watermark_pending, None
        if mark is not None:
            self._raise_watermark(election, fence.Watermark(token, mark))

    def _raise_watermark(self, election: Election, mark: fence.Watermark) -> None:
        self._watermark_raised_at = time.monotonic()
        try:
            self._watermark = election.raise_watermark(mark)
        except (KazooException, AllocatorError) as exc:
            # Best effort: a watermark that lags only makes the check less sensitive.
            log.warning("watermark_raise_failed", name=self.name, error=repr(exc))

    # -- the database probe and what we advertise ------------------------------------------

    def _probe_loop(self) -> None:
        """Every ``leader.probe_interval_s``: reach the database, compare clocks, advertise.

        Each probe runs on a thread of its own and has one interval to answer; one that has
        not answered by then counts as unreachable at once (no other starts until it ends).
        So an advert is never staler than about two intervals, however long the connection's
        own bounds (keepalives, ``tcp_user_timeout``) take to end a call on a black-holed
        path: a leader judging its contenders after ``leader.db_unreachable_s`` relies on it.
        The first probe runs at once: a leader that must hand over judges a node that just
        joined by its advert.
        """
        interval = self._config.leader.probe_interval_s
        while not self._closing.is_set():  # the first probe at once (see the docstring)
            try:
                self._probe_round(interval)
            except Exception:  # a bug here must not end the adverts for good, silently
                log.exception("probe_round_failed", name=self.name)
            self._closing.wait(interval)

    def _probe_round(self, interval: float) -> None:
        """One round of :meth:`_probe_loop`."""
        if time.monotonic() - self._scanned_at >= ELECTION_SCAN_INTERVAL_S:
            self._scanned_at = time.monotonic()
            self._scan_election()
        probe = self._probe_call
        if probe is None or not probe.is_alive():
            probe = threading.Thread(target=self._probe_once, name="db-probe-call", daemon=True)
            self._probe_call = probe
            probe.start()
        probe.join(interval)
        if probe.is_alive():
            self._probe_unanswered(interval)
        self._metrics.ready.set(int(self._ready()))
        identity = self._identity()
        election = self._election
        if identity != self._published and election is not None and self._guard.connected:
            try:
                election.publish(identity)
                self._published = identity
            except (KazooException, ZooKeeperCallTimeoutError) as exc:
                log.warning("advert_failed", name=self.name, error=repr(exc))

    def _scan_election(self) -> None:
        """Report (metrics, one log line per change) election znodes that take no place
        in the queue or hold data that does not parse; the order never depends on them."""
        election = self._election
        if election is None or not self._guard.connected:
            return
        try:
            queue = election.queue()
        except (KazooException, ZooKeeperCallTimeoutError) as exc:
            log.warning("election_scan_failed", name=self.name, error=repr(exc))
            return
        unparsable = tuple(f"{c.znode} ({c.problem})" for c in queue.unparsable)
        ignored = tuple(f"{i.znode} ({i.reason})" for i in queue.ignored)
        self._metrics.election_queue_length.set(len(queue.contenders))
        self._metrics.election_unparsable_znodes.set(len(unparsable))
        self._metrics.election_ignored_znodes.set(len(ignored))
        last_unparsable, last_ignored = self._election_findings
        if unparsable and unparsable != last_unparsable:
            log.warning(
                "election_znodes_unparsable",
                name=self.name,
                count=len(unparsable),
                znodes=_first(unparsable),
                note="their data is not what our nodes write; they keep their place in the queue",
            )
        if ignored and ignored != last_ignored:
            log.warning(
                "election_znodes_ignored",
                name=self.name,
                count=len(ignored),
                znodes=_first(ignored),
                note="not contenders",
            )
        self._election_findings = (unparsable, ignored)

    def _read_queue(self) -> Queue | None:
        """The whole election for the status page; None while there is no session to ask."""
        election = self._election
        if election is None or not self._guard.connected:
            return None
        return election.queue()

    def _probe_unanswered(self, waited_s: float) -> None:
        if self._health.advert().db_ok is not False:
            log.warning(
                "database_unreachable",
                name=self.name,
                error=f"no answer to the probe within {waited_s:.1f} s",
            )
        self._health.probed(None, None)
        self._metrics.database_reachable.set(0)

    def _probe_once(self) -> None:
        bound = self._config.pool.max_clock_skew_ms
        try:
            reading = self._db.read_clock(self._now_ms)
        except AllocatorError as exc:
            if self._health.advert().db_ok is not False:
                log.warning("database_unreachable", name=self.name, error=str(exc))
            self._health.probed(None, None)
            self._metrics.database_reachable.set(0)
            return
        agrees = not reading.disagrees(bound)
        if self._health.advert().db_ok is False:
            log.info("database_reachable", name=self.name)
        if not agrees and self._health.advert().clock_ok is not False:
            log.error(
                "clock_disagrees",
                name=self.name,
                offset_ms=round(reading.offset_ms),
                bound_ms=bound,
                note="this node's clock differs from the database server's; it will not cut",
            )
        self._health.probed(reading.offset_ms, agrees)
        self._metrics.database_reachable.set(1)
        self._metrics.clock_offset_seconds.set(reading.offset_ms / 1000)
        self._metrics.clock_skew.set(0 if agrees else 1)
        self._pool_watch.maybe_read()  # here, not in the loop: a hung read is an unanswered probe

    def _check_clock_at_takeover(self) -> None:
        """One probe right after the takeover, so the first refill knows where it stands."""
        self._probe_once()

    # -- session handling -----------------------------------------------------------------

    def _rejoin(self) -> None:
        """A new session from a new client: the old one may be refused by a rebuilt ensemble."""
        log.info("rejoin", name=self.name)
        old = self._zk
        old.remove_listener(self._on_session_state)
        try:
            old.stop()
            old.close()
        except KazooException as exc:
            log.warning("zookeeper_close_failed", error=repr(exc))
        else:
            self._forget_session()  # until the new session is recorded
        self._guard.reset()
        self._interrupt.clear()
        # Judged again once first in the new session's queue.
        self._unblock()
        self._clear_fence_ahead()
        self._clear_database_behind()
        self._zk = self._zk_factory()
        while not self._stop.is_set():
            try:
                self._election = self._start_session()
                break
            except ZooKeeperUnavailableError as exc:
                log.warning("rejoin_failed", name=self.name, error=str(exc))
                self._zk.remove_listener(self._on_session_state)
                self._zk.stop()
                self._zk.close()
                self._zk = self._zk_factory()
        self._wait_for_session()

    def _leave(self, election: Election) -> None:
        """Delete our znode; if ZooKeeper cannot be reached, closing the session will. A
        node that leaves is blocked no more: it queues again at the back."""
        self._unblock()
        try:
            election.leave()
        except (KazooException, ZooKeeperCallTimeoutError) as exc:
            log.warning("leave_failed", name=self.name, error=repr(exc))

    def _wait_for_session(self) -> None:
        while not self._stop.is_set():
            if self._guard.check_timer() or self._guard.connected:
                return
            self._guard.changed.wait(0.1)
            self._guard.changed.clear()

    def _end_term(self, token: fence.Token, reason: str) -> None:
        try:
            self._db.end_term(token, reason)
        except AllocatorError as exc:
            log.warning("end_term_failed", token=str(token), error=str(exc))

    def _on_fenced(self, exc: FencedError) -> None:
        log.error("fenced_write_rejected", name=self.name, error=str(exc))
        if self._term is not None:
            self._term.pause()
        self._fenced.set()
        self._wake.set()

    def _on_fatal(self, exc: AllocatorError) -> None:
        log.critical("fatal_write_error", name=self.name, error=str(exc))
        if isinstance(exc, LayoutMismatchError):
            self._metrics.layout_mismatch.set(1)
        if self._term is not None:
            self._term.pause()
        self._fatal = exc
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
            log.info("session_closed", name=self.name)  # our own zk.stop()
        else:
            log.info(f"session_{str(state).lower()}", name=self.name)
        self._wake.set()

    def _session_state(self) -> str:
        if self._guard.lost:
            return "lost"
        if self._guard.connected:
            return "connected"
        return "suspended" if self._role != "starting" else "connecting"

    def _shutdown(self) -> None:
        self._closing.set()
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
            log.warning("zookeeper_close_failed", error=repr(exc))
        else:
            self._forget_session()  # closed: the file would name a dead session
        if self._probe_thread is not None:
            self._probe_thread.join(timeout=JOB_STOP_TIMEOUT_S)
        self._cluster.stop()
        self._db.close()
        self._admin.stop()
        log.info("stopped", name=self.name)
