"""What ``allocator bench sustained`` reports: the JSON document and the table.

Sustained rows (the headline), burst rows (``bench claims``'s ``claim_blocks`` and
``durable_commit`` on the same server), their ratios, and what limited each sustained run;
the goal (:data:`GOAL_VS_BURST` at the largest client count) is marked met or MISSED, never
judged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any, Final

from allocator.bench.claims.contenders import REFERENCE
from allocator.bench.claims.plan import Result
from allocator.bench.sustained.plan import NODES, Plan

GOAL_VS_BURST: Final = 0.8


def document(
    plan: Plan,
    sustained: list[dict[str, Any]],
    burst: list[Result],
    burst_evidence: list[dict[str, Any]],
    *,
    standby: dict[str, Any],
    template: dict[str, Any],
    settings: dict[str, str],
    cluster: dict[str, Any],
    claim_role: str,
    took_s: float,
    machine: dict[str, Any],
) -> dict[str, Any]:
    """The run's JSON: ``sustained`` and ``burst`` rows, the burst runs' evidence (watched
    as the sustained runs are), ``ratios`` per client count."""
    return {
        "sustained": sustained,
        "burst": [asdict(r) for r in burst],
        "burst_evidence": burst_evidence,
        "ratios": ratios(sustained, burst),
        "plan": {
            "clients": list(plan.clients),
            "seconds": plan.seconds,
            "burst_seconds": plan.burst_seconds if plan.burst else None,
            "burst_age_bound": plan.burst_age_bound if plan.burst else None,
            "batch": plan.batch,
            "nodes": NODES,
            "pgbench": "-n -M prepared -c C -j min(C,2) -T seconds -l",
            "claim_role": claim_role,
            "kind": "sustained_live_cluster_with_sync_standby",
            "sampling": {
                "wait_events_every_s": plan.wait_events_every_s,
                "pool_and_standby_every_s": plan.pool_every_s,
                "cpu_every_s": plan.cpu_every_s,
            },
        },
        "targets": {"sustained_vs_burst_min": GOAL_VS_BURST, "at_clients": max(plan.clients)},
        "standby": standby,
        "template": template,
        "server": settings,
        "database": "embedded",
        "cluster": cluster,
        "took_s": took_s,
        "machine": machine,
    }


def ratios(sustained: list[dict[str, Any]], burst: list[Result]) -> list[dict[str, Any]]:
    """Sustained claims/s over the burst's and over the reference's, per client count."""
    rows = []
    for run in sustained:
        row: dict[str, Any] = {"clients": run["clients"]}
        for name, method in (("vs_burst", "claim_blocks"), ("vs_durable_commit", REFERENCE)):
            base = next(
                (r for r in burst if r.method == method and r.clients == run["clients"]), None
            )
            row[name] = (
                round(run["claims_per_s"] / base.claims_per_s, 3)
                if base is not None and base.claims_per_s > 0
                else None
            )
        rows.append(row)
    return rows


def table(document: dict[str, Any]) -> Iterator[str]:
    """The table's lines: sustained beside burst and reference, the goal, then each
    sustained run's evidence (pool, cutter, WAL, standby, other transactions, CPU, waits)."""
    plan, machine = document["plan"], document["machine"]
    standby = document["standby"]["before"]
    yield (
        f"allocator bench sustained: SUSTAINED claims on a live {plan['nodes']}-node cluster "
        f"(leader cutting) with its synchronous standby "
        f"(synchronous_standby_names = {standby['synchronous_standby_names']}, "
        + ", ".join(f"{s['name']} {s['sync_state']}" for s in standby["standbys"])
        + ")"
    )
    burst_s = plan["burst_seconds"]
    yield (
        f"{plan['seconds']:g} s per sustained run"
        + (f", {burst_s:g} s per burst run (pre-filled pool, same server)" if burst_s else "")
        + f", batch {plan['batch']}, {machine['cpus']} CPUs {machine.get('cpu_model', '')}, "
        f"load {machine['loadavg_before'][0]:.2f} -> {machine['loadavg_after'][0]:.2f}"
    )
    yield ""
    yield (
        f"{'clients':>7} {'claims/s':>9} {'IDs/s':>13} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p99.9':>7} {'pool min/med/last':>21} {'cut/s':>8} {'AL003':>5} "
        f"{'burst/s':>9} {'durable/s':>9} {'vs burst':>8} {'vs dur.':>8}"
    )
    burst = document["burst"]
    for run, ratio in zip(document["sustained"], document["ratios"], strict=True):
        b = _find(burst, "claim_blocks", run["clients"])
        d = _find(burst, REFERENCE, run["clients"])
        pool = run["pool"]
        level = "/".join(
            str(pool.get(key, "-")) for key in ("min_blocks", "median_blocks", "last_blocks")
        )
        yield (
            f"{run['clients']:>7} {run['claims_per_s']:>9,.0f} {run['ids_per_s']:>13,} "
            f"{run['p50_ms']:>7.2f} {run['p99_ms']:>7.2f} {run['p999_ms']:>7.2f} {level:>21} "
            f"{_num(pool.get('cut_blocks_per_s')):>8} {run['claim_errors']['pool_empty']:>5} "
            f"{_num(b and b['claims_per_s']):>9} {_num(d and d['claims_per_s']):>9} "
            f"{_x(ratio['vs_burst']):>8} {_x(ratio['vs_durable_commit']):>8}"
            + ("  POOL RAN DRY" if run["pool_ran_dry"] else "")
        )
    target = document["targets"]
    for ratio in document["ratios"]:
        if ratio["clients"] == target["at_clients"] and ratio["vs_burst"] is not None:
            met = ratio["vs_burst"] >= target["sustained_vs_burst_min"]
            yield (
                f"goal: sustained >= {target['sustained_vs_burst_min']:g}x burst at "
                f"{target['at_clients']} clients: {_x(ratio['vs_burst'])} "
                f"({'met' if met else 'MISSED'}; reported, not judged)"
            )
    yield ""
    yield "what limited each sustained run:"
    for run in document["sustained"]:
        burst_run = next(
            (
                b
                for b in document["burst_evidence"]
                if b["method"] == "claim_blocks" and b["clients"] == run["clients"]
            ),
            None,
        )
        yield from _limits(run, burst_run)


