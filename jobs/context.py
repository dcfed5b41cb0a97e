"""What every leader-only job gets: the term, the database, the config, the metrics.

Rules: a job runs only while ``term.may_write()``; it checks before each write and passes
``commit_if=term.may_write`` so a write that started under trust and lost it rolls back.
Jobs of one leader never overlap: each runs under ``busy`` (so stopping the jobs can wait
for the one in flight). A job that meets :class:`FencedError` reports it through
``on_fenced`` and stops; the node ends the term.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from allocator.config import Config
from allocator.db import NodeDatabase
from allocator.errors import FencedError
from allocator.leadership import Term
from allocator.metrics import NodeMetrics


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class LeaderContext:
    term: Term
    db: NodeDatabase
    config: Config
    metrics: NodeMetrics
    on_fenced: Callable[[FencedError], None]
    now_ms: Callable[[], int] = wall_clock_ms
    busy: threading.Lock = field(default_factory=threading.Lock)
    wake_refill: Callable[[], None] = lambda: None
