"""Leader election on kazoo primitives: ephemeral sequential znodes, no herd effect.

What leading means and how session states are met is :mod:`allocator.core.leadership`'s job,
not this module's; the election's rules are docs/design.md §3.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionLoss,
    NoAuthError,
    NoNodeError,
)
from kazoo.interfaces import IAsyncResult
from kazoo.security import ACL

from allocator.core import logs
from allocator.core.errors import AllocatorError
from allocator.fence.znodes import FenceZnodes
from allocator.zookeeper.calls import ZooKeeperCallTimeoutError, bounded

log = logs.get_logger(__name__)

NODE_PREFIX = "n-"
SEQUENCE_DIGITS = 10
NAME_PATTERN = re.compile(
    rf"{NODE_PREFIX}(?P<tag>[0-9a-f]{{32}})-(?P<sequence>[0-9]{{{SEQUENCE_DIGITS}}})"
)
"""A contender's znode name: ``n-<uuid4 hex>-<sequence>``; nothing else is ours."""
MAX_NAME_CHARS = 64
MAX_TEXT_CHARS = 255
DEFAULT_CALL_TIMEOUT_S = 1.0


class ElectionNodeLostError(AllocatorError):
    """Our own election znode is gone or owned by another session: we are no contender."""


@dataclass(frozen=True)
class Identity:
    """What a contender publishes in its znode (JSON: instance name, host, pid, admin
    address), so operators see who is queued and a leader can choose whom to hand over
    to.

    The data is read only for people and for that choice, never for the order: data that
    does not parse is reported and changes nothing in the queue.
    """

    name: str
    host: str
    pid: int
    admin_address: str
    db_ok: bool | None = None
    clock_ok: bool | None = None
    blocked: str | None = None
    """Why this contender, first in the queue, cannot take the fence (``Node``'s blocked
    reasons); None when it is not blocked. Shown by ``status``; older versions ignore it."""

    def to_bytes(self) -> bytes:
        """The znode's data, as our nodes write it."""
        data: dict[str, Any] = {
            "name": self.name,
            "host": self.host,
            "pid": self.pid,
            "admin": self.admin_address,
        }
        if self.db_ok is not None:
            data["db_ok"] = self.db_ok
        if self.clock_ok is not None:
            data["clock_ok"] = self.clock_ok
        if self.blocked is not None:
            data["blocked"] = self.blocked
        return json.dumps(data, sort_keys=True).encode()

    @property
    def fit(self) -> bool:
        """True if it advertises both a reachable database and an agreeing clock."""
        return bool(self.db_ok and self.clock_ok)

    @classmethod
    def from_bytes(cls, data: bytes | None) -> Identity:
        """Never raises: data we cannot read becomes "?" / 0 / None field by field."""
        return cls.parse(data)[0]

    @classmethod
    def parse(cls, data: bytes | None) -> tuple[Identity, str | None]:
        """The identity in ``data`` and why it is not what our nodes write (None: it is).

        Total: any bytes give an identity, each field that does not parse being "?" / 0 /
        None, and a one-line problem. Keys we do not know are fine (a newer version may add
        some); a known key of the wrong type or with control characters is a problem."""
        try:
            raw = json.loads((data or b"").decode())
        except UnicodeDecodeError:
            return _UNKNOWN, "not UTF-8"
        except (ValueError, RecursionError):  # RecursionError: nested too deep for json
            return _UNKNOWN, "not JSON" if data else "empty"
        if not isinstance(raw, dict):
            return _UNKNOWN, f"a JSON {_json_kind(raw)}, not an object"
        problems: list[str] = []

        def text(key: str, default: str, limit: int, least: int = 1) -> str:
            value = raw.get(key)
            if not isinstance(value, str) or not least <= len(value) <= limit:
                problems.append(f"{key}: not a string of {least}..{limit} characters")
                return default
            if not value.isprintable():
                problems.append(f"{key}: control characters")
                return default
            return value

        def flag(key: str) -> bool | None:
            value = raw.get(key)
            if value is not None and not isinstance(value, bool):
                problems.append(f"{key}: not true/false")
                return None
            return value

        def reason(key: str) -> str | None:
            value = raw.get(key)
            if value is None:
                return None
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
                problems.append(f"{key}: not a string of 1..{MAX_NAME_CHARS} characters")
                return None
            if not value.isprintable():
                problems.append(f"{key}: control characters")
                return None
            return value

        pid = raw.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 <= pid < 2**63:
            problems.append("pid: not a whole number >= 0")
            pid = 0
        identity = cls(
            name=text("name", "?", MAX_NAME_CHARS),
            host=text("host", "?", MAX_TEXT_CHARS),
            pid=pid,
            admin_address=text("admin", "", MAX_TEXT_CHARS, least=0),
            db_ok=flag("db_ok"),
            clock_ok=flag("clock_ok"),
            blocked=reason("blocked"),
        )
        return identity, "; ".join(problems) or None


