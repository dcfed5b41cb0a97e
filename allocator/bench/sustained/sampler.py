"""The thread that watches a sustained run: wait events every 100 ms, the pool level, the
leader's cut position and the standby's lag every second, CPU by role every 0.5 s."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from typing import Any

import psycopg

from allocator.bench.sustained import queries
from allocator.bench.sustained.cpu import CpuMeter
from allocator.bench.sustained.plan import Plan
from allocator.local.nodes import CONSUMER_LOGIN_ROLE, NODE_LOGIN_ROLE


class Sampler(threading.Thread):
    """Samples until :meth:`stop`; an error ends the thread and is kept in :attr:`error`
    for the main thread to raise. ``admin_url`` is the ``postgres`` database (cluster-wide
    views, no transaction counted on the allocator's), ``allocator_url`` the allocator's
    (``pool_status``: :attr:`pool_reads` transactions there are the sampler's own)."""

    def __init__(self, admin_url: str, allocator_url: str, plan: Plan, cpu: CpuMeter) -> None:
        super().__init__(name="bench-sustained-sampler", daemon=True)
        self._admin_url = admin_url
        self._allocator_url = allocator_url
        self._plan = plan
        self._cpu = cpu
        self._stopped = threading.Event()
        self.started_at = 0.0
        self.ended_at = 0.0
        self.wait_samples = 0
        self.waits: Counter[tuple[str, str]] = Counter()
        self.pool: list[dict[str, Any]] = []
        self.replication: list[dict[str, Any]] = []
        self.pool_reads = 0
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._stopped.set()
        if self.ident is not None:
            self.join()

    def run(self) -> None:
        try:
            with (
                psycopg.connect(self._admin_url, autocommit=True) as admin,
                psycopg.connect(self._allocator_url, autocommit=True) as allocator,
            ):
                self.started_at = time.monotonic()
                self._cpu.start()
                next_pool = next_cpu = self.started_at
                due = self.started_at
                while not self._stopped.is_set():
                    now = time.monotonic()
                    self._waits(admin)
                    if now >= next_pool:
                        self._pool(allocator, admin, now)
                        next_pool += self._plan.pool_every_s
                    if now >= next_cpu:
                        self._cpu.sample()
                        next_cpu += self._plan.cpu_every_s
                    due = max(due + self._plan.wait_events_every_s, time.monotonic())
                    self._stopped.wait(due - time.monotonic())
                self._pool(allocator, admin, time.monotonic())
                self._cpu.sample()
                self.ended_at = time.monotonic()
        except BaseException as exc:  # handed to the main thread, which raises it
            self.error = exc

    def span_s(self) -> float:
        """Seconds from the first sample to the last."""
        return max(0.0, self.ended_at - self.started_at)

    def _waits(self, admin: psycopg.Connection[Any]) -> None:
        rows = admin.execute(
            queries.WAIT_EVENTS, {"claims": CONSUMER_LOGIN_ROLE, "nodes": NODE_LOGIN_ROLE}
        ).fetchall()
        self.wait_samples += 1
        for who, what, count in rows:
            self.waits[(str(who), str(what))] += int(count)

    def _pool(
        self, allocator: psycopg.Connection[Any], admin: psycopg.Connection[Any], now: float
    ) -> None:
        at = round(now - self.started_at, 2)
        row = allocator.execute(queries.POOL).fetchone()
        self.pool_reads += 1
        if row:
            self.pool.append(
                {
                    "t_s": at,
                    "available_blocks": row[0],
                    "cut_position": row[1],
                    "claim_position": row[2],
                    "holder": row[3],
                }
            )
        for name, state, sync, write, flush, replay in admin.execute(queries.REPLICATION):
            self.replication.append(
                {
                    "t_s": at,
                    "standby": name,
                    "state": state,
                    "sync_state": sync,
                    "write_lag_ms": _ms(write),
                    "flush_lag_ms": _ms(flush),
                    "replay_lag_ms": _ms(replay),
                }
            )

    def wait_events(self, top: int = 40) -> list[dict[str, Any]]:
        """The most frequent (who, what) pairs: mean sessions in that state per sample."""
        samples = max(self.wait_samples, 1)
        return [
            {"who": who, "what": what, "mean_sessions": round(count / samples, 3)}
            for (who, what), count in self.waits.most_common(top)
        ]

    def pool_summary(self) -> dict[str, Any]:
        """Pool level min/median/last, and the leader's cuts and the claims, in blocks/s."""
        levels = [int(s["available_blocks"]) for s in self.pool]
        if len(self.pool) < 2:
            return {"samples": len(levels)}
        first, last = self.pool[0], self.pool[-1]
        span = last["t_s"] - first["t_s"]
        return {
            "samples": len(levels),
            "min_blocks": min(levels),
            "median_blocks": round(statistics.median(levels)),
            "first_blocks": levels[0],
            "last_blocks": levels[-1],
            "trend_blocks_per_s": round((levels[-1] - levels[0]) / span, 1) if span else 0.0,
            "cut_blocks_per_s": _rate(first, last, "cut_position", span),
            "claimed_blocks_per_s": _rate(first, last, "claim_position", span),
            "leader": last["holder"],
            "leaders_seen": sorted({str(s["holder"]) for s in self.pool}),
        }

    def lag_summary(self) -> dict[str, Any]:
        """Median and max of the standby's write/flush/replay lag over the samples that had
        one (PostgreSQL shows none while nothing is being replicated)."""
        summary: dict[str, Any] = {
            "samples": len(self.replication),
            "sync_samples": sum(1 for s in self.replication if s["sync_state"] == "sync"),
        }
        for key in ("write_lag_ms", "flush_lag_ms", "replay_lag_ms"):
            values = [s[key] for s in self.replication if s[key] is not None]
            summary[key] = (
                {"median": round(statistics.median(values), 3), "max": round(max(values), 3)}
                if values
                else None
            )
        return summary


def _ms(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _rate(first: dict[str, Any], last: dict[str, Any], key: str, span: float) -> float:
    return round((int(last[key]) - int(first[key])) / span, 1) if span else 0.0
