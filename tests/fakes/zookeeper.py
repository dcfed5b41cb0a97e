"""An in-memory ZooKeeper ensemble and a fake kazoo client with exactly the calls the node makes.

The calls are those of :mod:`allocator.zookeeper.election` and :mod:`allocator.node`: ``start``,
``stop``, ``close``, ``add_listener``, ``remove_listener``, ``client_id``, ``connected``, the
``*_async`` calls (``ensure_path``, ``create``, ``exists``, ``get_children``, ``get``, ``set``,
``delete``, ``sync``, ``get_acls``, ``set_acls``) and the blocking ``sync``,
``get_children``, ``get`` and ``exists`` of ``read_queue``. Anything else is missing on
purpose: a new call in the product shows up here as an ``AttributeError``, and the fake
grows by exactly that call.

Rules of the fake (ZooKeeper's and kazoo's, where the node depends on them):

- zxids: every write (a create, a set, a delete, the close of a session) takes the next zxid.
  They start at ``epoch << 32`` (the high half of a real zxid is the ZooKeeper leader epoch)
  and only grow, until :meth:`FakeEnsemble.wipe` starts them again at epoch 1, as an ensemble
  rebuilt from nothing does.
- A znode's ``czxid`` is the zxid of its create. A parent's ``pzxid`` is the zxid of the
  latest create or delete of a child (its own czxid before any); its ``cversion`` counts those
  changes and is the 10-digit suffix of a sequential child (``<prefix>0000000007``).
- Ephemeral znodes belong to a session (``ephemeralOwner``), vanish when it ends (stop,
  expiry, wipe) and cannot have children.
- ACLs as ZooKeeper checks them: each znode has one (``acl=`` on create and ensure_path,
  else the client's ``default_acl``, else the open ACL; parents made by ``ensure_path`` get
  the same). A client authenticates with ``auth="user:password"`` (digest). Create needs
  CREATE on the parent, delete DELETE on the parent, set WRITE, get and get_children READ,
  set_acls ADMIN, get_acls READ or ADMIN; exists and sync need nothing. A refusal raises
  ``NoAuthError``. The test-side calls (:meth:`FakeEnsemble.set_data`, ``data``, ``stat``)
  are not checked.
- Watches: only ``exists`` watches, one-shot, fired by the create, set or delete of their
  path (CREATED, CHANGED, DELETED). When a client loses its connection its pending watches
  fire once with ``EventType.NONE`` and are dropped, as kazoo does.
- Async calls run at once; the returned object's ``get(timeout)`` returns the result or raises
  what kazoo would raise (``NoNodeError``, ``NodeExistsError``, ...).
- Client states, as kazoo reports them to listeners: ``start`` opens a session (CONNECTED),
  or, built with ``client_id`` of a session the ensemble still holds, continues that one;
  ``stop`` closes it (ephemerals deleted; not from a suspended client, which reaches no
  server) and reports LOST; ``close`` comes after ``stop``.
  :meth:`FakeEnsemble.partition` cuts every client off (SUSPENDED, sessions alive, ``start``
  times out) until :meth:`FakeEnsemble.heal`, when they reconnect with their sessions.
  :meth:`FakeEnsemble.expire` ends a session on the server (ephemerals deleted at once) and
  its client reports SUSPENDED, then LOST, then (kazoo reconnects by itself) CONNECTED with a
  new session.
  :meth:`FakeEnsemble.wipe` loses all data and sessions; connected clients report SUSPENDED
  and stay so (a rebuilt ensemble refuses a client that has seen a newer zxid), and only a
  new client connects again.
- Requests: while SUSPENDED an async call's ``get`` raises ``KazooTimeoutError`` (a real
  request waits for a reconnect that does not come within the timeout) and a blocking call
  raises ``ConnectionLoss``; after LOST without a new session ``SessionExpiredError``; on a
  stopped or never-started client ``ConnectionClosedError``.
- Threads: listeners and watch callbacks run on the thread that caused them (the test's, for
  ``expire`` and ``wipe``), never under the ensemble's lock. They must not block, as kazoo
  demands of them anyway. Once ``remove_listener`` returns, that listener is not called again.
"""

from __future__ import annotations