_UNKNOWN = Identity(name="?", host="?", pid=0, admin_address="")


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "array"


@dataclass(frozen=True)
class Contender:
    """One znode in election order."""

    znode: str
    sequence: int
    identity: Identity
    problem: str | None = None
    """Why the znode's data does not parse (:meth:`Identity.parse`); None when it does."""


@dataclass(frozen=True)
class Ignored:
    """A child of the election path that takes no place in the queue, and why."""

    znode: str
    reason: str


@dataclass(frozen=True)
class Queue:
    """The election as an outsider reads it: contenders in order, and what was ignored."""

    contenders: list[Contender] = field(default_factory=list)
    ignored: list[Ignored] = field(default_factory=list)

    @property
    def unparsable(self) -> list[Contender]:
        """Contenders whose data does not parse (they keep their place)."""
        return [c for c in self.contenders if c.problem is not None]


def sequence_of(znode: str) -> int:
    """The sequence of ``n-<32 hex>-0000000042`` (-1 for a name that is not exactly ours)."""
    match = NAME_PATTERN.fullmatch(znode)
    return int(match["sequence"]) if match else -1


def ordered(children: Sequence[str]) -> list[str]:
    """The names in our format, lowest sequence first (the name breaks ties no real sequence
    can make); strangers are dropped.

    Order comes from names and stats alone, fixed at create time, so every contender of
    every version computes the same one. Only ``n-<32 lowercase hex>-<10 digits>`` counts; a
    sequence past 2^31 - 1 (which ZooKeeper prints negative) does not match: at one join and
    one leave a second that is 34 years of churn on one election path.
    """
    return sorted((c for c in children if sequence_of(c) >= 0), key=lambda c: (sequence_of(c), c))


