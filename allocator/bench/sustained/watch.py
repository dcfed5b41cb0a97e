"""One watched run (:class:`Watch`): the server's counters before and after, a
:class:`~allocator.bench.sustained.sampler.Sampler` in between, the machine's and the
bench's own CPU time; then the evidence of what limited the claims, the same for a
sustained run and for a burst."""

from __future__ import annotations

import resource
from types import TracebackType
from typing import Any

import psycopg

from allocator.bench.server import BenchError, Server
from allocator.bench.sustained import evidence
from allocator.bench.sustained.cpu import CpuMeter, Roots, machine_busy_s, shares
from allocator.bench.sustained.plan import Plan
from allocator.bench.sustained.sampler import Sampler
from allocator.local import postgres


class Watch:
    """``with Watch(…) as watch:`` around a pgbench run; then :meth:`evidence`."""

    def __init__(self, server: Server, allocator_url: str, plan: Plan, roots: Roots) -> None:
        self._admin_url = server.url("postgres")
        self._cpu = CpuMeter(roots)
        self.sampler = Sampler(self._admin_url, allocator_url, plan, self._cpu)
        self._before: dict[str, dict[str, int]] = {}
        self._delta: dict[str, dict[str, int]] = {}
        self._busy = (0.0, 0.0)
        self._self_cpu_s = 0.0

    def __enter__(self) -> Watch:
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            self._before = evidence.counters(conn, postgres.DATABASE)
        self._busy, self._self_cpu_s = machine_busy_s(), _self_cpu_s()
        self.sampler.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.sampler.stop()
        busy = machine_busy_s()
        self._busy = (busy[0] - self._busy[0], busy[1] - self._busy[1])
        self._self_cpu_s = _self_cpu_s() - self._self_cpu_s
        if exc_type is not None:
            return
        if self.sampler.error is not None:
            raise BenchError(f"the sampler failed: {self.sampler.error}") from self.sampler.error
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            self._delta = evidence.deltas(self._before, evidence.counters(conn, postgres.DATABASE))

    def evidence(self, claims: int, claims_here: int, pgbench_cpu_s: float) -> dict[str, Any]:
        """WAL per claim, the standby's lag, the allocator database's other transactions
        (``claims_here``: how many of the claims ran on it), CPU by role, wait events."""
        span, delta, sampler = self.sampler.span_s(), self._delta, self.sampler
        other = delta["database"]["xact_commit"] - claims_here - sampler.pool_reads
        cpu_s = {
            **self._cpu.by_role(),
            "pgbench": pgbench_cpu_s,
            "bench": round(self._self_cpu_s, 2),
        }
        busy, total = self._busy
        return {
            "standby": sampler.lag_summary(),
            "wal": {**evidence.per_claim(delta, claims, span), "delta": delta["wal"]},
            "checkpoints": delta["checkpoints"],
            "database": delta["database"],
            "other_xacts_per_s": round(other / span, 1) if span else None,
            "cpu": {
                "span_s": round(span, 2),
                "seconds": cpu_s,
                "share": shares(cpu_s, span, ()),
                "machine_busy_share": round(busy / total, 3) if total else None,
                "not_the_bench_share": (
                    round(max(0.0, busy - sum(cpu_s.values())) / total, 3) if total else None
                ),
            },
            "wait_events": sampler.wait_events(),
            "wait_samples": sampler.wait_samples,
        }


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