import itertools
import posixpath
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, cast

from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, KazooState, KeeperState, WatchedEvent, ZnodeStat
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Permissions, make_digest_acl_credential

from allocator import fence

T = TypeVar("T")
Watch = Callable[[WatchedEvent], object]
Listener = Callable[[KazooState], object]
ClientState = Literal["new", "connected", "suspended", "expired", "closed"]

SEQUENCE_DIGITS = 10
FIRST_SESSION_ID = 0x1_8000_0000_0000


Identity = tuple[str, str]
"""(scheme, id) a client is authenticated as; every client is also ("world", "anyone")."""


@dataclass
class _Znode:
    data: bytes
    czxid: int
    owner: int  # session id of an ephemeral znode, 0 for a persistent one
    mzxid: int
    pzxid: int
    version: int = 0
    cversion: int = 0
    aversion: int = 0
    acl: tuple[ACL, ...] = tuple(OPEN_ACL_UNSAFE)

    def allows(self, identities: frozenset[Identity], perms: int) -> bool:
        """True if some entry for one of ``identities`` grants any of ``perms``."""
        return any(
            (entry.id.scheme, entry.id.id) in identities and entry.perms & perms
            for entry in self.acl
        )

    def stat(self, children: int) -> ZnodeStat:
        return ZnodeStat(
            czxid=self.czxid,
            mzxid=self.mzxid,
            ctime=0,
            mtime=0,
            version=self.version,
            cversion=self.cversion,
            aversion=self.aversion,
            ephemeralOwner=self.owner,
            dataLength=len(self.data),
            numChildren=children,
            pzxid=self.pzxid,
        )


@dataclass(frozen=True)
class _Firing:
    """A watch to call once the ensemble's lock is released."""

    watch: Watch
    event: WatchedEvent

    def __call__(self) -> None:
        self.watch(self.event)


