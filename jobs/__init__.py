"""Scheduled jobs (APScheduler 3.x): the leader's refill, low-water check, retention, aging
and pool sampling.

Each job is a small module here; jobs import ``allocator``, never the reverse (they reach
the node through :class:`allocator.node.seams.LeaderJobsPort`). docs/design.md §1, §4.
"""