class Election:
    """One contender's place in the election under ``path``.

    Every ZooKeeper call waits at most ``call_timeout_s``: kazoo queues requests while
    disconnected and a plain call would wait for the reconnect, leaving the node deaf to its
    own session timer and to SIGTERM. A call that times out raises
    :class:`~allocator.zookeeper.calls.ZooKeeperCallTimeoutError`; callers treat it like a
    lost connection.
    """

    def __init__(
        self,
        client: KazooClient,
        path: str,
        identity: Identity,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        acl: Sequence[ACL] | None = None,
    ) -> None:
        self._client = client
        self._call_timeout_s = call_timeout_s
        self._acl = list(acl) if acl else None
        """The ACL of every znode created here (None: the client's default)."""
        self._path = path.rstrip("/") or "/"
        self._identity = identity
        self._tag = uuid.uuid4().hex
        self._znode: str | None = None
        self._advert_lock = threading.Lock()
        """Orders a join's create and an advert's write (:meth:`join`)."""
        self.fence = FenceZnodes(client, self._path, call_timeout_s=call_timeout_s, acl=self._acl)
        """The fence's znodes beside this election path, through the same client."""
        self.wakeups = 0
        """Times a predecessor watch woke us (herd-effect check and a metric)."""
        self.woken_at: float | None = None
        """When a predecessor watch last woke :meth:`wait_until_first` (monotonic); None
        when the last wait found us first without one."""

    @property
    def path(self) -> str:
        """The election path this contender queues under."""
        return self._path

    @property
    def znode(self) -> str | None:
        """Our node's full path, or None before :meth:`join`."""
        return self._znode

    def continue_at(self, znode: str) -> None:
        """Take ``znode`` as ours: the node kept the session that owns it, on a new client
        (its ownership was checked by the caller and is checked again by :meth:`join`)."""
        self._znode = znode
        named = NAME_PATTERN.fullmatch(znode.rsplit("/", 1)[1])
        if named is not None:  # a retried create looks for this tag (:meth:`join`)
            self._tag = named["tag"]

    def join(self) -> str:
        """Create our contender node (idempotent while it exists); returns its path.

        The node is ``<path>/n-<uuid>-<seq>``, ephemeral and sequential, with the cluster's
        ACL when given. The uuid lets a retry find a node whose ``create`` succeeded but
        whose reply was lost, so a contender never holds two. Under the advert's lock: an
        advert published while the znode is being created either comes first (the create
        writes it) or waits and rewrites the new znode; otherwise the create could write the
        older advert after the newer one was taken for published.
        """
        with self._advert_lock:
            if self._znode is not None and self._owns(self._znode):
                return self._znode
            self._bounded(self._client.ensure_path_async(self._path, **self._acl_arg()))
            self._remove_leftovers()
            try:
                self._znode = self._create()
            except (ConnectionLoss, ZooKeeperCallTimeoutError):
                # The create may have happened: look for our tag before trying again.
                self._znode = self._find_own() or self._create()
            return self._znode

    def _create(self) -> str:
        prefix = f"{self._path}/{NODE_PREFIX}{self._tag}-"
        data = self._identity.to_bytes()
        created: str = self._bounded(
            self._client.create_async(
                prefix, data, ephemeral=True, sequence=True, **self._acl_arg()
            )
        )
        return created

    def _acl_arg(self) -> dict[str, Any]:
        """``acl=`` for a create, when this election has one."""
        return {} if self._acl is None else {"acl": self._acl}

    def wait_until_first(self, stop: threading.Event, recheck_s: float = 1.0) -> bool:
        """Block until we are the lowest contender (True) or ``stop`` is set (False).

        Sets one ``exists`` watch, on the immediate predecessor only: when a node goes
        exactly one contender wakes (no herd), re-reads the children and, if not first yet,
        watches its new predecessor. Re-checks every ``recheck_s`` so a lost watch (session
        events drop pending watches) cannot stall us; each re-check hands kazoo the same
        callback for the same predecessor (kazoo keeps a set per path), so a long-lived
        predecessor does not pile up one pending callback per second.
        """
        watched = ""
        woken = threading.Event()
        watcher = _setter(woken)
        self.woken_at = None
        while not stop.is_set():
            predecessor = self._predecessor()
            if predecessor is None:
                return True
            path = f"{self._path}/{predecessor}"
            if path != watched:
                watched, woken = path, threading.Event()
                watcher = _setter(woken)
            if self._bounded(self._client.exists_async(path, watch=watcher)):
                woken.wait(recheck_s)
            if woken.is_set():
                self.wakeups += 1
                self.woken_at = time.monotonic()
                watched = ""
        return False

    def token(self) -> int:
        """The fencing token: our znode's czxid, after checking this session owns it.

        A token is only ever derived from a node this session owns (``ephemeralOwner``).
        Sequence numbers are per-parent, 32-bit and compared as strings by some tools, so
        they are never tokens.
        """
        znode = self._require_znode()
        stat = self._bounded(self._client.exists_async(znode))
        if stat is None or stat.ephemeralOwner != self._session_id():
            raise ElectionNodeLostError(f"election node {znode} is gone or not ours")
        return int(stat.czxid)

    def still_ours(self) -> bool:
        """True while our znode exists and belongs to the current session."""
        return self._znode is not None and self._owns(self._znode)

    def leave(self) -> None:
        """Delete our node (hands over at once if we lead). Harmless if already gone."""
        if self._znode is None:
            return
        try:
            if self._owns(self._znode):
                self._bounded(self._client.delete_async(self._znode))
        except NoNodeError:
            pass
        finally:
            self._znode = None

    def contenders(self) -> list[Contender]:
        """Everyone in the election, leader first."""
        return self.queue().contenders

    def queue(self) -> Queue:
        """The whole election as :func:`read_queue` reads it, every call bounded."""
        self._bounded(self._client.sync_async(self._path))
        try:
            children = self._bounded(self._client.get_children_async(self._path))
        except NoNodeError:
            return Queue()
        return _queue(
            self._path,
            children,
            lambda znode: self._bounded(self._client.get_async(znode)),
            lambda znode: self._bounded(self._client.exists_async(znode)),
        )

    def publish(self, identity: Identity) -> None:
        """Rewrite our znode's data (what we advertise); before :meth:`join`, what the
        join will write. Under the advert's lock (see :meth:`join`)."""
        with self._advert_lock:
            self._identity = identity
            if self._znode is not None:
                self._bounded(self._client.set_async(self._znode, identity.to_bytes()))

    def _predecessor(self) -> str | None:
        """The nearest *ephemeral* contender before ours, or None: we lead.

        A persistent lookalike in between is skipped; one that vanished is gone.
        """
        znode = self._require_znode()
        name = znode.rsplit("/", 1)[1]
        order = ordered(self._bounded(self._client.get_children_async(self._path)))
        if name not in order:
            raise ElectionNodeLostError(f"election node {znode} is gone")
        for candidate in reversed(order[: order.index(name)]):
            stat = self._bounded(self._client.exists_async(f"{self._path}/{candidate}"))
            if stat is not None and stat.ephemeralOwner:
                return candidate
        return None

    def _require_znode(self) -> str:
        if self._znode is None:
            raise ElectionNodeLostError("not in the election (join first)")
        return self._znode

    def _remove_leftovers(self) -> None:
        """Delete every znode with our tag that our session still owns: one whose delete
        lost its connection (a step-down while a ZooKeeper server died). Joining again
        beside it would queue us twice, and the older znode, first in the queue and
        watched by nobody who could act on it, would stall the election for as long as
        our session lives (a mixed drill found exactly that)."""
        prefix = f"{NODE_PREFIX}{self._tag}-"
        for child in self._bounded(self._client.get_children_async(self._path)):
            path = f"{self._path}/{child}"
            if child.startswith(prefix) and self._owns(path):
                with contextlib.suppress(NoNodeError):
                    self._bounded(self._client.delete_async(path))
                log.info("election_leftover_removed", znode=path)

    def _find_own(self) -> str | None:
        for child in self._bounded(self._client.get_children_async(self._path)):
            if child.startswith(f"{NODE_PREFIX}{self._tag}-"):
                return f"{self._path}/{child}"
        return None

    def _owns(self, znode: str) -> bool:
        stat = self._bounded(self._client.exists_async(znode))
        return stat is not None and stat.ephemeralOwner == self._session_id()

    def _session_id(self) -> int | None:
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    def _bounded(self, pending: IAsyncResult) -> Any:
        """The result of a kazoo async call, waiting at most ``call_timeout_s``."""
        return bounded(pending, self._call_timeout_s)


