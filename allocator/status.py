"""The cluster as an operator sees it: election order from ZooKeeper, pool and terms from
PostgreSQL; shared by ``allocator status``, ``watch`` and ``step-down``.

Rules: read-only, short-lived connections (one kazoo client, one database connection);
``to_json`` has DESIGN §10's stable keys. The leader is the first contender in election
order; its epoch is the fence's when the fence holder is that node (during a handover the
two can briefly differ, and then the epoch is reported as null).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from allocator.config import Config
from allocator.db import PoolStatus, Term, read_status
from allocator.election import Contender, read_contenders
from allocator.errors import ZooKeeperUnavailableError


@dataclass(frozen=True)
class ClusterStatus:
    contenders: list[Contender]
    pool: PoolStatus
    terms: list[Term]

    @property
    def leader(self) -> Contender | None:
        return self.contenders[0] if self.contenders else None

    def leader_epoch(self) -> int | None:
        leader = self.leader
        if leader is None or self.pool.holder != leader.identity.name:
            return None
        return self.pool.epoch

    def to_json(self) -> dict[str, Any]:
        leader = self.leader
        epoch = self.leader_epoch()
        since = next((t.elected_at for t in self.terms if t.epoch == epoch), None)
        return {
            "leader": None
            if leader is None
            else {
                "name": leader.identity.name,
                "host": leader.identity.host,
                "pid": leader.identity.pid,
                "epoch": epoch,
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
                }
                for c in self.contenders
            ],
            "pool": {
                "available_blocks": self.pool.available_blocks,
                "available_ids": self.pool.available_ids,
                "runway_s": self.pool.runway_s,
                "high_water_id": self.pool.high_water_id,
                "claim_rate_blocks_per_s": self.pool.claim_rate_blocks_per_s,
            },
            "handovers": [
                {
                    "epoch": t.epoch,
                    "holder": t.holder,
                    "elected_at": t.elected_at.isoformat(),
                    "ended_at": t.ended_at.isoformat() if t.ended_at else None,
                    "end_reason": t.end_reason,
                }
                for t in self.terms
            ],
        }


def read_contenders_once(config: Config) -> list[Contender]:
    zk = config.zookeeper
    client = KazooClient(hosts=zk.hosts, timeout=zk.session_timeout_ms / 1000)
    try:
        client.start(timeout=zk.connect_timeout_s)
    except KazooTimeoutError as exc:
        raise ZooKeeperUnavailableError(f"no ZooKeeper server answered at {zk.hosts}") from exc
    try:
        return read_contenders(client, zk.election_path)
    finally:
        client.stop()
        client.close()


def gather(config: Config, history_limit: int = 10) -> ClusterStatus:
    contenders = read_contenders_once(config)
    pool, terms = read_status(
        config.postgres.url.get_secret_value(),
        history_limit=history_limit,
        connect_timeout_s=config.postgres.connect_timeout_s,
    )
    return ClusterStatus(contenders, pool, terms)
