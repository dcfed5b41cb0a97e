"""Pure parts of the drill: percentiles, the mixed schedule, refusals, the timeline's
figures and the verdict (the checker itself is :mod:`allocator.core.verify`'s, in test_verify)."""

from __future__ import annotations

import pytest

from allocator.core.verify import Violation
from allocator.drill import output, schedule
from allocator.drill.observe import PoolState
from allocator.drill.results import RoundResult, ScenarioResult, percentile, summarize
from allocator.drill.scenarios import (
    LINKS,
    SCENARIOS,
    SIGNALS,
    STEP_DOWN,
    Target,
    refusal,
)
from allocator.drill.timeline import Sample, Timeline


@pytest.mark.parametrize(("p", "expected"), [(50, 10.0), (90, 18.0), (99, 20.0), (100, 20.0)])
def test_nearest_rank_percentiles(p: float, expected: float) -> None:
    assert percentile([float(v) for v in range(20, 0, -1)], p) == expected


def test_summary_of_nothing_is_null() -> None:
    assert summarize([]) == {"p50": None, "p90": None, "p99": None, "max": None}


# -- the mixed schedule -----------------------------------------------------------------------


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    names = list(SCENARIOS)
    first = schedule.mixed(7, 200, names)
    assert first == schedule.mixed(7, 200, names)
    assert first != schedule.mixed(8, 200, names)
    assert len(first) == 200


def test_a_schedule_draws_every_allowed_scenario_and_sometimes_two_at_once() -> None:
    plan = schedule.mixed(1, 400, SCENARIOS)
    drawn = {name for faults in plan for name in faults}
    assert drawn == set(SCENARIOS)
    pairs = [faults for faults in plan if len(faults) == 2]
    assert pairs, "no round with two faults at once"
    for node_fault, server_fault in pairs:
        assert node_fault in schedule.PAIRABLE_NODE_FAULTS
        assert server_fault in schedule.PAIRABLE_SERVER_FAULTS


def test_a_schedule_keeps_to_what_the_target_allows() -> None:
    plan = schedule.mixed(3, 100, ["step-down"])
    assert set(plan) == {("step-down",)}
    with pytest.raises(ValueError, match="no scenario"):
        schedule.mixed(3, 10, [])


# -- refusals -----------------------------------------------------------------------------------


