"""The rolling upgrade's verdict on each step, and its summary in the drill document. Pure:
a step (a :class:`~allocator.drill.results.RoundResult`) in, a reason or a mapping out.

A step fails when a claim failed during it (the consumers count failed calls, pool-empty
answers apart), or the leader's handover took longer than :data:`MAX_HANDOVER_MS` or did
not happen; a violation fails the run through the drill's own verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from allocator.drill.results import RoundResult

MAX_HANDOVER_MS: Final = 1000.0
"""Issue 25: every handover of a rolling upgrade under 1 s (step-down answered → the new
epoch seen in the fence)."""
MIGRATE: Final = "migrate"
REPLACE_FOLLOWER: Final = "replace-follower"
REPLACE_LEADER: Final = "replace-leader"


def step_error(step: RoundResult, *, max_handover_ms: float = MAX_HANDOVER_MS) -> str | None:
    """Why ``step`` fails (its own error first), or None when it passes."""
    if step.error is not None:
        return step.error
    if step.claim_errors:
        return f"{step.claim_errors} claim(s) failed"
    if REPLACE_LEADER in step.faults:
        if step.handover_ms is None:
            return "the leader's step-down handed over to nobody"
        if step.handover_ms > max_handover_ms:
            return f"handover took {step.handover_ms:.0f} ms (bound {max_handover_ms:.0f} ms)"
    return None


@dataclass(frozen=True)
class Swap:
    """One replaced node: the old one, its successor, its role then, how long the swap took."""

    old: str
    new: str
    role: str
    swap_s: float
    old_exit_code: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "role": self.role,
            "swap_s": round(self.swap_s, 2),
            "old_exit_code": self.old_exit_code,
        }


def summary(
    *,
    from_release: str,
    schema_before: str | None,
    schema_after: str | None,
    swaps: Sequence[Swap],
    steps: Sequence[RoundResult],
) -> dict[str, Any]:
    """The scenario's ``upgrade`` object (docs/schemas/drill.schema.json)."""
    handovers = [s.handover_ms for s in steps if REPLACE_LEADER in s.faults]
    return {
        "from_release": from_release,
        "schema_before": schema_before,
        "schema_after": schema_after,
        "max_handover_ms": MAX_HANDOVER_MS,
        "leader_handover_ms": handovers[0] if handovers else None,
        "swaps": [s.to_json() for s in swaps],
    }


def render(upgrade: dict[str, Any]) -> list[str]:
    """The table's lines for one rolling upgrade (below the scenario table)."""
    handover = upgrade.get("leader_handover_ms")
    shown = "-" if handover is None else f"{handover:.0f} ms"
    lines = [
        f"rolling upgrade from {upgrade.get('from_release')}: schema "
        f"{upgrade.get('schema_before')} -> {upgrade.get('schema_after')}; leader handover "
        f"{shown} (bound {upgrade.get('max_handover_ms', MAX_HANDOVER_MS):.0f} ms)"
    ]
    for swap in upgrade.get("swaps", []):
        lines.append(
            f"  {swap['old']} ({swap['role']}) -> {swap['new']} in {swap['swap_s']:.2f} s, "
            f"old exit {swap['old_exit_code']}"
        )
    return lines
