"""The other contenders as the node judges them, and leaving the queue."""

from __future__ import annotations

from kazoo.exceptions import KazooException

from allocator.core import logs
from allocator.zookeeper.calls import ZooKeeperCallTimeoutError
from allocator.zookeeper.election import Contender, Election

log = logs.get_logger(__name__)


def fit_contenders(election: Election) -> list[Contender]:
    """Other contenders that advertise a reachable database and an agreeing clock (in data
    that parses: an advert we cannot read in full is no reason to hand over)."""
    own = election.znode
    return [
        c for c in election.contenders() if c.znode != own and c.problem is None and c.identity.fit
    ]


def leave(election: Election, name: str) -> None:
    """Delete our znode; if ZooKeeper cannot be reached, closing the session will."""
    try:
        election.leave()
    except (KazooException, ZooKeeperCallTimeoutError) as exc:
        log.warning("leave_failed", name=name, error=repr(exc))
