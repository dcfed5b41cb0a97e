"""In-memory collaborators of a node, for unit tests without servers (STYLE: a seam with a fake).

- :mod:`tests.fakes.zookeeper`: a ZooKeeper ensemble and a fake kazoo client.
- :mod:`tests.fakes.store`: the database (fence, leader history, blocks, tickets, heartbeat)
  and a node's store (the node's and the leader jobs' ports), held to the real store by
  tests/contract/test_store_contract.py.
- :mod:`tests.fakes.jobs`: leader jobs that record and report, and a fake monotonic clock.

Each module's docstring states the rules its fake keeps. The real servers' behaviour stays
the business of tests/integration and tests/chaos; a fake keeps the rules its callers depend
on, and each rule it keeps is written down (the store's, as the contract cases).
"""

from __future__ import annotations

from tests.fakes.jobs import FakeJobs, FakeMonotonic
from tests.fakes.store import DEFAULT_LAYOUT, FakeDatabase, FakeStore
from tests.fakes.zookeeper import ClientFactory, FakeEnsemble, FakeKazooClient

__all__ = [
    "DEFAULT_LAYOUT",
    "ClientFactory",
    "FakeDatabase",
    "FakeEnsemble",
    "FakeJobs",
    "FakeKazooClient",
    "FakeMonotonic",
    "FakeStore",
]
