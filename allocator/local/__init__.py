"""The embedded cluster behind ``allocator local``: ZooKeeper, PostgreSQL and nodes on loopback.

One module per job: :mod:`~allocator.local.tcp_ports` (free loopback ports),
:mod:`~allocator.local.processes` (daemons by pid), :mod:`~allocator.local.zookeeper`,
:mod:`~allocator.local.postgres` (with :mod:`~allocator.local.pg_settings` and
:mod:`~allocator.local.pg_sql`), :mod:`~allocator.local.nodes` (node specs, environment,
``nodes.json``), :mod:`~allocator.local.supervisor` (the process that runs and restarts the
nodes), and :mod:`~allocator.local.cluster` (the manager,
:class:`~allocator.local.cluster.LocalCluster`), with the manager's concerns each in a
module: :mod:`~allocator.local.record` (its ``cluster.json`` record),
:mod:`~allocator.local.folder` (the state folder and its lock), :mod:`~allocator.local.info`
(what ``status`` reports), :mod:`~allocator.local.zk_ensemble`,
:mod:`~allocator.local.pg_servers`, :mod:`~allocator.local.supervision` (the nodes) and
:mod:`~allocator.local.stopping`. Tests, demo, drills and benchmarks all use this one
manager. Layout on disk: deploy/local/README.md.
"""

from __future__ import annotations
