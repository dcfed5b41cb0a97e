"""The cluster as an operator sees it, shared by ``allocator status``, ``watch``,
``step-down`` and ``fence``.

Election order and the fence generation from ZooKeeper; pool, fence, terms and re-bases from
PostgreSQL. Read-only and short-lived: one kazoo client and plain database connections, all
closed before returning; every ZooKeeper call waits at most the connect timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from allocator.config import Config
from allocator.core.errors import (
    DatabaseError,
)
from allocator.core.records import BlockAgeStatus, PoolStatus, TermRecord
from allocator.core.zookeeper_hosts import chroot_of
from allocator.fence.report import REBASE_HISTORY_LIMIT, FenceReport, ZooKeeperFence
from allocator.fence.znodes import read_watermark, read_zookeeper_fence
from allocator.postgres import operator as db
from allocator.postgres.operator import read_rebases, read_status
from allocator.zookeeper.calls import close, start, wait, zookeeper_client, zookeeper_errors
from allocator.zookeeper.election import Contender, Ignored, Queue, read_queue


@dataclass(frozen=True)
class ClusterStatus:
    """Everything ``allocator status`` shows, read by :func:`gather`.

    Nothing ZooKeeper holds crashes the report: contender data that does not parse shows as
    "?" with its ``problem``, children that take no place in the queue are listed as
    ignored, a generation znode that holds no number is a ``problem`` with
    ``zookeeper_generation`` and ``ahead_of_zookeeper`` null (unknown), and a missing chroot
    or election path is an empty election.
    """

    contenders: list[Contender]
    pool: PoolStatus
    terms: list[TermRecord]
    fence: FenceReport
    ignored: list[Ignored] = field(default_factory=list)
    """Children of the election path that take no place in the queue."""
    claims_pause: db.OpenPause | None = None
    """Why claims are paused (who, when); None when they are not, or the role may not read
    ``claim_pause_history`` (``pool.claims_paused`` still says whether)."""
    block_age: BlockAgeStatus | None = None
    """The bound on an ID's age and the oldest block's age; None before migration 0011."""

    @property
    def leader(self) -> Contender | None:
        """The first contender, or None when nobody is in the election."""
        return self.contenders[0] if self.contenders else None

    def leader_epoch(self) -> int | None:
        """The fence's epoch when the first contender holds it, else None."""
        return leader_epoch(self.contenders, self.pool)

    def to_json(self) -> dict[str, Any]:
        """What ``status --json`` prints: every key of docs/schemas/status.schema.json
        (docs/design.md §10).

        Tests hold real output to the schema; keys are added there, never removed or
        retyped. ``leader.epoch`` is the czxid half of the token; ``contenders[].db_ok`` /
        ``clock_ok`` are as the contender advertises them (null: not advertised); ``fence``
        is :meth:`FenceReport.to_json`; ``claims_pause`` is null when claims are served, or
        when the role may not read ``claim_pause_history``.
        """
        pause = self.claims_pause
        return {
            **cluster_json(self.contenders, self.pool, self.terms, self.ignored, self.block_age),
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
    terms: list[TermRecord],
    ignored: list[Ignored],
    block_age: BlockAgeStatus | None = None,
) -> dict[str, Any]:
    """``allocator status --json`` but the fence: leader, contenders, election, pool and
    handovers (docs/schemas/status.schema.json); also each node's status page
    (:mod:`allocator.node.cluster_view`, docs/schemas/cluster.schema.json), where ``pool`` is
    null until the database has answered."""
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
        "block_age": None if block_age is None else block_age.to_json(),
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


def read_zookeeper(config: Config) -> tuple[Queue, ZooKeeperFence]:
    """The election queue and the fence as ZooKeeper sees it, from one session.

    The operator's client authenticates with ``zookeeper.auth`` like a node's. ZooKeeper
    unreachable → :class:`ZooKeeperUnavailableError`; refused for lack of auth →
    :class:`ConfigError` naming ``zookeeper.auth``.
    """
    path = config.zookeeper.election_path
    client = zookeeper_client(config)
    start(client, config)
    try:
        with zookeeper_errors(config, "read the election"):
            queue = read_queue(client, path)
            zk_fence = read_zookeeper_fence(
                client, path, config, chroot=chroot_of(config.zookeeper.hosts)
            )
    finally:
        close(client)
    return queue, zk_fence


def read_contenders_once(config: Config) -> list[Contender]:
    """The contenders in election order, from a session of their own."""
    return read_zookeeper(config)[0].contenders


# -- PostgreSQL -------------------------------------------------------------------------------


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


def read_block_age(
    url: str, *, connect_timeout_s: float = db.STATUS_CONNECT_TIMEOUT_S
) -> BlockAgeStatus | None:
    """The bound on an ID's age and the oldest block's age (migration 0011); None when the
    database has no ``block_age_status`` yet (an older schema)."""
    try:
        with db.operator_session(url, connect_timeout_s=connect_timeout_s) as session:
            return session.block_age_status()
    except DatabaseError as exc:
        if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
            return None
        raise


# -- together ---------------------------------------------------------------------------------


def gather(
    config: Config, history_limit: int = 10, rebase_limit: int = REBASE_HISTORY_LIMIT
) -> ClusterStatus:
    """Everything ``allocator status`` shows; ``rebase_limit=0`` skips the fence history.

    The order of the reads: ZooKeeper's watermark, then the database, then the rest of
    ZooKeeper (after a ``sync``). Every czxid the fence can hold was created before the
    database read, so the election path's ``pzxid`` read afterwards is at least that czxid
    in a healthy ensemble; the watermark lags the database, so read before it, it is at or
    below what the database holds. Any other order reports a leader elected, or cutting,
    between the reads as a fence ahead of ZooKeeper or a database behind it.
    """
    url = config.postgres.url.get_secret_value()
    timeout_s = config.postgres.connect_timeout_s
    path = config.zookeeper.election_path
    client = zookeeper_client(config)
    start(client, config)
    try:
        with zookeeper_errors(config, "read the election"):  # the watermark first (docstring)
            wait(client.sync_async(path), config)
            watermark = read_watermark(client, path, config)
        pool, terms = read_status(url, history_limit=history_limit, connect_timeout_s=timeout_s)
        rebases = (
            read_rebases(url, rebase_limit, connect_timeout_s=timeout_s) if rebase_limit else None
        )
        pause = read_open_pause(url, connect_timeout_s=timeout_s) if pool.claims_paused else None
        block_age = read_block_age(url, connect_timeout_s=timeout_s)
        with zookeeper_errors(config, "read the election"):  # after the database
            queue = read_queue(client, path)
            zk_fence = read_zookeeper_fence(
                client,
                path,
                config,
                chroot=chroot_of(config.zookeeper.hosts),
                watermark=watermark,
            )
    finally:
        close(client)
    report = FenceReport(
        pool.generation, pool.epoch, pool.holder, zk_fence, rebases, pool.high_water_id
    )
    return ClusterStatus(queue.contenders, pool, terms, report, queue.ignored, pause, block_age)


def gather_fence(config: Config, rebase_limit: int = REBASE_HISTORY_LIMIT) -> FenceReport:
    """The fence in the database next to ZooKeeper's view of it (``allocator fence status``)."""
    return gather(config, history_limit=1, rebase_limit=rebase_limit).fence
