"""Leader election on kazoo primitives: ephemeral sequential znodes, no herd effect.

Rules (DESIGN §3):
- Every contender creates one ephemeral sequential znode ``<path>/n-<uuid>-<seq>`` whose
  data is JSON (instance name, host, pid, admin address). The uuid lets a retry find a node
  whose ``create`` succeeded but whose reply was lost, so a contender never holds two.
- The contender with the lowest sequence number leads. Every other contender sets one
  ``exists`` watch, on its immediate predecessor only: when a node goes, exactly one
  contender wakes (no herd). A woken contender re-reads the children and, if it is not first
  yet, watches its new predecessor.
- The fencing token is the ``czxid`` of the contender's own znode, read back with the node's
  ``ephemeralOwner`` checked against our session id: a token is only ever derived from a node
  this session owns (sequence numbers are per-parent 32-bit and compared as strings by some
  tools, so they are not used as tokens).
- Every ZooKeeper call waits at most ``call_timeout_s``: kazoo queues requests while
  disconnected and a plain call would wait for the reconnect, however long, leaving the
  node deaf to its own session timer and to SIGTERM. A call that times out raises
  :class:`ZooKeeperCallTimeoutError`; the caller treats it like a lost connection.
- Nothing here decides what leading means or reacts to session state: that is
  :mod:`allocator.leadership`'s job. Watch callbacks only set an Event (they run on kazoo's
  shared callback thread and must not block or call ZooKeeper).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult

from allocator import fence
from allocator.errors import AllocatorError

NODE_PREFIX = "n-"
SEQUENCE_DIGITS = 10
DEFAULT_CALL_TIMEOUT_S = 1.0
WATERMARK_ATTEMPTS = 5


class WatermarkRaceError(AllocatorError):
    """Others kept rewriting the watermark while we tried to raise it."""


class ElectionNodeLostError(AllocatorError):
    """Our own election znode is gone or owned by another session: we are no contender."""


class ZooKeeperCallTimeoutError(AllocatorError):
    """A ZooKeeper call got no answer within its bound (the connection is probably down)."""

    exit_code = 75  # EX_TEMPFAIL


@dataclass(frozen=True)
class Identity:
    """What a contender publishes in its znode, so operators see who is queued and a leader
    that must hand over sees who would do better (``db_ok``, ``clock_ok``; None: unknown)."""

    name: str
    host: str
    pid: int
    admin_address: str
    db_ok: bool | None = None
    clock_ok: bool | None = None

    def to_bytes(self) -> bytes:
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
        return json.dumps(data, sort_keys=True).encode()

    @property
    def fit(self) -> bool:
        """True if it advertises both a reachable database and an agreeing clock."""
        return bool(self.db_ok and self.clock_ok)

    @classmethod
    def from_bytes(cls, data: bytes) -> Identity:
        """Never raises: data we cannot read becomes "?" / 0 / None field by field."""
        try:
            raw = json.loads(data.decode() or "{}")
        except (UnicodeDecodeError, ValueError):
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        pid = raw.get("pid", 0)
        return cls(
            name=_text(raw.get("name"), "?"),
            host=_text(raw.get("host"), "?"),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid >= 0 else 0,
            admin_address=_text(raw.get("admin"), ""),
            db_ok=raw.get("db_ok") if isinstance(raw.get("db_ok"), bool) else None,
            clock_ok=raw.get("clock_ok") if isinstance(raw.get("clock_ok"), bool) else None,
        )


def _text(value: object, default: str) -> str:
    return value if isinstance(value, str) else default


@dataclass(frozen=True)
class Contender:
    """One znode in election order."""

    znode: str
    sequence: int
    identity: Identity


def sequence_of(znode: str) -> int:
    """The sequence suffix of ``n-<uuid>-0000000042`` (-1 for names that are not ours)."""
    suffix = znode[-SEQUENCE_DIGITS:]
    return int(suffix) if znode.startswith(NODE_PREFIX) and suffix.isdigit() else -1


def ordered(children: list[str]) -> list[str]:
    """Contender znode names in election order (lowest sequence first), strangers dropped."""
    return sorted((c for c in children if sequence_of(c) >= 0), key=sequence_of)


class Election:
    """One contender's place in the election under ``path``."""

    def __init__(
        self,
        client: KazooClient,
        path: str,
        identity: Identity,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self._client = client
        self._call_timeout_s = call_timeout_s
        self._path = path.rstrip("/") or "/"
        self._identity = identity
        self._tag = uuid.uuid4().hex
        self._znode: str | None = None
        self.wakeups = 0
        """Times a predecessor watch woke us (herd-effect check and a metric)."""

    @property
    def path(self) -> str:
        return self._path

    @property
    def znode(self) -> str | None:
        """Our node's full path, or None before :meth:`join`."""
        return self._znode

    def join(self) -> str:
        """Create our contender node (idempotent while it exists); returns its path."""
        if self._znode is not None and self._owns(self._znode):
            return self._znode
        self._bounded(self._client.ensure_path_async(self._path))
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
            self._client.create_async(prefix, data, ephemeral=True, sequence=True)
        )
        return created

    def wait_until_first(self, stop: threading.Event, recheck_s: float = 1.0) -> bool:
        """Block until we are the lowest contender (True) or ``stop`` is set (False).

        Watches only the immediate predecessor; re-checks every ``recheck_s`` so a lost
        watch (session events drop pending watches) cannot stall us.
        """
        while not stop.is_set():
            predecessor = self._predecessor()
            if predecessor is None:
                return True
            woken = threading.Event()
            path = f"{self._path}/{predecessor}"
            if self._bounded(self._client.exists_async(path, watch=_setter(woken))):
                woken.wait(recheck_s)
            if woken.is_set():
                self.wakeups += 1
        return False

    def token(self) -> int:
        """The fencing token: our znode's czxid, after checking this session owns it."""
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
        return read_contenders(self._client, self._path)

    def publish(self, identity: Identity) -> None:
        """Rewrite our znode's data (what we advertise); a no-op before :meth:`join`."""
        self._identity = identity
        if self._znode is not None:
            self._bounded(self._client.set_async(self._znode, identity.to_bytes()))

    def generation(self) -> int:
        """The fence generation as this session reads it (0 while the znode is absent).

        Raises ``ValueError`` when the znode holds something else than a number.
        """
        path = fence.generation_path(self._path)
        self._bounded(self._client.sync_async(path))
        try:
            data, _stat = self._bounded(self._client.get_async(path))
        except NoNodeError:
            return 0
        return fence.parse_generation(data)

    def watermark(self) -> fence.Watermark | None:
        """ZooKeeper's copy of the database's token and mark (None while there is none).

        Raises ``ValueError`` when the znode holds something else than a watermark.
        """
        path = fence.watermark_path(self._path)
        self._bounded(self._client.sync_async(path))
        try:
            data, _stat = self._bounded(self._client.get_async(path))
        except NoNodeError:
            return None
        return fence.Watermark.from_bytes(data)

    def raise_watermark(self, mark: fence.Watermark) -> fence.Watermark:
        """Raise the watermark to at least ``mark`` (never lower it); returns what it holds.

        A read-modify-write on the znode's version: a concurrent writer (a paused ex-leader
        resuming) makes us read again, and whoever wrote last wrote the larger of each part.
        A watermark that does not parse is replaced.
        """
        path = fence.watermark_path(self._path)
        for _ in range(WATERMARK_ATTEMPTS):
            try:
                data, stat = self._bounded(self._client.get_async(path))
            except NoNodeError:
                try:
                    self._bounded(self._client.create_async(path, mark.to_bytes()))
                    return mark
                except NodeExistsError:
                    continue
            try:
                merged = fence.Watermark.from_bytes(data).merge(mark)
            except ValueError:
                merged = mark
            if merged.to_bytes() == data:
                return merged
            try:
                self._bounded(self._client.set_async(path, merged.to_bytes(), version=stat.version))
                return merged
            except (BadVersionError, NoNodeError):
                continue
        raise WatermarkRaceError(f"could not raise the watermark at {path}: too many races")

    def newest_zxid(self) -> int:
        """The election path's pzxid after a sync: no child was created after it."""
        self._bounded(self._client.sync_async(self._path))
        stat = self._bounded(self._client.exists_async(self._path))
        return 0 if stat is None else int(stat.pzxid)

    def _predecessor(self) -> str | None:
        znode = self._require_znode()
        name = znode.rsplit("/", 1)[1]
        order = ordered(self._bounded(self._client.get_children_async(self._path)))
        if name not in order:
            raise ElectionNodeLostError(f"election node {znode} is gone")
        index = order.index(name)
        return order[index - 1] if index > 0 else None

    def _require_znode(self) -> str:
        if self._znode is None:
            raise ElectionNodeLostError("not in the election (join first)")
        return self._znode

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
        try:
            return pending.get(timeout=self._call_timeout_s)
        except KazooTimeoutError as exc:
            raise ZooKeeperCallTimeoutError(
                f"ZooKeeper did not answer within {self._call_timeout_s} s"
            ) from exc


def _setter(event: threading.Event) -> Callable[[object], None]:
    """A watch callback that only sets ``event`` (callbacks share kazoo's one thread)."""
    return lambda _watched_event: event.set()


def read_contenders(client: KazooClient, path: str) -> list[Contender]:
    """The election under ``path`` as an outsider sees it (for ``allocator status``). A
    ``sync`` first: the server we read from has then seen every change the leader of the
    ensemble committed before (ZooKeeper promises no more without it)."""
    try:
        client.sync(path)
        children = ordered(client.get_children(path))
    except NoNodeError:
        return []
    result: list[Contender] = []
    for child in children:
        try:
            data, _stat = client.get(f"{path}/{child}")
        except NoNodeError:
            continue  # left while we were reading
        result.append(Contender(f"{path}/{child}", sequence_of(child), Identity.from_bytes(data)))
    return result
