"""What ``allocator bench slow-consumer`` reports: the JSON document and the table.

Every measure's first and last window, their ratios, the held claim's fate, the
profile along the run and the machine's load in each window; the target
(:data:`TARGET_P99_RATIO`) is printed next to the ratios, marked met or MISSED, never judged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from allocator.bench.slow_consumer.plan import Plan
from allocator.bench.slow_consumer.stats import MEASURES, REPORTED, RunResult

TARGET_P99_RATIO = 1.5


def document(
    plan: Plan,
    results: list[RunResult],
    *,
    claim_role: str,
    settings: dict[str, str],
    database: str,
    cluster: dict[str, Any],
    took_s: float,
    machine: dict[str, Any],
) -> dict[str, Any]:
    """The run's JSON (``database``: ``url`` or ``embedded``)."""
    return {
        "results": [asdict(r) for r in results],
        "plan": {
            "claims": plan.total_claims(),
            "window_claims": plan.window_claims(),
            "rate": plan.rate,
            "clients": plan.clients,
            "requeue_every_claims": plan.requeue_every,
            "leader_tick_s": plan.tick_s(),
            "status_every_ms": plan.status_every_ms,
            "pool_blocks": plan.pool_blocks,
            "warmup_claims": plan.warmup_claims(),
            "revisions": list(plan.revisions),
            "pgbench": "-n -M prepared -c C -j min(C,2) -R rate -t claims/C -l",
            "claim_role": claim_role,
            "held_claim": "after the warm-up, in a transaction kept open; SET LOCAL "
            "idle_in_transaction_session_timeout = 0 after the claim",
        },
        "targets": {"p99_ratio_max": TARGET_P99_RATIO},
        "server": settings,
        "database": database,
        "cluster": cluster,
        "took_s": took_s,
        "machine": machine,
    }


def table(document: dict[str, Any], results: list[RunResult]) -> Iterator[str]:
    """The table's lines: each run's windows and ratios beside the target, the held claim's
    fate, the profile and the machine's load."""
    plan, machine = document["plan"], document["machine"]
    yield (
        f"allocator bench slow-consumer: one claim held open across {plan['claims']:,} claims "
        f"at {plan['rate']:,}/s ({plan['clients']} pgbench clients), leader every "
        f"{plan['requeue_every_claims']} claims, pool_status read every "
        f"{plan['status_every_ms']} ms, pool kept at {plan['pool_blocks']:,} blocks; "
        f"first vs last {plan['window_claims']:,} claims; {machine['cpus']} CPUs, load "
        f"{machine['loadavg_before'][0]:.2f} -> {machine['loadavg_after'][0]:.2f}"
    )
    yield ""
    yield (
        f"{'functions':<9} {'measured':<17} {'first p50':>9} {'first p99':>9} "
        f"{'last p50':>9} {'last p99':>9} {'p50 x':>7} {'p99 x':>7} {'samples':>13}"
    )
    for r in results:
        for name in REPORTED:
            m = r.measures[name]
            yield (
                f"{r.functions:<9} {name:<17} {m.first.p50_ms:>9.3f} {m.first.p99_ms:>9.3f} "
                f"{m.last.p50_ms:>9.3f} {m.last.p99_ms:>9.3f} {_x(m.p50_ratio):>7} "
                f"{_x(m.p99_ratio):>7} {m.first.samples:>6}/{m.last.samples:<6}"
            )
    yield (
        "(ms; x = last / first; samples = first / last window; requeue_commit: the COMMIT "
        "after requeue_stranded, a WAL flush)"
    )
    yield ""
    for r in results:
        held = r.held
        yield (
            f"{r.functions}: held claim (block {held['block_id']}) "
            f"{'survived the run' if held['survived'] else 'DID NOT SURVIVE'}; at the end the "
            f"floor lagged the claim position by {held['floor_lag_tickets']:,} tickets"
            + f", high_water {held['high_water_pages']} pages"
            + (
                f", block {'listed' if held['in_held_tickets'] else 'NOT listed'} in held_tickets"
                if held["in_held_tickets"] is not None
                else ""
            )
            + "; after its rollback "
            + (
                f"requeued by {held['requeue_runs_after_rollback']} leader run(s) and "
                + ("claimed again" if held["claimed_again"] else "NOT claimed again")
                if held["requeued_after_rollback"]
                else "NOT requeued"
            )
            + (f"; claims {r.claims_per_s:,.0f}/s" if r.claims_per_s else "")
            + ("; POOL RAN DRY" if r.pool_ran_dry else "")
        )
    yield ""
    yield "p50 along the run, ms, by tenths of the claims (the windows above are the two ends):"
    for r in results:
        for name in REPORTED:
            cells = " ".join(f"{row[name]['p50_ms']:>7.2f}" for row in r.profile)
            yield f"  {r.functions:<5} {name:<17} {cells}"
    for r in results:
        first, last = r.load.get("first"), r.load.get("last")
        if first is not None and last is not None:
            yield (
                f"  {r.functions}: machine load average {first:.2f} in the first window, "
                f"{last:.2f} in the last"
            )
    target = document["targets"]["p99_ratio_max"]
    yield ""
    yield f"target: p99 last/first <= {target:g} for all three (reported, not judged)"
    for r in results:
        marks = []
        for name in MEASURES:
            ratio = r.measures[name].p99_ratio
            met = ratio is not None and ratio <= target
            marks.append(f"{name} {_x(ratio)} ({'met' if met else 'MISSED'})")
        yield f"  {r.functions}: " + ", ".join(marks)


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"
