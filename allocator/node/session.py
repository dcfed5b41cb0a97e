"""The node's ZooKeeper session: its client, the election built on it, kept or replaced
after a loss (docs/design.md §4).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from allocator.config import Config
from allocator.core import logs
from allocator.core.errors import ZooKeeperUnavailableError
from allocator.core.leadership import SessionGuard
from allocator.core.zookeeper_hosts import chroot_of
from allocator.metrics import NodeMetrics
from allocator.node.pacing import Pacing
from allocator.node.seams import ZooKeeperFactory
from allocator.node.session_record import SessionRecorder
from allocator.node.signals import Signals
from allocator.zookeeper import client as zkclient
from allocator.zookeeper import negotiated, security
from allocator.zookeeper.election import Election, Identity

log = logs.get_logger(__name__)


class ZooKeeperSession:
    """The node's ZooKeeper session and the election on it.

    - Session loss (kazoo LOST, or suspended for a whole session timeout by the guard's own
      timer) is handled by the run loop: with ``node.on_session_loss = "rejoin"`` (the
      default) :meth:`recover` keeps the old session if ZooKeeper confirms it with our znode,
      else gets a new one, the old one closed first; with ``"exit"`` the node exits 3.
    - ZooKeeper access (:mod:`allocator.zookeeper.client`): the cluster's persistent znodes
      get our ACL where they carry another (an older version's open ACL); a chroot that
      vanished (an ensemble wiped) is created again from a client without it.
    """

    def __init__(
        self,
        config: Config,
        name: str,
        *,
        factory: ZooKeeperFactory,
        root_factory: ZooKeeperFactory | None,
        guard: SessionGuard,
        metrics: NodeMetrics,
        signals: Signals,
        pacing: Pacing,
        recorder: SessionRecorder,
        identity: Callable[[], Identity],
        pause_term: Callable[[], None],
    ) -> None:
        self._config = config
        self._name = name
        self._factory = factory
        self._root_factory = root_factory  # no chroot: to recreate ours after a wipe
        self._guard = guard
        self._metrics = metrics
        self._signals = signals
        self._pacing = pacing
        self._recorder = recorder
        self._identity = identity
        self._pause_term = pause_term
        self.client: Any = factory()
        self._credentials: tuple[int, bytes] | None = None
        self._warned_grant_ms: int | None = None
        self.election: Election | None = None
        self._metrics.session.state("connecting")

    def credentials(self) -> tuple[int, bytes] | None:
        """(session id, password) of the live session: for forced-expiry drills."""
        client_id: tuple[int, bytes] | None = self.client.client_id
        return client_id

    def state(self) -> str:
        """connecting, connected, suspended or lost (``/status``, the metric)."""
        if self._guard.lost:
            return "lost"
        if self._guard.connected:
            return "connected"
        return "suspended" if self._signals.role != "starting" else "connecting"

    def start(self) -> Election:
        """Start the current client, record its session, build the election on it. A TLS
        handshake the servers refuse is a ConfigError here (exit 78, naming the CA key); once
        running, the node only retries (:meth:`recover`)."""
        self.client.add_listener(self._on_state)
        try:
            self._start(self.client)
        except ZooKeeperUnavailableError as exc:
            raise security.unanswered(
                self._config, self._config.zookeeper.connect_timeout_s
            ) from exc
        self._began(self.client)
        self.election = self._election(self.client)
        return self.election

    def recover(self) -> bool:
        """After a session loss (kazoo LOST, or the own timer): a session again, or the node
        stops. True if the old session was kept, False for a new one.

        - The old session is kept only if ZooKeeper confirms it (a client attached with its
          id and password is connected with that same id) *and* our election znode still
          exists with ``ephemeralOwner`` = that id; the election then continues on it (the
          run loop takes the fence again before any write, :mod:`allocator.node.candidacy`).
        - Otherwise the node gets a new session, and never while the old one lives on: a
          session that ZooKeeper confirms without our znode is closed first (its ephemerals
          go at once), one it no longer knows is gone already (kazoo then opens a fresh one
          on the same client). So no stale znode of ours holds the queue for a timeout.
        - Every attempt is a *new* client (an old one remembers a last zxid that an ensemble
          rebuilt from nothing refuses), tried until ZooKeeper answers or the node stops.
        """
        old = self._session_id
        znode = self.election.znode if self.election is not None else None
        client = self.client
        client.remove_listener(self._on_state)
        self._signals.interrupt.clear()
        resume = self._credentials
        if not (client.connected and self._session_of(client) == old):
            self._stop(client)  # cut off: nothing reaches the servers, the session stays
            client = None
        while not self._signals.stop.is_set():
            if client is None:
                client = self._factory(client_id=resume)
                attempt_ends = time.monotonic() + self._pacing.rejoin_attempt_s
                try:
                    self._start(client, self._pacing.rejoin_attempt_s)
                except ZooKeeperUnavailableError as exc:
                    log.warning("rejoin_failed", name=self._name, error=str(exc))
                    self._stop(client)
                    client = None
                    self._signals.stop.wait(max(0.0, attempt_ends - time.monotonic()))
                    continue
            session = self._session_of(client)
            owned = None if session is None else self._owns(client, znode, session)
            if owned is None:  # the connection dropped again: try again, same credentials
                self._stop(client)
                client = None
                continue
            if session == old and owned:
                self._adopt(client, znode, kept=True)
                return True
            if session == old:
                log.info("session_closed_for_rejoin", name=self._name, session_id=f"{session:#x}")
                self._stop(client)  # connected: closeSession, its ephemerals go at once
                client, resume = None, None
                continue
            self._adopt(client, None, kept=False)
            return False
        if client is not None:
            self.client = client  # close() at the end of the run stops it
        return False

    def _adopt(self, client: Any, znode: str | None, *, kept: bool) -> None:
        """Make ``client`` the node's: its listener, the guard reset to what it reports, the
        session recorded; the election on it (continuing ``znode``, when kept).

        Rule: the old election is dropped before the client changes, so no reader (``/status``
        from the admin thread, the probe) ever pairs the new session with the old znode."""
        self.election = None
        self.client = client
        self._guard.reset()
        client.add_listener(self._on_state)
        if client.connected:
            self._guard(KazooState.CONNECTED)
        self._metrics.session.state(self.state())
        self._began(client)
        election = self._election(client)
        if znode is not None:
            election.continue_at(znode)
        self.election = election
        session = self._session_of(client)
        log.info(
            "session_rejoined",
            name=self._name,
            kept=kept,
            session_id=f"{session:#x}" if session is not None else None,
            znode=znode,
        )

    def _owns(self, client: Any, znode: str | None, session: int) -> bool | None:
        """True if ``znode`` exists and belongs to ``session`` (asked through ``client``);
        None when ZooKeeper did not answer."""
        if znode is None:
            return False
        timeout_s = self._config.zookeeper.connect_timeout_s
        try:
            stat = client.exists_async(znode).get(timeout=timeout_s)
        except (KazooException, KazooTimeoutError) as exc:
            log.warning("zookeeper_error", name=self._name, error=repr(exc))
            return None
        return stat is not None and stat.ephemeralOwner == session

    def _start(self, client: Any, within_s: float | None = None) -> None:
        """Start ``client`` within the connect timeout, or ``within_s`` if shorter
        (ZooKeeperUnavailableError if not)."""
        config = self._config
        timeout_s = config.zookeeper.connect_timeout_s
        if within_s is not None:
            timeout_s = min(timeout_s, within_s)
        try:
            client.start(timeout=timeout_s)
        except KazooTimeoutError as exc:
            raise ZooKeeperUnavailableError(
                f"no ZooKeeper server answered at {config.zookeeper.hosts} within {timeout_s:g} s"
            ) from exc

    def _began(self, client: Any) -> None:
        """A session is ours: remember its credentials, record it, read its grant."""
        credentials: tuple[int, bytes] | None = client.client_id
        if credentials is not None:
            self._credentials = credentials
        self._recorder.record(credentials)
        self._granted()

    def _election(self, client: Any) -> Election:
        return Election(
            client,
            self._config.zookeeper.election_path,
            self._identity(),
            acl=zkclient.acl(self._config),
        )

    @property
    def _session_id(self) -> int | None:
        """The id of the last session the node had (kept across a loss, for :meth:`recover`)."""
        return None if self._credentials is None else self._credentials[0]

    @staticmethod
    def _session_of(client: Any) -> int | None:
        client_id = client.client_id
        return None if client_id is None else int(client_id[0])

    def _stop(self, client: Any) -> None:
        """Stop and free ``client``: a connected one closes its session (its ephemerals go at
        once); a cut-off one reaches nobody, and its session lives on in ZooKeeper."""
        try:
            client.stop()
            client.close()
        except KazooException as exc:
            log.warning("zookeeper_close_failed", error=repr(exc))

    def close(self) -> None:
        """At the end of the run: close the session (its znodes go), then its file."""
        try:
            self.client.stop()
            self.client.close()
        except KazooException as exc:
            log.warning("zookeeper_close_failed", error=repr(exc))
        else:
            self._recorder.forget()  # closed: the file would name a dead session

    def wait(self) -> None:
        """Until the session is connected again, or lost, or the node stops."""
        while not self._signals.stop.is_set():
            if self._guard.check_timer() or self._guard.connected:
                return
            self._guard.changed.wait(0.1)
            self._guard.changed.clear()

    def warn_insecure(self) -> None:
        """``zookeeper.insecure``: a WARNING at every start, and a metric (alertable)."""
        insecure = zkclient.credentials(self._config) is None
        self._metrics.zookeeper_insecure.set(int(insecure))
        if insecure:
            log.warning("zookeeper_insecure", name=self._name, note=zkclient.INSECURE_WARNING)

    def secure_znodes(self) -> None:
        """Our ACL on the cluster's persistent znodes that carry another one
        (:func:`allocator.zookeeper.client.secure`). A refusal is fatal (a ConfigError); a
        connection problem is not: the next start looks again."""
        timeout_s = self._config.zookeeper.connect_timeout_s
        try:
            zkclient.secure(
                self.client, self._config, lambda pending: pending.get(timeout=timeout_s)
            )
        except (KazooException, KazooTimeoutError) as exc:
            log.warning("zookeeper_acl_check_failed", name=self._name, error=repr(exc))

    def recreate_chroot(self) -> None:
        """The chroot is gone (an ensemble wiped or rebuilt): create it from the root, so the
        node can join and report what it finds (usually a fence ahead of ZooKeeper)."""
        chroot = chroot_of(self._config.zookeeper.hosts)
        backoff_s = self._pacing.zookeeper_error_backoff_s
        if self._root_factory is None or not chroot:
            log.warning("zookeeper_path_missing", name=self._name)
            self._signals.stop.wait(backoff_s)
            return
        root = self._root_factory()
        try:
            root.start(timeout=self._config.zookeeper.connect_timeout_s)
            if root.exists(chroot) is not None:  # not the chroot: a path below it vanished
                log.warning("zookeeper_path_missing", name=self._name)
                self._signals.stop.wait(backoff_s)
                return
            log.warning("zookeeper_chroot_missing", name=self._name, chroot=chroot)
            timeout_s = self._config.zookeeper.connect_timeout_s
            zkclient.ensure_chroot(
                root,
                chroot,
                zkclient.acl(self._config),
                lambda pending: pending.get(timeout=timeout_s),
            )
            log.info("zookeeper_chroot_created", name=self._name, chroot=chroot)
        except (KazooException, KazooTimeoutError) as exc:
            log.warning("zookeeper_chroot_create_failed", name=self._name, error=repr(exc))
            self._signals.stop.wait(backoff_s)
        finally:
            root.stop()
            root.close()

    def _granted(self) -> None:
        """Time the own self-stop with the timeout the server granted this session, and say
        so once when it differs from the configured one (log, metric)."""
        granted_ms = negotiated.granted_timeout_ms(self.client)
        if granted_ms is None:
            return
        self._guard.grant(granted_ms / 1000)
        self._metrics.session_timeout.set(granted_ms / 1000)
        configured_ms = self._config.zookeeper.session_timeout_ms
        if granted_ms != configured_ms and granted_ms != self._warned_grant_ms:
            self._warned_grant_ms = granted_ms
            log.warning(
                "session_timeout_granted",
                name=self._name,
                configured_ms=configured_ms,
                granted_ms=granted_ms,
                note="the server's min/maxSessionTimeout clamped the request; "
                "the node times its self-stop with the smaller",
            )

    # kazoo listener: runs on the connection thread; only flips flags.
    def _on_state(self, state: KazooState) -> None:
        """The kazoo listener, on kazoo's connection thread: it only flips events and pauses
        the term (SUSPENDED withdraws the right to write at once).
        """
        self._guard(state)
        if state != KazooState.CONNECTED:
            self._pause_term()
        if state == KazooState.LOST:
            self._signals.interrupt.set()
        self._metrics.session.state(self.state())
        if self._signals.stop.is_set() and state == KazooState.LOST:
            log.info("session_closed", name=self._name)  # our own zk.stop()
        else:
            log.info(f"session_{str(state).lower()}", name=self._name)
        self._signals.wake.set()
