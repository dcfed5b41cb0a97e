"""The embedded cluster behind ``allocator local``: ZooKeeper, PostgreSQL and nodes on loopback
(docs/design.md §8). One manager, :class:`~allocator.local.cluster.LocalCluster`, used by
tests, demo, drills and benchmarks; one module per job. Layout on disk: deploy/local/README.md.
"""

from __future__ import annotations