def _target(**kwargs: object) -> Target:
    return Target(
        names=["node-1"], admin_urls={}, admin_token="t" * 24, session_timeout_ms=4000,
        zk_hosts="127.0.0.1:2181", **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_deployed_cluster_runs_only_step_down() -> None:
    capabilities = _target().capabilities()
    assert capabilities == {STEP_DOWN}
    allowed = [name for name, s in SCENARIOS.items() if refusal(s, capabilities) is None]
    assert allowed == ["step-down"]
    reason = refusal(SCENARIOS["kill"], capabilities)
    assert reason is not None
    assert "signals" in reason


def test_links_and_clocks_need_the_drills_own_cluster() -> None:
    capabilities = frozenset({SIGNALS, STEP_DOWN})
    for name in ("zk-partition-short", "zk-partition-long", "pg-partition", "clock-ahead"):
        reason = refusal(SCENARIOS[name], capabilities)
        assert reason is not None
        assert "proxies" in reason
    assert refusal(SCENARIOS["clock-ahead"], capabilities | {LINKS}) is None


def test_every_scenario_of_the_issue_exists() -> None:
    assert set(SCENARIOS) == {
        "graceful", "step-down", "kill", "pause", "expire", "zk-partition-short",
        "zk-partition-long", "pg-partition", "zk-server-kill", "zk-quorum-loss",
        "pg-restart", "pg-failover", "clock-ahead", "clock-behind", "host-death",
    }  # fmt: skip


# -- the timeline -------------------------------------------------------------------------------


def _timeline(samples: list[Sample]) -> Timeline:
    timeline = Timeline("postgresql://unused", {}, lambda: 0, clock=lambda: 0.0)
    timeline.samples = samples
    return timeline


def _sample(t_s: float, leader: str | None, level: int | None = 100, rate: float = 10.0) -> Sample:
    return Sample(t_s, level, 0, rate, leader, 5 if leader else None)


def test_leadership_merges_samples_and_leaderless_time_sums_gaps() -> None:
    timeline = _timeline(
        [
            _sample(0.0, "node-1"),
            _sample(0.5, "node-1"),
            _sample(1.0, None),
            _sample(1.5, None),
            _sample(2.0, "node-2"),
        ]
    )
    spans = timeline.leadership(end_s=3.0)
    assert [(s["node"], s["from_s"], s["to_s"]) for s in spans] == [
        ("node-1", 0.0, 1.0),
        ("node-2", 2.0, 3.0),
    ]
    assert timeline.leaderless_s() == pytest.approx(1.0)
    assert timeline.leaderless_s(0.0, 1.2) == pytest.approx(0.5)


def test_the_worst_runway_is_the_lowest_level_at_its_claim_rate() -> None:
    timeline = _timeline(
        [_sample(0.0, "a", 500), _sample(0.5, "a", 40, rate=20.0), _sample(1.0, "a", None)]
    )
    assert timeline.worst_runway() == {"at_s": 0.5, "available_blocks": 40, "runway_s": 2.0}
    assert _timeline([]).worst_runway() is None


# -- results and the verdict ---------------------------------------------------------------------


def test_mixed_results_break_handover_times_down_by_fault() -> None:
    result = ScenarioResult("mixed", 4000, 3, 3)
    result.rounds = [
        RoundResult(1, faults=["kill"], handover_ms=4000.0),
        RoundResult(2, faults=["kill", "pg-restart"], handover_ms=4200.0),
        RoundResult(3, faults=["zk-server-kill"]),
        RoundResult(4, faults=["kill"], error="no new epoch"),
    ]
    by_fault = result.by_fault()
    assert by_fault["kill"]["rounds"] == 3
    assert by_fault["kill"]["failed_rounds"] == 1
    assert by_fault["kill"]["handover_ms"]["max"] == 4200.0
    assert by_fault["zk-server-kill"]["handovers"] == 0
    assert result.failed_rounds == 1


def test_the_verdict_names_each_violation_with_its_scenario_and_fails() -> None:
    clean = ScenarioResult("graceful", 4000, 3, 3, claims=10, pool_empty=2)
    broken = ScenarioResult("kill", 4000, 3, 3, claim_error_kinds={"08006": 2}, claim_errors=2)
    broken.violations = [Violation("I3", "a stale write committed")]
    verdict = output.verdict([clean, broken], leaderless_s=1.25, worst_runway=None)
    assert verdict["ok"] is False
    assert verdict["violations"] == [
        {"invariant": "I3", "message": "a stale write committed", "scenario": "kill"}
    ]
    assert (verdict["claims"], verdict["pool_empty"], verdict["claim_errors"]) == (10, 2, 2)
    assert verdict["claim_error_kinds"] == {"08006": 2}
    assert output.verdict([clean], 0.0, None)["ok"] is True


def test_a_leader_is_at_work_once_it_cut_or_the_pool_covers_a_handover() -> None:
    assert PoolState(10, 1.0, 7).at_work(7, cover_s=8.0) == (True, "")  # cut in its term
    assert PoolState(900, 20.0, 6).at_work(7, cover_s=8.0) == (True, "")  # runway covers
    waiting, why = PoolState(100, 2.0, 6).at_work(7, cover_s=8.0)
    assert not waiting
    assert "not cut yet" in why
    assert not PoolState(100, None, 6).at_work(7, cover_s=8.0)[0]  # no rate known yet
    assert not PoolState(0, 50.0, 7).at_work(7, cover_s=8.0)[0]  # empty is never at work


def test_a_soak_draws_only_faults_the_node_processes_survive() -> None:
    plan = schedule.soak(5, 300, SCENARIOS)
    drawn = {name for faults in plan for name in faults}
    assert drawn == set(schedule.SURVIVABLE)
    assert any(len(faults) == 2 for faults in plan)  # step-down with a server fault


def test_a_quorum_loss_round_fails_on_a_restart_or_a_leaderless_time_past_its_outage() -> None:
    """Issue 24: the nodes ride a quorum outage out; the scenario's own bounds."""
    quorum_loss, kill = SCENARIOS["zk-quorum-loss"], SCENARIOS["kill"]

    def round_with(restarts: int, outage_s: float, leaderless_s: float) -> RoundResult:
        return RoundResult(1, node_restarts=restarts, outage_s=outage_s, leaderless_s=leaderless_s)

    assert quorum_loss.judge(round_with(0, 8.5, 10.4)) is None
    assert "restarted" in (quorum_loss.judge(round_with(1, 8.5, 8.0)) or "")
    assert "plus 2 s" in (quorum_loss.judge(round_with(0, 8.5, 10.6)) or "")
    assert kill.judge(round_with(1, 8.5, 30.0)) is None  # a kill restarts its node: fine
    result = ScenarioResult("zk-quorum-loss", 4000, 3, 3, rounds=[round_with(2, 8.5, 9.0)] * 2)
    assert result.to_json()["node_restarts"] == 4
    assert result.to_json()["round_results"][0]["leaderless_s"] == 9.0
    assert output.render_table([result])[0].split().count("restarts") == 1
