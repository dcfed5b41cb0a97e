"""The samples of ``allocator bench slow-consumer`` and what it computes from them: windows,
ratios, the profile along the run, and one run's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from allocator.bench.server import percentile_ms

MEASURES: Final = ("pool_status", "requeue_stranded", "claim")
"""What the bench judges against the target."""
REPORTED: Final = (*MEASURES, "requeue_commit")


@dataclass(frozen=True)
class Window:
    """One measure over one window (the first or the last ``window`` claims by completion
    time): how many samples, nearest-rank p50 and p99."""

    samples: int
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class Measure:
    """One measure's first and last window, and their ratios (last over first)."""

    first: Window
    last: Window
    p50_ratio: float | None
    p99_ratio: float | None

    @classmethod
    def of(cls, first_us: list[int], last_us: list[int]) -> Measure:
        """From the latencies (µs) of the first and the last window."""
        first, last = _window(first_us), _window(last_us)
        return cls(
            first=first,
            last=last,
            p50_ratio=_ratio(last.p50_ms, first.p50_ms),
            p99_ratio=_ratio(last.p99_ms, first.p99_ms),
        )


@dataclass
class RunResult:
    """One run of the bench, at one schema revision."""

    functions: str
    """The schema revision the run measured (``0004`` = held tickets, ``0003`` = before)."""
    claims: int
    window_claims: int
    seconds: float
    claims_per_s: float
    leader_ticks: int
    blocks_cut: int
    blocks_requeued: int
    pool_ran_dry: bool
    measures: dict[str, Measure]
    held: dict[str, Any] = field(default_factory=dict)
    """The open claim: block, whether it survived the run, what the leader saw of it at the
    end, and whether it came back to the pool after its rollback."""
    load: dict[str, float | None] = field(default_factory=dict)
    """Mean 1-minute load average of the machine during the first and the last window."""
    profile: list[dict[str, Any]] = field(default_factory=list)
    """p50/p99 of each measure over each tenth of the claims, in order."""


@dataclass(frozen=True)
class Sample:
    """One timed statement of a ticking thread."""

    started: float
    """Wall-clock time (``time.time()``) it started: pgbench logs wall-clock times."""
    took_us: int
    load1: float
    """The machine's 1-minute load average then (the bench shares the machine)."""


@dataclass(frozen=True)
class Claim:
    """One claim of pgbench: when it ended (wall clock) and its execution time."""

    ended: float
    exec_us: int


class Spans:
    """Claims (sorted by end time) and the timed samples of each ticking thread, cut into
    spans of consecutive claims: a span's samples are those that started while its claims
    were completing."""

    def __init__(
        self, claims: list[Claim], samples: dict[str, list[Sample]], wall_started: float
    ) -> None:
        self._claims = claims
        self._samples = samples
        self._wall_started = wall_started

    def span(self, begin: int, end: int) -> tuple[dict[str, list[int]], list[float]]:
        """Latencies (µs) of claims ``begin … end - 1`` and of every sampled statement in
        their span of time, by measure; and the load averages seen by those samples."""
        since = self._claims[begin - 1].ended if begin > 0 else self._wall_started
        until = self._claims[end - 1].ended
        found: dict[str, list[int]] = {"claim": [c.exec_us for c in self._claims[begin:end]]}
        loads: list[float] = []
        for name, samples in self._samples.items():
            inside = [s for s in samples if since <= s.started <= until]
            found[name] = [s.took_us for s in inside]
            loads += [s.load1 for s in inside]
        return found, loads

    def ends(self, window: int) -> tuple[int, int]:
        """Where the last window begins, and the number of claims."""
        total = len(self._claims)
        return total - window, total

    def measures(self, window: int) -> dict[str, Measure]:
        """Each reported measure over the first and the last ``window`` claims."""
        (first, _), (last, _) = self.span(0, window), self.span(*self.ends(window))
        return {name: Measure.of(first[name], last[name]) for name in REPORTED}

    def load(self, window: int) -> dict[str, float | None]:
        """The machine's mean 1-minute load average during the first and the last window."""
        (_, first), (_, last) = self.span(0, window), self.span(*self.ends(window))
        return {"first": _mean(first), "last": _mean(last)}

    def profile(self, buckets: int) -> list[dict[str, Any]]:
        """p50/p99 of each measure over ``buckets`` equal runs of consecutive claims: how
        the costs move along the whole run, not only at its two ends."""
        total = len(self._claims)
        rows: list[dict[str, Any]] = []
        for k in range(buckets):
            begin, end = total * k // buckets, total * (k + 1) // buckets
            if end <= begin:
                continue
            found, _ = self.span(begin, end)
            row: dict[str, Any] = {"claims_done": end}
            for name in REPORTED:
                window = _window(found[name])
                row[name] = {"p50_ms": window.p50_ms, "p99_ms": window.p99_ms}
                row[name]["samples"] = window.samples
            rows.append(row)
        return rows


def _window(samples_us: list[int]) -> Window:
    ordered = sorted(samples_us)
    return Window(
        samples=len(ordered),
        p50_ms=percentile_ms(ordered, 0.50),
        p99_ms=percentile_ms(ordered, 0.99),
    )


def _ratio(last: float, first: float) -> float | None:
    return round(last / first, 3) if first > 0 else None


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None
