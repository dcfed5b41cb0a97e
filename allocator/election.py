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
from kazoo.exceptions import ConnectionLoss, NoNodeError

from allocator.errors import AllocatorError

NODE_PREFIX = "n-"
SEQUENCE_DIGITS = 10


class ElectionNodeLostError(AllocatorError):
    """Our own election znode is gone or owned by another session: we are no contender."""


@dataclass(frozen=True)
class Identity:
    """What a contender publishes in its znode, so operators see who is queued."""

    name: str
    host: str
    pid: int
    admin_address: str

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"name": self.name, "host": self.host, "pid": self.pid, "admin": self.admin_address},
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Identity:
        try:
            raw: dict[str, Any] = json.loads(data.decode() or "{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            raw = {}
        return cls(
            name=str(raw.get("name", "?")),
            host=str(raw.get("host", "?")),
            pid=int(raw.get("pid", 0) or 0),
            admin_address=str(raw.get("admin", "")),
        )


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

    def __init__(self, client: KazooClient, path: str, identity: Identity) -> None:
        self._client = client
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
        self._client.ensure_path(self._path)
        prefix = f"{self._path}/{NODE_PREFIX}{self._tag}-"
        try:
            self._znode = self._client.create(
                prefix, self._identity.to_bytes(), ephemeral=True, sequence=True
            )
        except ConnectionLoss:
            # The create may have happened: look for our tag before trying again.
            self._znode = self._find_own() or self._client.create(
                prefix, self._identity.to_bytes(), ephemeral=True, sequence=True
            )
        return self._znode

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
            if self._client.exists(f"{self._path}/{predecessor}", watch=_setter(woken)):
                woken.wait(recheck_s)
            if woken.is_set():
                self.wakeups += 1
        return False

    def token(self) -> int:
        """The fencing token: our znode's czxid, after checking this session owns it."""
        znode = self._require_znode()
        stat = self._client.exists(znode)
        if stat is None or stat.ephemeralOwner != self._client.client_id[0]:
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
                self._client.delete(self._znode)
        except NoNodeError:
            pass
        finally:
            self._znode = None

    def contenders(self) -> list[Contender]:
        """Everyone in the election, leader first."""
        return read_contenders(self._client, self._path)

    def _predecessor(self) -> str | None:
        znode = self._require_znode()
        name = znode.rsplit("/", 1)[1]
        order = ordered(self._client.get_children(self._path))
        if name not in order:
            raise ElectionNodeLostError(f"election node {znode} is gone")
        index = order.index(name)
        return order[index - 1] if index > 0 else None

    def _require_znode(self) -> str:
        if self._znode is None:
            raise ElectionNodeLostError("not in the election (join first)")
        return self._znode

    def _find_own(self) -> str | None:
        for child in self._client.get_children(self._path):
            if child.startswith(f"{NODE_PREFIX}{self._tag}-"):
                return f"{self._path}/{child}"
        return None

    def _owns(self, znode: str) -> bool:
        stat = self._client.exists(znode)
        return stat is not None and stat.ephemeralOwner == self._client.client_id[0]


def _setter(event: threading.Event) -> Callable[[object], None]:
    """A watch callback that only sets ``event`` (callbacks share kazoo's one thread)."""
    return lambda _watched_event: event.set()


def read_contenders(client: KazooClient, path: str) -> list[Contender]:
    """The election under ``path`` as an outsider sees it (for ``allocator status``)."""
    try:
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
