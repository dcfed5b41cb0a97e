"""The drill's timeline: who served as leader when, the pool's level, claims/s, the faults."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import psycopg

from allocator.core import logs
from allocator.drill.observe import FenceReader, node_serves

log = logs.get_logger(__name__)

SAMPLE_INTERVAL_S: Final = 0.5
RATE_WINDOW_S: Final = 5.0
JOIN_TIMEOUT_S: Final = 10.0


@dataclass
class Sample:
    """One sample of the timeline: pool level, claims so far and their rate, who served."""

    t_s: float
    available_blocks: int | None
    claims: int
    claims_per_s: float
    leader: str | None
    epoch: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t_s, 2),
            "available_blocks": self.available_blocks,
            "claims_per_s": round(self.claims_per_s, 1),
            "leader": self.leader,
        }


@dataclass
class FaultMark:
    """A fault on the timeline: when it was injected and healed, its handover and outcome."""

    scenario: str
    round: int
    at_s: float
    target: str | None
    healed_s: float | None = None
    handover_ms: float | None = None
    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "round": self.round,
            "at_s": round(self.at_s, 2),
            "healed_s": None if self.healed_s is None else round(self.healed_s, 2),
            "target": self.target,
            "handover_ms": self.handover_ms,
            "ok": self.ok,
        }


class Timeline:
    """Samples the cluster in a thread; one per run, times in seconds since it started.

    Every :data:`SAMPLE_INTERVAL_S`: the fence and the pool's level on a connection of its
    own, the consumers' claim count, and the fence holder's own ``/status``. The leader then
    is the fence holder if it serves (:func:`~allocator.drill.observe.node_serves`), else
    nobody (a paused holder answers nothing); an unreadable database gives a null level and
    no leader. The thread is a daemon waiting on an Event, every read has a timeout, and
    :meth:`stop` joins it with a bound. The runner records the faults (:meth:`fault`).
    """

    def __init__(
        self,
        database_url: str,
        admin_urls: Mapping[str, str],
        claims: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fence = FenceReader(database_url, application_name="allocator-drill-timeline")
        self._admin_urls = dict(admin_urls)
        self._claims = claims
        self._clock = clock
        self.started = clock()
        self.samples: list[Sample] = []
        self.faults: list[FaultMark] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def now_s(self) -> float:
        """Seconds since :meth:`start`."""
        return self._clock() - self.started

    def at_s(self, monotonic: float) -> float:
        """A monotonic time on the timeline's axis."""
        return monotonic - self.started

    def start(self) -> None:
        """Start sampling; the timeline's zero is now (the cluster is ready)."""
        self.started = self._clock()
        self._thread = threading.Thread(target=self._run, name="drill-timeline", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops sampling; the join is bounded."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            self._thread = None
        self._fence.close()

    def fault(self, scenario: str, round_number: int, at: float, target: str | None) -> FaultMark:
        """Records a fault injected at monotonic time ``at``; the mark the runner completes."""
        mark = FaultMark(scenario, round_number, self.at_s(at), target)
        with self._lock:
            self.faults.append(mark)
        return mark

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._take()
            except Exception:  # a sample must never end the drill
                log.exception("timeline_sample_failed")
            self._stop.wait(SAMPLE_INTERVAL_S)

    def _take(self) -> None:
        t_s = self.now_s()
        claims = self._claims()
        level: int | None
        leader: str | None = None
        epoch: int | None = None
        try:
            state = self._fence.read()
            level = self._fence.available_blocks()
        except psycopg.Error:
            level = None
        else:
            epoch = state.epoch
            url = self._admin_urls.get(state.holder or "", "")
            if state.holder is not None and node_serves(url):
                leader = state.holder
        with self._lock:
            rate = self._rate(t_s, claims)
            self.samples.append(Sample(t_s, level, claims, rate, leader, epoch))

    def _rate(self, t_s: float, claims: int) -> float:
        earlier = [s for s in self.samples if t_s - s.t_s <= RATE_WINDOW_S]
        if not earlier:
            return 0.0
        first = earlier[0]
        span = t_s - first.t_s
        return (claims - first.claims) / span if span > 0 else 0.0

    # -- figures ------------------------------------------------------------------------------

    def serving_since(self, from_s: float) -> bool:
        """True once a sample taken at or after ``from_s`` saw a node serving as leader."""
        with self._lock:
            return any(s.leader is not None for s in self.samples if s.t_s >= from_s)

    def leaderless_s(self, from_s: float = 0.0, to_s: float = float("inf")) -> float:
        """Time in [from_s, to_s] that ended with nobody serving as leader: the sum of the
        sample intervals that end with nobody serving (resolution: the sample interval)."""
        with self._lock:
            samples = list(self.samples)
        total = 0.0
        for previous, sample in itertools.pairwise(samples):
            if from_s <= sample.t_s <= to_s and sample.leader is None:
                total += sample.t_s - previous.t_s
        return total

    def worst_runway(self) -> dict[str, Any] | None:
        """The sample with the lowest pool level, with its runway (the level over the claim
        rate of the last :data:`RATE_WINDOW_S`; null while nothing is claimed)."""
        with self._lock:
            known = [s for s in self.samples if s.available_blocks is not None]
        if not known:
            return None
        worst = min(known, key=lambda s: (s.available_blocks or 0, s.t_s))
        level = worst.available_blocks or 0
        runway = round(level / worst.claims_per_s, 1) if worst.claims_per_s > 0 else None
        return {"at_s": round(worst.t_s, 2), "available_blocks": level, "runway_s": runway}

    def leadership(self, end_s: float) -> list[dict[str, Any]]:
        """Intervals of one node serving as leader (consecutive samples merged)."""
        with self._lock:
            samples = list(self.samples)
        spans: list[dict[str, Any]] = []
        for sample in samples:
            last = spans[-1] if spans else None
            if last is not None and last["to_s"] is None:
                if sample.leader == last["node"] and sample.epoch == last["epoch"]:
                    continue
                last["to_s"] = round(sample.t_s, 2)
            if sample.leader is not None:
                spans.append(
                    {
                        "node": sample.leader,
                        "epoch": sample.epoch,
                        "from_s": round(sample.t_s, 2),
                        "to_s": None,
                    }
                )
        if spans and spans[-1]["to_s"] is None:
            spans[-1]["to_s"] = round(end_s, 2)
        return spans

    def to_json(self, end_s: float) -> dict[str, Any]:
        """The document's ``timeline``: leadership intervals, faults and samples."""
        with self._lock:
            samples = [s.to_json() for s in self.samples]
            faults = [f.to_json() for f in self.faults]
        return {"leadership": self.leadership(end_s), "faults": faults, "samples": samples}
