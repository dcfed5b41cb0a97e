"""The cluster as an operator sees it: election order and the fence generation from ZooKeeper,
pool, fence, terms and re-bases from PostgreSQL; shared by ``allocator status``, ``watch``,
``step-down`` and ``fence``.

Rules:

- Read-only and short-lived: one kazoo client, plain database connections, all closed
  before returning. The operator's ZooKeeper client authenticates with ``zookeeper.auth``
  like a node's, and every ZooKeeper call waits at most the connect timeout.
- The order of the reads: ZooKeeper's watermark, then the database, then the rest of
  ZooKeeper (after a ``sync``). Every czxid the fence can hold was created before the
  database read, so the election path's ``pzxid`` read afterwards is at least that czxid
  in a healthy ensemble; the watermark lags the database, so read before it, it is at or
  below what the database holds. Any other order reports a leader elected, or cutting,
  between the reads as a fence *ahead of ZooKeeper* or a database *behind* it.
- Nothing ZooKeeper holds crashes the report: the queue is ordered by znode name and stat
  alone (:func:`allocator.election.read_queue`); contender data we cannot read shows as "?"
  with its ``problem`` (:meth:`Identity.parse`), children that take no place in the queue
  are listed as ignored, a generation znode that holds no number is a ``problem``
  with ``zookeeper_generation`` and ``ahead_of_zookeeper`` null (unknown), and a missing
  chroot or election path is an empty election.
- ``to_json`` keeps DESIGN §10's keys and meanings (``leader.epoch`` is the czxid half of
  the token); additions only: ``leader.generation``, ``contenders[].db_ok`` / ``clock_ok``
  (as the contender advertises them; null: not advertised), ``handovers[].generation``, and
  the top-level ``fence`` object (:meth:`FenceReport.to_json`), ``contenders[].problem``
  (why its data does not parse; null when it does) and the top-level ``election`` object
  (``unparsable``: ``[{znode, problem}]``, ``ignored``: ``[{znode, reason}]``),
  ``pool.claims_paused`` and the top-level ``claims_pause`` (``{pause_id, paused_at,
  paused_by, reason}`` while an operator has paused claims; null otherwise, or when the
  role may not read ``claim_pause_history``).
- Errors leave as the project's own: ZooKeeper unreachable → :class:`ZooKeeperUnavailableError`,
  refused for lack of auth → :class:`ConfigError` naming ``zookeeper.auth``.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult
from psycopg.rows import class_row

from allocator import db, fence, sql, zkclient
from allocator.config import Config
from allocator.db import PoolStatus, Term, read_status
from allocator.election import Contender, Ignored, Queue, read_queue
from allocator.errors import AllocatorError, ConfigError, DatabaseError, ZooKeeperUnavailableError

KAZOO_LOG = logging.getLogger(__name__ + ".kazoo")
"""kazoo's own log for the operator's client. Its retry chatter (one WARNING per refused
connection) would bury the command's one error line, which says the same; ERROR and
above still show."""
KAZOO_LOG.setLevel(logging.ERROR)

REBASE_HISTORY_LIMIT = 5
"""Re-bases shown by ``allocator status`` and ``allocator fence status``."""


@dataclass(frozen=True, slots=True)
class RebaseRecord:
    """One row of ``allocator.fence_history``: who re-based the fence, when and why."""

    rebase_id: int
    rebased_at: datetime
    rebased_by: str
    old_generation: int
    old_epoch: int
    new_generation: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rebase_id": self.rebase_id,
            "rebased_at": self.rebased_at.isoformat(),
            "rebased_by": self.rebased_by,
            "old_generation": self.old_generation,
            "old_epoch": self.old_epoch,
            "new_generation": self.new_generation,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ZooKeeperFence:
    """What ZooKeeper says about the fence: the generation and the newest zxid it issued."""

    generation: int | None
    """The generation znode's number (0 when absent); None when it holds something else."""
    newest_zxid: int
    """The election path's pzxid after a sync (0 when the path is absent)."""
    generation_znode: str
    """The generation znode's full path, chroot included (for people, not for calls)."""
    problem: str | None = None
    watermark: fence.Watermark | None = None
    """ZooKeeper's copy of the database's token and mark (None: absent or unreadable)."""
    watermark_problem: str | None = None


