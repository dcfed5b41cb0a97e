"""What every leader-only job gets: the term, the database, the config, the metrics, the
hooks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from allocator.config import Config
from allocator.core.clock import wall_clock_ms
from allocator.core.leadership import Term
from allocator.metrics import NodeMetrics
from allocator.node.seams import LeaderHooks, LeaderStore


@dataclass
class LeaderContext:
    """One term's jobs' shared state.

    - A job runs only while ``term.may_write()``; it checks before each write and passes
      ``commit_if=term.may_write``, so a write that started under trust and lost it rolls
      back.
    - Jobs of one term never overlap: each writer runs under ``busy`` (so stopping the jobs
      can wait for the one in flight).
    - A job that meets :class:`FencedError` reports it through ``hooks.on_fenced`` and
      stops; the node ends the term. Every fenced write that commits is reported to
      ``hooks.health`` (the leader hands over when none has for too long).
    - ``refilling`` is set while a refill runs, so the low-water check does not wake it
      again.
    - ``claim_position_sampled`` is the claim position the sampling job read last in this
      term (None before its first run): the hand-outs it measures next lie above it.
    """

    term: Term
    db: LeaderStore
    config: Config
    metrics: NodeMetrics
    hooks: LeaderHooks
    now_ms: Callable[[], int] = wall_clock_ms
    busy: threading.Lock = field(default_factory=threading.Lock)
    wake_refill: Callable[[], None] = lambda: None
    refilling: threading.Event = field(default_factory=threading.Event)
    claim_position_sampled: int | None = None