def _limits(run: dict[str, Any], burst: dict[str, Any] | None) -> Iterator[str]:
    cutter = run["cutter"]
    yield f"  {run['clients']} client(s), sustained:"
    yield (
        f"    cutter: cut {_num(cutter['cut_blocks_per_s'])} blocks/s for "
        f"{_num(cutter['claimed_blocks_per_s'])} claimed/s (x{_num(cutter['cut_over_claimed'])}); "
        f"pool trend {_num(run['pool'].get('trend_blocks_per_s'))} blocks/s"
    )
    yield from _evidence(run)
    if burst is not None:
        yield f"  {run['clients']} client(s), burst claim_blocks (same server, for comparison):"
        yield from _evidence(burst)


def _evidence(found: dict[str, Any]) -> Iterator[str]:
    wal, lag, cpu = found["wal"], found["standby"], found["cpu"]
    flush = lag.get("flush_lag_ms") or {}
    yield (
        "    claim path: "
        + ("with the age bound in force" if found["age_bound_in_force"] else "no age bound")
        + " (migration 0011)"
    )
    yield (
        f"    WAL: {_num(wal['wal_bytes_per_claim'])} B, {_num(wal['wal_records_per_claim'])} "
        f"records, {_num(wal['wal_syncs_per_claim'])} flushes per claim "
        f"({_num(wal['claims_per_wal_sync'])} claims per flush), {wal['checkpoints']} checkpoint(s)"
    )
    yield (
        f"    standby: flush lag median {_num(flush.get('median'))} ms, max "
        f"{_num(flush.get('max'))} ms; sync in {lag['sync_samples']}/{lag['samples']} samples"
    )
    yield (
        "    other transactions on the allocator database (the nodes): "
        f"{_num(found['other_xacts_per_s'])}/s"
    )
    top = sorted(cpu["share"].items(), key=lambda kv: -kv[1])
    yield (
        f"    CPU (share of {cpu['span_s']:g} s x CPUs; machine busy "
        f"{_pct(cpu['machine_busy_share'])}, of which not the run's "
        f"{_pct(cpu['not_the_bench_share'])}): "
        + ", ".join(f"{k} {_pct(v)}" for k, v in top if v >= 0.005)
    )
    waits = [w for w in found["wait_events"] if w["what"] != "idle"]
    yield "    sessions by wait (mean per sample): " + ", ".join(
        f"{w['who']} {w['what']} {w['mean_sessions']:g}" for w in waits[:8]
    )


def _find(rows: list[dict[str, Any]], method: str, clients: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["method"] == method and r["clients"] == clients), None)


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value < 100:
        return f"{value:.2f}"
    return f"{value:,.0f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