@dataclass(frozen=True)
class FenceReport:
    """The fence in the database next to what ZooKeeper can have issued."""

    generation: int
    epoch: int
    holder: str | None
    zookeeper: ZooKeeperFence
    rebases: list[RebaseRecord] | None = None
    """The latest re-bases, newest first; None when not read (or not readable by the role)."""
    high_water_id: int = -1
    """The database's high-water mark, read with the fence."""

    @property
    def token(self) -> fence.Token:
        return fence.Token(self.generation, self.epoch)

    @property
    def ahead_of_zookeeper(self) -> bool | None:
        """True: no node can take the fence until an operator re-bases it; None: unknown."""
        zk = self.zookeeper
        if zk.generation is None:
            return None
        return fence.ahead_of_zookeeper(self.token, zk.generation, zk.newest_zxid)

    @property
    def database_behind(self) -> str | None:
        """Why the database is below ZooKeeper's watermark (restored), or None."""
        return fence.database_behind(self.token, self.high_water_id, self.zookeeper.watermark)

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "epoch": self.epoch,
            "holder": self.holder,
            "zookeeper_generation": self.zookeeper.generation,
            "zookeeper_newest_zxid": self.zookeeper.newest_zxid,
            "generation_znode": self.zookeeper.generation_znode,
            "ahead_of_zookeeper": self.ahead_of_zookeeper,
            "problem": self.zookeeper.problem,
            "rebases": None if self.rebases is None else [r.to_json() for r in self.rebases],
            "high_water_id": self.high_water_id,
            "watermark": self.zookeeper.watermark.to_json() if self.zookeeper.watermark else None,
            "watermark_problem": self.zookeeper.watermark_problem,
            "database_behind_zookeeper": self.database_behind,
        }


@dataclass(frozen=True)
class ClusterStatus:
    contenders: list[Contender]
    pool: PoolStatus
    terms: list[Term]
    fence: FenceReport
    ignored: list[Ignored] = field(default_factory=list)
    """Children of the election path that take no place in the queue."""
    claims_pause: db.OpenPause | None = None
    """Why claims are paused (who, when); None when they are not, or the role may not read
    ``claim_pause_history`` (``pool.claims_paused`` still says whether)."""

    @property
    def leader(self) -> Contender | None:
        return self.contenders[0] if self.contenders else None

    def leader_epoch(self) -> int | None:
        return leader_epoch(self.contenders, self.pool)

    def to_json(self) -> dict[str, Any]:
        pause = self.claims_pause
        return {
            **cluster_json(self.contenders, self.pool, self.terms, self.ignored),
            "fence": self.fence.to_json(),
            "claims_pause": None
            if pause is None
            else {
                "pause_id": pause.pause_id,
                "paused_at": pause.paused_at.isoformat(),
                "paused_by": pause.paused_by,
                "reason": pause.reason,
            },
        }


def leader_epoch(contenders: list[Contender], pool: PoolStatus | None) -> int | None:
    """The fence's epoch when the first contender holds it, else None (not yet, or unknown)."""
    if not contenders or pool is None or pool.holder != contenders[0].identity.name:
        return None
    return pool.epoch


