"""What ``allocator bench claims`` reports: the JSON document (docs/design.md §10's keys plus
``batch``, ``ratio_vs``, ``prior_claims`` and more) and the table, with the targets marked
met or MISSED next to the timings, never judged (the exit status does not depend on them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any, Final

from allocator.bench.claims.contenders import REFERENCE
from allocator.bench.claims.plan import Plan, Result
from allocator.bench.stock import BLOCK_SIZE_IDS

TARGETS: Final = {
    "vs_skip_locked": 5.0,
    "vs_segment_update": 10.0,
    "vs_nextval": 0.4,
    "p99_ms_below": 5.0,
    "prior_vs_fresh": 0.9,
}


def document(
    plan: Plan,
    results: list[Result],
    *,
    claim_role: str,
    template: dict[str, Any],
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
            "clients": list(plan.clients),
            "seconds": plan.seconds,
            "batches": list(plan.batches),
            "prior_claims": plan.prior_claims,
            "prior_clients": list(plan.prior_clients),
            "block_size_ids": BLOCK_SIZE_IDS,
            "pgbench": "-n -M prepared -c C -j min(C,2) -T seconds -l",
            "claim_role": claim_role,
            "kind": "burst_from_stocked_pool",
            "age_bound": plan.age_bound,
        },
        "targets": TARGETS,
        "template": template,
        "server": settings,
        "database": database,
        "cluster": cluster,
        "took_s": took_s,
        "machine": machine,
    }


def table(document: dict[str, Any], results: list[Result]) -> Iterator[str]:
    """The table's lines: every result, then the targets met or MISSED and the ceiling the
    ``durable_commit`` reference puts on the nextval target."""
    plan, machine = document["plan"], document["machine"]
    yield (
        "allocator bench claims: a BURST (pgbench drains a pool stocked before each run; no "
        "leader cuts meanwhile): what a claim costs, not a rate a cluster sustains"
    )
    yield (
        "claim path: with a bound on an ID's age in force, as a serving cluster's claims take"
        if plan["age_bound"]
        else "claim path: WITHOUT a bound on an ID's age (no serving cluster takes it)"
    )
    yield (
        f"{plan['seconds']:g} s per run, pgbench {plan['pgbench']}, "
        f"blocks of {plan['block_size_ids']} IDs, {document['template']['blocks']:,} blocks "
        f"stocked per run, {machine['cpus']} CPUs, load {machine['loadavg_before'][0]:.2f} "
        f"-> {machine['loadavg_after'][0]:.2f}"
    )
    yield ""
    yield (
        f"{'method':<15} {'clients':>7} {'batch':>5} {'prior':>9} {'claims/s':>10} "
        f"{'IDs/s':>14} {'p50 ms':>7} {'p99 ms':>7} {'pgbench':>7}  ratio claim_blocks / baseline"
    )
    for r in results:
        ratios = "  ".join(f"{k} {v:.2f}x" for k, v in r.ratio_vs.items())
        if r.vs_fresh is not None:
            ratios = f"vs fresh {r.vs_fresh:.1%}  " + ratios
        flag = "  POOL RAN DRY" if r.pool_exhausted else ""
        yield (
            f"{r.method:<15} {r.clients:>7} {r.batch:>5} {r.prior_claims:>9,} "
            f"{r.claims_per_s:>10,.0f} {r.ids_per_s:>14,.0f} {r.p50_ms:>7.2f} "
            f"{r.p99_ms:>7.2f} {r.generator_cpu_share:>7.0%}  {ratios}{flag}"
        )
    targets = document["targets"]
    top = max(plan["clients"])
    yield "(pgbench: the load generator's own share of the machine's CPU time during the run)"
    yield ""
    yield (
        f"targets at {top} clients, batch 1 (reported, not judged): >= "
        f"{targets['vs_skip_locked']:g}x "
        f"skip_locked, >= {targets['vs_segment_update']:g}x segment_update, >= "
        f"{targets['vs_nextval']:g}x nextval, p99 < {targets['p99_ms_below']:g} ms, after prior "
        f"claims >= {targets['prior_vs_fresh']:.0%} of fresh"
    )
    for r in results:
        if r.method != "claim_blocks" or r.clients != top or r.batch != 1:
            continue  # the targets are for single-block claims; batches are shown above
        marks = [
            _mark(f"{k} {v:.2f}x", v >= targets[f"vs_{k}"])
            for k, v in r.ratio_vs.items()
            if f"vs_{k}" in targets
        ]
        marks.append(_mark(f"p99 {r.p99_ms:.2f} ms", r.p99_ms < targets["p99_ms_below"]))
        if r.vs_fresh is not None:
            marks.append(
                _mark(f"vs fresh {r.vs_fresh:.1%}", r.vs_fresh >= targets["prior_vs_fresh"])
            )
        yield f"  claim_blocks batch {r.batch} prior {r.prior_claims:,}: " + ", ".join(marks)
    yield from _ceiling(results, top, targets["vs_nextval"])


def _ceiling(results: list[Result], clients: int, nextval_target: float) -> Iterator[str]:
    """What the reference says about the nextval target: no durable claim beats it."""
    for r in results:
        ratio = r.ratio_vs.get("nextval")
        if r.method != REFERENCE or r.clients != clients or ratio is None:
            continue
        verdict = (
            "so no durable claim can reach the nextval target on this server"
            if ratio < nextval_target
            else "so the nextval target is within reach of a durable claim here"
        )
        yield (
            f"  ceiling: durable_commit (one-row INSERT, no index, synchronous commit) runs "
            f"{r.claims_per_s:,.0f}/s = {ratio:.2f}x nextval, {verdict} "
            f"(target {nextval_target:g}x)"
        )


def _mark(text: str, met: bool) -> str:
    return f"{text} ({'met' if met else 'MISSED'})"
