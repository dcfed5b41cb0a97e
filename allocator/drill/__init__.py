"""``allocator drill``: failover rehearsals of a local or deployed cluster (DESIGN §9, §10).

The package, one job per module:

- :mod:`.scenarios`: every fault (what it needs, how it is applied and healed);
  :mod:`.schedule`: the seeded mixed schedule (two faults at once sometimes).
- :mod:`.runner`: rounds against a ready cluster, handover times, the verdict (the one
  checker, :mod:`allocator.core.verify`); :mod:`.observe`: how the cluster is seen (fence,
  election, the nodes' own ``/status``, their logs); :mod:`.sql`: its statements.
- :mod:`.timeline`: who served as leader when, pool level, claims/s, faults;
  :mod:`.resources`: a soak's per-node memory, open files and threads.
- :mod:`.links`, :mod:`.proxy`, :mod:`.shim`: the drill's own links between each node and
  ZooKeeper/PostgreSQL (cut, black-holed) and a node's skewed clock (libfaketime).
- :mod:`.results`, :mod:`.output`, :mod:`.report`: what was measured, the table and JSON,
  the report's files and Markdown (:mod:`.report_png`: its picture; :mod:`.report_document`:
  the document read null-tolerantly).

``allocator/commands/drill.py`` is the thin click wrapper. Nothing here is a test switch:
the drill breaks a cluster only from outside, through real mechanisms.
"""