def cluster_json(
    contenders: list[Contender],
    pool: PoolStatus | None,
    terms: list[Term],
    ignored: list[Ignored],
) -> dict[str, Any]:
    """``allocator status --json`` but the fence: leader, contenders, election, pool and
    handovers (DESIGN §10); also each node's status page (:mod:`allocator.cluster_view`),
    where ``pool`` is null until the database has answered."""
    leader = contenders[0] if contenders else None
    epoch = leader_epoch(contenders, pool)
    generation = None if epoch is None or pool is None else pool.generation
    # The same czxid can come back after an ensemble rebuild: match the whole token.
    since = next(
        (t.elected_at for t in terms if (t.generation, t.epoch) == (generation, epoch)),
        None,
    )
    return {
        "leader": None
        if leader is None
        else {
            "name": leader.identity.name,
            "host": leader.identity.host,
            "pid": leader.identity.pid,
            "epoch": epoch,
            "generation": generation,
            "since": since.isoformat() if since else None,
            "admin_url": leader.identity.admin_address,
        },
        "contenders": [
            {
                "name": c.identity.name,
                "host": c.identity.host,
                "pid": c.identity.pid,
                "znode": c.znode,
                "admin_url": c.identity.admin_address,
                "db_ok": c.identity.db_ok,
                "clock_ok": c.identity.clock_ok,
                "blocked": c.identity.blocked,
                "problem": c.problem,
            }
            for c in contenders
        ],
        "election": {
            "unparsable": [
                {"znode": c.znode, "problem": c.problem}
                for c in contenders
                if c.problem is not None
            ],
            "ignored": [{"znode": i.znode, "reason": i.reason} for i in ignored],
        },
        "pool": None
        if pool is None
        else {
            "available_blocks": pool.available_blocks,
            "available_ids": pool.available_ids,
            "runway_s": pool.runway_s,
            "high_water_id": pool.high_water_id,
            "claim_rate_blocks_per_s": pool.claim_rate_blocks_per_s,
            "claims_paused": pool.claims_paused,
        },
        "handovers": [
            {
                "epoch": t.epoch,
                "generation": t.generation,
                "holder": t.holder,
                "elected_at": t.elected_at.isoformat(),
                "ended_at": t.ended_at.isoformat() if t.ended_at else None,
                "end_reason": t.end_reason,
            }
            for t in terms
        ],
    }


# -- ZooKeeper -------------------------------------------------------------------------------


def split_hosts(hosts: str) -> tuple[str, str]:
    """``zk1:2181,zk2:2181/a/b`` → (``zk1:2181,zk2:2181``, ``/a/b``); no chroot → ``""``."""
    servers, slash, chroot = hosts.partition("/")
    return servers, (slash + chroot).rstrip("/")


def zookeeper_client(config: Config, *, chroot: bool = True) -> KazooClient:
    """An operator's kazoo client (not started): the config's hosts, with or without their
    chroot, authenticated like a node (:func:`allocator.zkclient.client`)."""
    return zkclient.client(config, chroot=chroot, logger=KAZOO_LOG)


def start(client: KazooClient, config: Config) -> None:
    """Connect, or raise :class:`ZooKeeperUnavailableError`. A missing chroot is no error here
    (the caller reports an empty election), so kazoo's warning about it is silenced."""
    zk = config.zookeeper
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No chroot path exists")
        try:
            client.start(timeout=zk.connect_timeout_s)
        except KazooTimeoutError as exc:
            raise ZooKeeperUnavailableError(
                f"no ZooKeeper server answered at {zk.hosts} within {zk.connect_timeout_s:g} s"
            ) from exc


def close(client: KazooClient) -> None:
    client.stop()
    client.close()


@contextmanager
def zookeeper_errors(config: Config, what: str) -> Iterator[None]:
    """Translates kazoo's errors raised while doing ``what`` into the project's."""
    hosts = config.zookeeper.hosts
    try:
        yield
    except (NoAuthError, AuthFailedError) as exc:
        raise ConfigError(
            f"{what}: ZooKeeper at {hosts} refused access; check zookeeper.auth"
        ) from exc
    except (ConnectionLoss, SessionExpiredError, KazooTimeoutError) as exc:
        raise ZooKeeperUnavailableError(
            f"{what}: lost the connection to ZooKeeper at {hosts}"
        ) from exc
    except KazooException as exc:
        raise AllocatorError(f"{what}: ZooKeeper at {hosts} refused the request") from exc


def wait(pending: IAsyncResult, config: Config) -> Any:
    """A kazoo async call's result within the connect timeout (kazoo queues calls while
    disconnected; a plain call would wait for the reconnect, however long)."""
    return pending.get(timeout=config.zookeeper.connect_timeout_s)


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
    read before the database (module rules); read here when not given.
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


