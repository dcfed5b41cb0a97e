"""Scheduled jobs (APScheduler 3.x): refill, retention, pool sampling.

Rules: each job is a small module here; jobs import ``allocator``, never the reverse.
Leader-only jobs start after the fence is taken and stop before anything else when
leadership is in doubt. (The jobs arrive with the leader, issue 3.)
"""
