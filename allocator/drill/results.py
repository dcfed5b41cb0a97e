"""What a drill measured: one round, one scenario, and the percentiles over them. Pure data:
nothing here reads a clock, a file or a server.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.core.verify import Violation


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile ``p`` (0 < p <= 100) of ``values`` (p99 of 20 is the max);
    None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(values_ms: Sequence[float]) -> dict[str, float | None]:
    """``{"p50", "p90", "p99", "max"}`` in ms, rounded to 0.1 ms; None without values."""

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "p50": rounded(percentile(values_ms, 50)),
        "p90": rounded(percentile(values_ms, 90)),
        "p99": rounded(percentile(values_ms, 99)),
        "max": rounded(max(values_ms) if values_ms else None),
    }


@dataclass
class RoundResult:
    """One round: its faults, the leader it hit, the handover and what the consumers saw."""

    round: int
    faults: list[str] = field(default_factory=list)
    """The scenarios applied at once this round (one, or two in a mixed schedule)."""
    leader: str | None = None
    leader_pid: int | None = None
    epoch: int | None = None
    target: str | None = None
    """The node or server the fault hit (``zk-2``, ``postgres``), when not the leader."""
    new_leader: str | None = None
    new_epoch: int | None = None
    handover_ms: float | None = None
    """From the fault (for a skewed clock: the skewed node's takeover) to the first poll
    that saw a newer epoch held by another node; None when no handover happened."""
    ready_ms: float | None = None
    """From the fault until the cluster was ready again (the next round may start)."""
    error: str | None = None
    claims: int = 0
    claim_errors: int = 0
    pool_empty: int = 0
    """The consumers' claims, failed claims and "pool empty" answers during the round."""
    node_restarts: int = 0
    """Nodes running as another process once the round was over (exited and restarted)."""
    outage_s: float | None = None
    """From the fault until its heal returned (a server fault: serving again)."""
    leaderless_s: float | None = None
    """Time without a serving leader from the fault until the cluster was ready again."""

    @property
    def ok(self) -> bool:
        """The faults were applied, a handover the scenario requires came within its
        deadline, every fault was healed and the cluster became ready again (a scenario
        that only *may* hand over is ok without one; whether it did is recorded)."""
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "ok": self.ok,
            "faults": self.faults,
            "leader": self.leader,
            "leader_pid": self.leader_pid,
            "epoch": self.epoch,
            "target": self.target,
            "new_leader": self.new_leader,
            "new_epoch": self.new_epoch,
            "handover_ms": self.handover_ms,
            "ready_ms": self.ready_ms,
            "error": self.error,
            "claims": self.claims,
            "claim_errors": self.claim_errors,
            "pool_empty": self.pool_empty,
            "node_restarts": self.node_restarts,
            "outage_s": None if self.outage_s is None else round(self.outage_s, 1),
            "leaderless_s": None if self.leaderless_s is None else round(self.leaderless_s, 1),
        }


@dataclass
class ScenarioResult:
    """One scenario (or a mixed schedule); :meth:`to_json` is a ``scenario`` of
    docs/schemas/drill.schema.json (tests hold real output to it: keys are added there, never
    removed or retyped). Handover percentiles are over the rounds that handed over; a
    scenario without any reports nulls."""

    scenario: str
    session_timeout_ms: int
    nodes: int
    zk_servers: int
    rounds: list[RoundResult] = field(default_factory=list)
    claims: int = 0
    claim_errors: int = 0
    claim_error_kinds: dict[str, int] = field(default_factory=dict)
    claim_error_examples: list[str] = field(default_factory=list)
    pool_empty: int = 0
    stale_writes_rejected: int = 0
    violations: list[Violation] = field(default_factory=list)
    leaderless_s: float = 0.0
    duration_s: float = 0.0
    seed: int | None = None
    upgrade: dict[str, Any] | None = None
    """A rolling upgrade's own figures (:func:`allocator.drill.upgrade_judge.summary`)."""

    @property
    def node_restarts(self) -> int:
        """Node restarts over the rounds (a node restarted in two rounds counts twice)."""
        return sum(r.node_restarts for r in self.rounds)

    @property
    def failed_rounds(self) -> int:
        """Rounds not ok (skipped rounds included)."""
        return sum(not r.ok for r in self.rounds)

    def handover_times_ms(self, fault: str | None = None) -> list[float]:
        """Handover times of the rounds that handed over (only those with ``fault``)."""
        return [
            r.handover_ms
            for r in self.rounds
            if r.handover_ms is not None and (fault is None or fault in r.faults)
        ]

    def handover_summary(self) -> dict[str, float | None]:
        """p50/p90/p99/max of the handover times (:func:`summarize`)."""
        return summarize(self.handover_times_ms())

    def by_fault(self) -> dict[str, dict[str, Any]]:
        """Per fault kind in the rounds (a mixed schedule): rounds, failed, handover times,
        claim errors and pool-empty answers of the rounds it was in."""
        kinds = sorted({kind for r in self.rounds for kind in r.faults})
        return {
            kind: {
                "rounds": sum(kind in r.faults for r in self.rounds),
                "failed_rounds": sum(kind in r.faults and not r.ok for r in self.rounds),
                "handovers": len(self.handover_times_ms(kind)),
                "handover_ms": summarize(self.handover_times_ms(kind)),
                "claim_errors": sum(r.claim_errors for r in self.rounds if kind in r.faults),
                "pool_empty": sum(r.pool_empty for r in self.rounds if kind in r.faults),
            }
            for kind in kinds
        }

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.upgrade is None else {"upgrade": self.upgrade}
        return {
            **extra,
            "scenario": self.scenario,
            "rounds": len(self.rounds),
            "violations": [v.to_json() for v in self.violations],
            "handover_ms": self.handover_summary(),
            "stale_writes_rejected": self.stale_writes_rejected,
            "claim_errors": self.claim_errors,
            "claim_error_kinds": self.claim_error_kinds,
            "failed_rounds": self.failed_rounds,
            "handovers": len(self.handover_times_ms()),
            "leaderless_s": round(self.leaderless_s, 1),
            "node_restarts": self.node_restarts,
            "session_timeout_ms": self.session_timeout_ms,
            "nodes": self.nodes,
            "zk_servers": self.zk_servers,
            "claims": self.claims,
            "pool_empty": self.pool_empty,
            "claim_error_examples": self.claim_error_examples,
            "duration_s": round(self.duration_s, 1),
            "seed": self.seed,
            "by_fault": self.by_fault(),
            "round_results": [r.to_json() for r in self.rounds],
        }