def read_zookeeper(config: Config) -> tuple[Queue, ZooKeeperFence]:
    """The election queue and the fence as ZooKeeper sees it, from one session."""
    path = config.zookeeper.election_path
    client = zookeeper_client(config)
    start(client, config)
    try:
        with zookeeper_errors(config, "read the election"):
            queue = read_queue(client, path)
            zk_fence = read_zookeeper_fence(
                client, path, config, chroot=split_hosts(config.zookeeper.hosts)[1]
            )
    finally:
        close(client)
    return queue, zk_fence


def read_contenders_once(config: Config) -> list[Contender]:
    return read_zookeeper(config)[0].contenders


# -- PostgreSQL -------------------------------------------------------------------------------


def read_rebases(
    url: str,
    limit: int = REBASE_HISTORY_LIMIT,
    *,
    connect_timeout_s: float = db.STATUS_CONNECT_TIMEOUT_S,
    statement_timeout_ms: int = db.STATUS_STATEMENT_TIMEOUT_MS,
) -> list[RebaseRecord] | None:
    """The latest ``limit`` re-bases, newest first; None when the role may not read them
    (``fence_history`` is for the node and operator roles; a consumer still gets a status)."""
    what = "read the fence history"
    try:
        with psycopg.connect(
            url,
            connect_timeout=max(2, math.ceil(connect_timeout_s)),
            application_name=db.STATUS_APPLICATION_NAME,
        ) as conn:
            conn.read_only = True
            with conn.transaction():
                conn.execute(
                    sql.SET_LOCAL_STATEMENT_TIMEOUT,
                    {"statement_timeout": str(statement_timeout_ms)},
                )
                with conn.cursor(row_factory=class_row(RebaseRecord)) as cursor:
                    return cursor.execute(sql.FENCE_HISTORY, {"limit": limit}).fetchall()
    except psycopg.errors.InsufficientPrivilege:
        return None
    except psycopg.Error as exc:
        raise db.translate(exc, what) from exc


def read_open_pause(
    url: str, *, connect_timeout_s: float = db.STATUS_CONNECT_TIMEOUT_S
) -> db.OpenPause | None:
    """Why claims are paused (migration 0010); None when they are not or the role may not
    read ``claim_pause_history`` (node and operator roles may)."""
    try:
        with db.operator_session(url, connect_timeout_s=connect_timeout_s) as session:
            return session.open_pause()
    except DatabaseError as exc:
        if isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
            return None
        raise


# -- together ---------------------------------------------------------------------------------


def gather(
    config: Config, history_limit: int = 10, rebase_limit: int = REBASE_HISTORY_LIMIT
) -> ClusterStatus:
    """Everything ``allocator status`` shows; ``rebase_limit=0`` skips the fence history."""
    url = config.postgres.url.get_secret_value()
    timeout_s = config.postgres.connect_timeout_s
    path = config.zookeeper.election_path
    client = zookeeper_client(config)
    start(client, config)
    try:
        with zookeeper_errors(config, "read the election"):  # the watermark first: module rules
            wait(client.sync_async(path), config)
            watermark = read_watermark(client, path, config)
        pool, terms = read_status(url, history_limit=history_limit, connect_timeout_s=timeout_s)
        rebases = (
            read_rebases(url, rebase_limit, connect_timeout_s=timeout_s) if rebase_limit else None
        )
        pause = read_open_pause(url, connect_timeout_s=timeout_s) if pool.claims_paused else None
        with zookeeper_errors(config, "read the election"):  # after the database
            queue = read_queue(client, path)
            zk_fence = read_zookeeper_fence(
                client,
                path,
                config,
                chroot=split_hosts(config.zookeeper.hosts)[1],
                watermark=watermark,
            )
    finally:
        close(client)
    report = FenceReport(
        pool.generation, pool.epoch, pool.holder, zk_fence, rebases, pool.high_water_id
    )
    return ClusterStatus(queue.contenders, pool, terms, report, queue.ignored, pause)


def gather_fence(config: Config, rebase_limit: int = REBASE_HISTORY_LIMIT) -> FenceReport:
    """The fence in the database next to ZooKeeper's view of it (``allocator fence status``)."""
    return gather(config, history_limit=1, rebase_limit=rebase_limit).fence