def _setter(event: threading.Event) -> Callable[[object], None]:
    """A watch callback that only sets ``event``: callbacks share kazoo's one thread and
    must not block or call ZooKeeper.
    """
    return lambda _watched_event: event.set()


def read_contenders(client: KazooClient, path: str) -> list[Contender]:
    """The contenders under ``path`` in election order (see :func:`read_queue`)."""
    return read_queue(client, path).contenders


def read_queue(client: KazooClient, path: str) -> Queue:
    """The election under ``path`` as an outsider sees it (``allocator status``).

    The contenders in order (:func:`ordered`; only *ephemeral* children count) and every
    other child (a persistent lookalike, a foreign name) ignored, with the reason. A
    ``sync`` first: the server read from has then seen every change the ensemble's leader
    committed before (ZooKeeper promises no more without it). Whatever a znode holds, this
    does not raise for it; a missing path is an empty queue.
    """
    try:
        client.sync(path)
        children = client.get_children(path)
    except NoNodeError:
        return Queue()
    return _queue(path, children, client.get, client.exists)


def _queue(
    path: str,
    children: Sequence[str],
    get: Callable[[str], tuple[bytes, Any]],
    exists: Callable[[str], Any],
) -> Queue:
    """:class:`Queue` of ``children`` of ``path``, reading each with ``get`` (``exists``
    when its ACL refuses us its data)."""
    contenders: list[Contender] = []
    ignored: list[Ignored] = []
    for child in sorted(children):
        znode = f"{path.rstrip('/')}/{child}"
        sequence = sequence_of(child)
        if sequence < 0:
            ignored.append(Ignored(znode, "name not n-<32 hex>-<10 digits>"))
            continue
        data: bytes | None
        try:
            data, stat = get(znode)
            problem: str | None = None
        except NoNodeError:
            continue  # left while we were reading
        except NoAuthError:  # not ours: its ACL keeps its data from us
            stat = exists(znode)
            if stat is None:
                continue
            data, problem = None, "data not readable (its ACL refuses us)"
        if not stat.ephemeralOwner:
            ignored.append(Ignored(znode, "not ephemeral"))
            continue
        identity, unparsed = Identity.parse(data)
        contenders.append(Contender(znode, sequence, identity, problem or unparsed))
    contenders.sort(key=lambda c: (c.sequence, c.znode))
    return Queue(contenders, ignored)
