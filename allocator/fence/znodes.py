"""The fence's znodes beside the election path, read and written through kazoo.

The generation (written by ``fence rebase`` only) and the watermark (raised by leaders).
Every call is bounded: kazoo queues requests while disconnected, and a plain call would wait
for the reconnect, however long.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.interfaces import IAsyncResult
from kazoo.security import ACL

from allocator import fence
from allocator.config import Config
from allocator.core.errors import AllocatorError
from allocator.fence.report import ZooKeeperFence
from allocator.zookeeper.calls import bounded, wait, zookeeper_errors

WATERMARK_ATTEMPTS = 5
WRITE_ATTEMPTS = 10
"""Versioned writes of the generation znode before giving up on a racing writer."""


class WatermarkRaceError(AllocatorError):
    """Others kept rewriting the watermark while we tried to raise it."""


class FenceReads:
    """The generation and the watermark, read after one sync (:meth:`FenceZnodes.start_reads`);
    each answer is waited for when asked, with the same bounds and errors as
    :meth:`FenceZnodes.generation` and :meth:`FenceZnodes.watermark`."""

    def __init__(
        self,
        call_timeout_s: float,
        sync: IAsyncResult,
        generation: IAsyncResult,
        watermark: IAsyncResult,
    ) -> None:
        self._call_timeout_s = call_timeout_s
        self._sync = sync
        self._generation = generation
        self._watermark = watermark

    def _answer(self, pending: IAsyncResult) -> bytes | None:
        """The data read after the sync; None when the znode is absent."""
        bounded(self._sync, self._call_timeout_s)
        try:
            data, _stat = bounded(pending, self._call_timeout_s)
        except NoNodeError:
            return None
        return bytes(data)

    def generation(self) -> int:
        """As :meth:`FenceZnodes.generation` (``ValueError`` for a znode that is no
        number)."""
        data = self._answer(self._generation)
        return 0 if data is None else fence.parse_generation(data)

    def watermark(self) -> fence.Watermark | None:
        """As :meth:`FenceZnodes.watermark` (``ValueError`` for a znode that is no
        watermark)."""
        data = self._answer(self._watermark)
        return None if data is None else fence.Watermark.from_bytes(data)


class FenceZnodes:
    """The generation and the watermark beside one election path, through one client, every
    call bounded by ``call_timeout_s`` (a node's: :class:`~allocator.zookeeper.election.
    Election` holds one)."""

    def __init__(
        self,
        client: KazooClient,
        election_path: str,
        *,
        call_timeout_s: float,
        acl: Sequence[ACL] | None = None,
    ) -> None:
        self._client = client
        self._path = election_path
        self._call_timeout_s = call_timeout_s
        self._acl = list(acl) if acl else None

    def _acl_arg(self) -> dict[str, Any]:
        return {} if self._acl is None else {"acl": self._acl}

    def _bounded(self, pending: IAsyncResult) -> Any:
        return bounded(pending, self._call_timeout_s)

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

    def start_reads(self) -> FenceReads:
        """A takeover's reads, sent at once: one sync, then the generation and the watermark.

        A session's requests are answered in the order they were sent, so both reads follow
        the sync, as in :meth:`generation` and :meth:`watermark`; pipelined, they cost one
        round trip instead of four.
        """
        sync = self._client.sync_async(fence.generation_path(self._path))
        generation = self._client.get_async(fence.generation_path(self._path))
        watermark = self._client.get_async(fence.watermark_path(self._path))
        return FenceReads(self._call_timeout_s, sync, generation, watermark)

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
                    self._bounded(
                        self._client.create_async(path, mark.to_bytes(), **self._acl_arg())
                    )
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


def read_zookeeper_fence(
    client: KazooClient,
    election_path: str,
    config: Config,
    *,
    chroot: str = "",
    watermark: tuple[fence.Watermark | None, str | None] | None = None,
) -> ZooKeeperFence:
    """The generation znode beside ``election_path`` and the path's pzxid, after a sync.

    ``election_path`` is as ``client`` addresses it; ``chroot`` only names the znode for
    people when ``client`` runs inside one. ``watermark``: :func:`read_watermark`'s answer
    read before the database (the order of :func:`allocator.cluster_status.gather`); read here
    when not given.
    """
    path = fence.generation_path(election_path)
    wait(client.sync_async(election_path), config)
    try:
        data, _stat = wait(client.get_async(path), config)
    except NoNodeError:
        data = None
    stat = wait(client.exists_async(election_path), config)
    newest = 0 if stat is None else int(stat.pzxid)
    try:
        generation: int | None = fence.parse_generation(data)
        problem = None
    except ValueError as exc:
        generation, problem = None, str(exc)
    mark, mark_problem = watermark or read_watermark(client, election_path, config)
    return ZooKeeperFence(generation, newest, chroot + path, problem, mark, mark_problem)


def read_watermark(
    client: KazooClient, election_path: str, config: Config
) -> tuple[fence.Watermark | None, str | None]:
    """The watermark beside ``election_path`` and why it does not parse: (None, None) when
    absent, (None, problem) when it holds something else (reported, never a refusal).

    It lags the database (:mod:`allocator.fence`): a verdict that compares the two must read
    it *before* the database, or a leader cutting between the reads makes a healthy database
    look restored."""
    try:
        raw, _stat = wait(client.get_async(fence.watermark_path(election_path)), config)
    except NoNodeError:
        return None, None
    try:
        return fence.Watermark.from_bytes(raw), None
    except ValueError as exc:
        return None, str(exc)


def ensure_paths(
    client: KazooClient, chroot: str, election_path: str, acl: list[ACL] | None, config: Config
) -> list[str]:
    """The chroot and the election path, created when missing; returns those created.

    Only the chroot and what lies below it carry the cluster's ACL; parents above the
    chroot belong to whoever shares the ensemble."""
    created: list[str] = []
    with zookeeper_errors(config, "recreate the election path"):
        if chroot and posixpath.dirname(chroot) != "/":
            wait(client.ensure_path_async(posixpath.dirname(chroot)), config)
        for path in filter(None, (chroot, election_path)):
            if wait(client.exists_async(path), config) is None:
                wait(client.ensure_path_async(path, acl=acl), config)
                created.append(path)
    return created


class Written(NamedTuple):
    """What :func:`write_generation` found and did."""

    previous: int | None
    """The generation the znode held before; None when absent or not a number."""
    existed: bool
    written: bool


def write_generation(
    client: KazooClient, path: str, generation: int, acl: list[ACL] | None, config: Config
) -> Written:
    """``generation`` into ``path`` (create, or a versioned set that never lowers it: of two
    operators racing, the higher generation stays)."""
    data = str(generation).encode()
    for _ in range(WRITE_ATTEMPTS):
        try:
            old, stat = wait(client.get_async(path), config)
        except NoNodeError:
            try:
                wait(client.create_async(path, data, acl=acl), config)
            except NodeExistsError:
                continue  # another writer: read again
            return Written(None, existed=False, written=True)
        try:
            previous: int | None = fence.parse_generation(old)
        except ValueError:
            previous = None  # garbage: the re-base rewrites it
        if previous is not None and previous >= generation:
            return Written(previous, existed=True, written=False)
        try:
            wait(client.set_async(path, data, version=stat.version), config)
        except BadVersionError:
            continue
        return Written(previous, existed=True, written=True)
    raise AllocatorError(f"{path} kept changing under {WRITE_ATTEMPTS} attempts to write it")