class FakeResult(Generic[T]):
    """What a kazoo ``*_async`` call returns. The call has already run."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        try:
            self._value = call()
        except (KazooException, KazooTimeoutError) as exc:
            self._error = exc

    def get(self, block: bool = True, timeout: float | None = None) -> T:
        if self._error is not None:
            raise self._error
        return cast(T, self._value)


class FakeEnsemble:
    """The ZooKeeper servers of one test: a znode tree, its zxids, sessions and watches."""

    def __init__(self, epoch: int = 1) -> None:
        self._lock = threading.RLock()
        self._session_ids = itertools.count(FIRST_SESSION_ID)  # never reused, even by wipe()
        self._sessions: dict[int, FakeKazooClient] = {}
        self.granted_timeout_ms: int | None = None
        """The session timeout the servers grant every new session (what a server's
        min/maxSessionTimeout made of the request); None: not modelled, nothing granted."""
        self.reachable = True
        """False between :meth:`partition` and :meth:`heal`: no client gets through."""
        self.session_events: list[tuple[Literal["open", "resume", "close"], int]] = []
        """Every session opened, continued by another client, or ended (closed or
        expired) on the server, in order."""
        self._clear(epoch)

    def _clear(self, epoch: int) -> None:
        self._zxid = epoch << 32
        self._nodes: dict[str, _Znode] = {"/": _Znode(b"", czxid=0, owner=0, mzxid=0, pzxid=0)}
        self._watches: dict[str, list[tuple[FakeKazooClient, Watch]]] = {}

    # -- what a test does to the ensemble ---------------------------------------------------

    def client(self, auth: str = "", default_acl: list[ACL] | None = None) -> FakeKazooClient:
        """A new, unstarted client (a fake contender, an operator, a stranger)."""
        return FakeKazooClient(self, auth=auth, default_acl=default_acl)

    def expire(self, session_id: int, *, reconnect: bool = True) -> None:
        """End a session on the server, as a second client with its id closing it does (the
        real-expiry recipe of KAZOO-NOTES): its ephemerals vanish at once and its client reports
        SUSPENDED then LOST, then, like kazoo, CONNECTED with a new session (``reconnect``)."""
        with self._lock:
            client = self._sessions.get(session_id)
        if client is None:
            raise KeyError(f"no live session {session_id:#x}")
        client._disconnected()
        self._fire(self._close_session(session_id))
        client._expired(reconnect=reconnect)

    def partition(self) -> None:
        """Cut every client off (a quorum loss, a network partition): connected clients
        report SUSPENDED, sessions live on in the servers, and no client connects until
        :meth:`heal`."""
        with self._lock:
            self.reachable = False
            clients = list(self._sessions.values())
        for client in clients:
            client._disconnected()

    def heal(self, *, reconnect: bool = True) -> None:
        """The servers are reachable again; with ``reconnect`` every suspended client of a
        session still alive reconnects with it (CONNECTED), as kazoo does."""
        with self._lock:
            self.reachable = True
            clients = list(self._sessions.values())
        if reconnect:
            for client in clients:
                client._reconnected()

    def expire_cut_off(self, session_id: int) -> None:
        """The servers expire a session whose client is cut off: its ephemerals vanish,
        the client learns nothing until it reaches a server again."""
        self._fire(self._close_session(session_id))

    def wipe(self) -> None:
        """Lose every znode and session, as an ensemble rebuilt from nothing; zxids start
        again at epoch 1. Connected clients stay SUSPENDED for good."""
        with self._lock:
            clients = list(self._sessions.values())
            self._sessions.clear()
        for client in clients:
            client._disconnected()
        with self._lock:
            self._clear(epoch=1)

    def set_generation(self, election_path: str, generation: int) -> None:
        """Write the fence generation beside ``election_path``, as ``allocator fence rebase``
        does (a persistent znode holding a decimal number; parents created as needed)."""
        self.set_data(fence.generation_path(election_path), str(generation).encode())

    def set_data(self, path: str, data: bytes) -> None:
        """Write a persistent znode as another client would (parents created as needed)."""
        firings: list[_Firing] = []
        with self._lock:
            self._ensure_locked(posixpath.dirname(path), firings)
            if path in self._nodes:
                firings += self._set_locked(path, data, -1)
            else:
                firings += self._create_locked(path, data, owner=0)
        self._fire(firings)

    def delete(self, path: str) -> None:
        """Delete a znode as another client would (an operator), whoever owns it."""
        with self._lock:
            firings = self._delete_locked(path, -1)
        self._fire(firings)

    @property
    def closed_sessions(self) -> list[int]:
        """Every session ended on the server (closed or expired), in order."""
        with self._lock:
            return [session for event, session in self.session_events if event == "close"]

    # -- what a test reads ----------------------------------------------------------------

    @property
    def last_zxid(self) -> int:
        with self._lock:
            return self._zxid

    def exists(self, path: str) -> bool:
        with self._lock:
            return path in self._nodes

    def children(self, path: str) -> list[str]:
        """Names of the children of ``path`` ([] when it does not exist)."""
        with self._lock:
            return self._children_locked(path) if path in self._nodes else []

    def data(self, path: str) -> bytes:
        with self._lock:
            return self._node_locked(path).data

    def stat(self, path: str) -> ZnodeStat:
        with self._lock:
            return self._node_locked(path).stat(len(self._children_locked(path)))

    def live_sessions(self) -> set[int]:
        with self._lock:
            return set(self._sessions)

    # -- what a client asks (each checks the session under the lock) ------------------------

    def _open_session(self, client: FakeKazooClient, resume: int | None = None) -> int:
        """A new session for ``client``; or, with ``resume`` naming a live one, that session
        (now ``client``'s: its ephemerals stay)."""
        with self._lock:
            if not self.reachable:
                raise KazooTimeoutError("fake: no server answered")
            if resume is not None and resume in self._sessions:
                self._sessions[resume] = client
                self.session_events.append(("resume", resume))
                return resume
            session_id = next(self._session_ids)
            self._sessions[session_id] = client
            self.session_events.append(("open", session_id))
            return session_id

    def _close_session(self, session_id: int) -> list[_Firing]:
        """The closeSession transaction: one zxid deletes every ephemeral of the session."""
        with self._lock:
            if self._sessions.pop(session_id, None) is None:
                return []
            self.session_events.append(("close", session_id))
            owned = [path for path, node in self._nodes.items() if node.owner == session_id]
            if not owned:
                return []
            zxid = self._next_zxid()
            firings: list[_Firing] = []
            for path in owned:
                firings += self._delete_locked(path, -1, zxid)
            return firings

    def _create(
        self,
        session_id: int,
        who: frozenset[Identity],
        path: str,
        data: bytes,
        *,
        ephemeral: bool,
        sequence: bool,
        acl: tuple[ACL, ...],
    ) -> str:
        with self._lock:
            self._require_session(session_id)
            self._check_locked(posixpath.dirname(path), who, Permissions.CREATE)
            if sequence:
                parent = self._node_locked(posixpath.dirname(path))
                path = f"{path}{parent.cversion:0{SEQUENCE_DIGITS}d}"
            firings = self._create_locked(path, data, owner=session_id if ephemeral else 0, acl=acl)
        self._fire(firings)
        return path

    def _ensure_path(
        self, session_id: int, who: frozenset[Identity], path: str, acl: tuple[ACL, ...]
    ) -> bool:
        firings: list[_Firing] = []
        with self._lock:
            self._require_session(session_id)
            self._ensure_locked(path, firings, acl=acl, who=who)
        self._fire(firings)
        return True

    def _get_acls(
        self, session_id: int, who: frozenset[Identity], path: str
    ) -> tuple[list[ACL], ZnodeStat]:
        with self._lock:
            self._require_session(session_id)
            self._check_locked(path, who, Permissions.READ | Permissions.ADMIN)
            node = self._nodes[path]
            return list(node.acl), node.stat(len(self._children_locked(path)))

    def _set_acls(
        self, session_id: int, who: frozenset[Identity], path: str, acl: list[ACL], version: int
    ) -> ZnodeStat:
        with self._lock:
            self._require_session(session_id)
            self._check_locked(path, who, Permissions.ADMIN)
            node = self._nodes[path]
            if version not in (-1, node.aversion):
                raise BadVersionError(path)
            node.acl = tuple(acl)
            node.aversion += 1
            return node.stat(len(self._children_locked(path)))

    def _exists(
        self, session_id: int, client: FakeKazooClient, path: str, watch: Watch | None
    ) -> ZnodeStat | None:
        with self._lock:
            self._require_session(session_id)
            if watch is not None:
                pending = self._watches.setdefault(path, [])
                if (client, watch) not in pending:  # kazoo keeps a set per path
                    pending.append((client, watch))
            node = self._nodes.get(path)
            return None if node is None else node.stat(len(self._children_locked(path)))

    def _get_children(self, session_id: int, who: frozenset[Identity], path: str) -> list[str]:
        with self._lock:
            self._require_session(session_id)
            self._check_locked(path, who, Permissions.READ)
            return self._children_locked(path)

    def _get(self, session_id: int, who: frozenset[Identity], path: str) -> tuple[bytes, ZnodeStat]:
        with self._lock:
            self._require_session(session_id)
            node = self._check_locked(path, who, Permissions.READ)
            return node.data, node.stat(len(self._children_locked(path)))

    def _set(
        self, session_id: int, who: frozenset[Identity], path: str, data: bytes, version: int
    ) -> ZnodeStat:
        with self._lock:
            self._require_session(session_id)
            self._check_locked(path, who, Permissions.WRITE)
            firings = self._set_locked(path, data, version)
            stat = self._nodes[path].stat(len(self._children_locked(path)))
        self._fire(firings)
        return stat

    def _delete(self, session_id: int, who: frozenset[Identity], path: str, version: int) -> bool:
        with self._lock:
            self._require_session(session_id)
            self._node_locked(path)
            self._check_locked(posixpath.dirname(path), who, Permissions.DELETE)
            firings = self._delete_locked(path, version)
        self._fire(firings)
        return True

    def _sync(self, session_id: int, path: str) -> str:
        with self._lock:
            self._require_session(session_id)  # one server here: every read is up to date
            return path

    def pending_watches(self, path: str) -> list[Watch]:
        """The watch callbacks waiting on ``path`` (every client's)."""
        with self._lock:
            return [watch for _, watch in self._watches.get(path, [])]

    def _drop_watches(self, client: FakeKazooClient) -> list[Watch]:
        with self._lock:
            dropped: list[Watch] = []
            for path, watches in list(self._watches.items()):
                dropped += [watch for owner, watch in watches if owner is client]
                kept = [(owner, watch) for owner, watch in watches if owner is not client]
                if kept:
                    self._watches[path] = kept
                else:
                    del self._watches[path]
            return dropped

    # -- the tree, under the lock -----------------------------------------------------------

    def _next_zxid(self) -> int:
        self._zxid += 1
        return self._zxid

    def _require_session(self, session_id: int) -> None:
        if session_id not in self._sessions:
            raise SessionExpiredError()

    def _node_locked(self, path: str) -> _Znode:
        node = self._nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        return node

    def _check_locked(self, path: str, who: frozenset[Identity], perms: int) -> _Znode:
        """``path``'s znode if ``who`` has one of ``perms`` on it; else ``NoAuthError``."""
        node = self._node_locked(path)
        if not node.allows(who, perms):
            raise NoAuthError(path)
        return node

    def _children_locked(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        names = (p[len(prefix) :] for p in self._nodes if p.startswith(prefix))
        return sorted(name for name in names if name and "/" not in name)

    def _create_locked(
        self, path: str, data: bytes, owner: int, acl: tuple[ACL, ...] = tuple(OPEN_ACL_UNSAFE)
    ) -> list[_Firing]:
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"bad znode path {path!r}")
        parent = self._node_locked(posixpath.dirname(path))
        if parent.owner:
            raise NoChildrenForEphemeralsError(path)
        if path in self._nodes:
            raise NodeExistsError(path)
        zxid = self._next_zxid()
        self._nodes[path] = _Znode(
            data, czxid=zxid, owner=owner, mzxid=zxid, pzxid=zxid, acl=acl or tuple(OPEN_ACL_UNSAFE)
        )
        parent.pzxid = zxid
        parent.cversion += 1
        return self._take_watches(path, EventType.CREATED)

    def _ensure_locked(
        self,
        path: str,
        firings: list[_Firing],
        *,
        acl: tuple[ACL, ...] = tuple(OPEN_ACL_UNSAFE),
        who: frozenset[Identity] | None = None,
    ) -> None:
        """Create what is missing of ``path`` with ``acl``; ``who`` None: unchecked."""
        current = ""
        for part in path.strip("/").split("/"):
            if not part:
                continue
            parent, current = current or "/", f"{current}/{part}"
            if current not in self._nodes:
                if who is not None:
                    self._check_locked(parent, who, Permissions.CREATE)
                firings += self._create_locked(current, b"", owner=0, acl=acl)

    def _set_locked(self, path: str, data: bytes, version: int) -> list[_Firing]:
        node = self._node_locked(path)
        if version not in (-1, node.version):
            raise BadVersionError(path)
        node.data = data
        node.mzxid = self._next_zxid()
        node.version += 1
        return self._take_watches(path, EventType.CHANGED)

    def _delete_locked(self, path: str, version: int, zxid: int | None = None) -> list[_Firing]:
        """Delete ``path`` in its own transaction, or in ``zxid``'s (a session's close)."""
        node = self._node_locked(path)
        if version not in (-1, node.version):
            raise BadVersionError(path)
        if self._children_locked(path):
            raise NotEmptyError(path)
        zxid = self._next_zxid() if zxid is None else zxid
        del self._nodes[path]
        parent = self._nodes[posixpath.dirname(path)]
        parent.pzxid = zxid
        parent.cversion += 1
        return self._take_watches(path, EventType.DELETED)

    def _take_watches(self, path: str, event_type: str) -> list[_Firing]:
        event = WatchedEvent(event_type, KeeperState.CONNECTED, path)
        return [_Firing(watch, event) for _client, watch in self._watches.pop(path, [])]

    @staticmethod
    def _fire(firings: list[_Firing]) -> None:
        for firing in firings:
            firing()


class FakeKazooClient:
    """One kazoo client of a :class:`FakeEnsemble` (see the module rules)."""

    def __init__(
        self,
        ensemble: FakeEnsemble,
        *,
        auth: str = "",
        default_acl: list[ACL] | None = None,
        client_id: tuple[int, bytes] | None = None,
    ) -> None:
        self._ensemble = ensemble
        self._resume = None if client_id is None else client_id[0]
        """The session ``start`` continues if the servers still hold it (kazoo's
        ``client_id``)."""
        self._who: frozenset[Identity] = frozenset(
            {("world", "anyone")}
            | ({("digest", make_digest_acl_credential(*auth.split(":", 1)))} if auth else set())
        )
        self.default_acl = default_acl
        self._lock = threading.RLock()  # state changes and listener calls, one at a time
        self._listeners: list[Listener] = []
        self._state: ClientState = "new"
        self._session_id: int | None = None
        self.sessions: list[int] = []
        """Every session this client had, oldest first."""
        self.granted_timeout_ms: int | None = None
        """What the servers granted its latest session
        (:func:`allocator.zookeeper.negotiated.track_granted_timeout` keeps it so)."""
        self.closed = False

    # -- lifecycle and state --------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> None:
        with self._lock:
            if self._state == "connected":
                return
            if self._state in ("suspended", "expired"):
                raise NotImplementedError(f"fake: start() on a {self._state} client")
            self._connect()

    def stop(self) -> None:
        """Close the session (connected: its ephemerals go) and report LOST; a suspended
        client reaches no server, so its session lives on there."""
        with self._lock:
            if self._state in ("new", "closed"):
                return
            session_id, self._session_id = self._session_id, None
            before, self._state = self._state, "closed"
        if session_id is not None and before == "connected":
            self._ensemble._fire(self._ensemble._close_session(session_id))
        self._reset_watches()
        if before != "expired":
            self._report(KazooState.LOST)

    def close(self) -> None:
        """Free the client (kazoo: call it on a stopped client); a closed client stays closed."""
        with self._lock:
            assert self._state in ("new", "closed"), "close() before stop()"
            self.closed = True

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """(session id, password) while connected, else None (as kazoo)."""
        with self._lock:
            if self._state != "connected" or self._session_id is None:
                return None
            return self._session_id, self._session_id.to_bytes(16, "big")

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._state == "connected"

    @property
    def state(self) -> KazooState:
        with self._lock:
            if self._state == "connected":
                return KazooState.CONNECTED
            return KazooState.SUSPENDED if self._state == "suspended" else KazooState.LOST

    def _connect(self) -> None:
        with self._lock:
            self._session_id = self._ensemble._open_session(self, self._resume)
            self._resume = None
            self.sessions.append(self._session_id)
            self.granted_timeout_ms = self._ensemble.granted_timeout_ms  # as tracked kazoo
            self._state = "connected"
            self._report(KazooState.CONNECTED)

    def _disconnected(self) -> None:
        """The connection dropped: SUSPENDED, pending watches fire with NONE."""
        with self._lock:
            if self._state != "connected":
                return
            self._state = "suspended"
            self._report(KazooState.SUSPENDED)
        self._reset_watches()

    def _reconnected(self) -> None:
        """The servers are reachable again: CONNECTED with the same session if it lives,
        else LOST and (kazoo) a new session."""
        with self._lock:
            if self._state != "suspended":
                return
            if self._session_id in self._ensemble.live_sessions():
                self._state = "connected"
                self._report(KazooState.CONNECTED)
                return
        self._expired(reconnect=True)

    def _expired(self, *, reconnect: bool) -> None:
        """The server said the session expired: LOST, then (kazoo) a new session."""
        with self._lock:
            if self._state != "suspended":
                return
            self._state = "expired"
            self._session_id = None
            self._report(KazooState.LOST)
            if reconnect:
                self._connect()

    def _report(self, state: KazooState) -> None:
        with self._lock:
            for listener in list(self._listeners):
                listener(state)

    def _reset_watches(self) -> None:
        event = WatchedEvent(EventType.NONE, KeeperState.CONNECTING, None)
        for watch in self._ensemble._drop_watches(self):
            watch(event)

    def _session(self, *, blocking: bool) -> int:
        """The session a request goes out on, or what kazoo raises instead."""
        with self._lock:
            if self._state == "connected" and self._session_id is not None:
                return self._session_id
            if self._state == "suspended":
                if blocking:
                    raise ConnectionLoss()
                raise KazooTimeoutError("fake: no reply while the connection is down")
            if self._state == "expired":
                raise SessionExpiredError()
            raise ConnectionClosedError("Connection has been closed")

    # -- requests -------------------------------------------------------------------------

    def _acl(self, acl: list[ACL] | None) -> tuple[ACL, ...]:
        """What a create is given, as kazoo chooses it: ``acl``, the default, or open."""
        return tuple(acl or self.default_acl or OPEN_ACL_UNSAFE)

    def ensure_path_async(self, path: str, acl: list[ACL] | None = None) -> FakeResult[bool]:
        return FakeResult(
            lambda: self._ensemble._ensure_path(
                self._session(blocking=False), self._who, path, self._acl(acl)
            )
        )

    def create_async(
        self,
        path: str,
        value: bytes = b"",
        acl: list[ACL] | None = None,
        *,
        ephemeral: bool = False,
        sequence: bool = False,
    ) -> FakeResult[str]:
        return FakeResult(
            lambda: self._ensemble._create(
                self._session(blocking=False),
                self._who,
                path,
                value,
                ephemeral=ephemeral,
                sequence=sequence,
                acl=self._acl(acl),
            )
        )

    def get_acls_async(self, path: str) -> FakeResult[tuple[list[ACL], ZnodeStat]]:
        return FakeResult(
            lambda: self._ensemble._get_acls(self._session(blocking=False), self._who, path)
        )

    def set_acls_async(
        self, path: str, acls: list[ACL], version: int = -1
    ) -> FakeResult[ZnodeStat]:
        return FakeResult(
            lambda: self._ensemble._set_acls(
                self._session(blocking=False), self._who, path, acls, version
            )
        )

    def exists_async(self, path: str, watch: Watch | None = None) -> FakeResult[ZnodeStat | None]:
        return FakeResult(
            lambda: self._ensemble._exists(self._session(blocking=False), self, path, watch)
        )

    def get_children_async(self, path: str) -> FakeResult[list[str]]:
        return FakeResult(
            lambda: self._ensemble._get_children(self._session(blocking=False), self._who, path)
        )

    def get_async(self, path: str) -> FakeResult[tuple[bytes, ZnodeStat]]:
        return FakeResult(
            lambda: self._ensemble._get(self._session(blocking=False), self._who, path)
        )

    def set_async(self, path: str, value: bytes, version: int = -1) -> FakeResult[ZnodeStat]:
        return FakeResult(
            lambda: self._ensemble._set(
                self._session(blocking=False), self._who, path, value, version
            )
        )

    def delete_async(self, path: str, version: int = -1) -> FakeResult[bool]:
        return FakeResult(
            lambda: self._ensemble._delete(self._session(blocking=False), self._who, path, version)
        )

    def sync_async(self, path: str) -> FakeResult[str]:
        return FakeResult(lambda: self._ensemble._sync(self._session(blocking=False), path))

    def sync(self, path: str) -> str:
        return self._ensemble._sync(self._session(blocking=True), path)

    def get_children(self, path: str) -> list[str]:
        return self._ensemble._get_children(self._session(blocking=True), self._who, path)

    def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        return self._ensemble._get(self._session(blocking=True), self._who, path)

    def exists(self, path: str) -> ZnodeStat | None:
        return self._ensemble._exists(self._session(blocking=True), self, path, None)


class ClientFactory:
    """A node's ``zookeeper`` factory on one ensemble; remembers every client it built.
    ``auth`` and ``default_acl`` as :func:`allocator.zookeeper.client.client` gives them."""

    def __init__(
        self, ensemble: FakeEnsemble, *, auth: str = "", default_acl: list[ACL] | None = None
    ) -> None:
        self._ensemble = ensemble
        self._auth = auth
        self._default_acl = default_acl
        self.built: list[FakeKazooClient] = []

    def __call__(self, client_id: tuple[int, bytes] | None = None) -> FakeKazooClient:
        client = FakeKazooClient(
            self._ensemble, auth=self._auth, default_acl=self._default_acl, client_id=client_id
        )
        self.built.append(client)
        return client

    @property
    def latest(self) -> FakeKazooClient:
        return self.built[-1]
