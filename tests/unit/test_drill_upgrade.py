"""The rolling-upgrade drill scenario without servers: its verdict on each step, its options
(refused clearly without the old release, never part of ``all``) and the release folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from allocator.core.errors import UsageError
from allocator.core.exits import Exit
from allocator.drill import output, plan, release, upgrade_judge
from allocator.drill.results import RoundResult, ScenarioResult
from allocator.drill.scenarios import ALL, MIXED, ROLLING_UPGRADE
from allocator.drill.upgrade_judge import (
    MAX_HANDOVER_MS,
    MIGRATE,
    REPLACE_FOLLOWER,
    REPLACE_LEADER,
    Swap,
    step_error,
)


def _step(kind: str, **kwargs: object) -> RoundResult:
    step = RoundResult(1, faults=[kind])
    for key, value in kwargs.items():
        setattr(step, key, value)
    return step


def test_a_leader_step_passes_with_a_handover_within_the_bound() -> None:
    assert step_error(_step(REPLACE_LEADER, handover_ms=MAX_HANDOVER_MS)) is None


def test_a_leader_step_fails_over_the_bound_or_without_a_handover() -> None:
    slow = step_error(_step(REPLACE_LEADER, handover_ms=1000.1))
    assert slow is not None
    assert "1000 ms" in slow
    assert step_error(_step(REPLACE_LEADER)) == "the leader's step-down handed over to nobody"


@pytest.mark.parametrize("kind", [MIGRATE, REPLACE_FOLLOWER, REPLACE_LEADER])
def test_any_step_fails_on_a_claim_error_and_keeps_its_own_error_first(kind: str) -> None:
    assert step_error(_step(kind, handover_ms=10.0, claim_errors=2)) == "2 claim(s) failed"
    assert step_error(_step(kind, error="old-1 exited 1", claim_errors=2)) == "old-1 exited 1"
    assert step_error(_step(kind, handover_ms=10.0, pool_empty=5)) is None


def test_follower_and_migrate_steps_need_no_handover() -> None:
    assert step_error(_step(MIGRATE)) is None
    assert step_error(_step(REPLACE_FOLLOWER)) is None


def test_a_failed_step_fails_the_runs_verdict_and_the_summary_shows_each_swap() -> None:
    result = ScenarioResult(ROLLING_UPGRADE, 4000, 3, 1)
    leader = _step(REPLACE_LEADER, handover_ms=1500.0)
    leader.error = step_error(leader)
    result.rounds = [_step(MIGRATE), _step(REPLACE_FOLLOWER), leader]
    swaps = [Swap("old-1", "new-1", "follower", 2.0, 0), Swap("old-2", "new-3", "leader", 2.5, 0)]
    result.upgrade = upgrade_judge.summary(
        from_release="rel",
        schema_before="0009",
        schema_after="0012",
        swaps=swaps,
        steps=result.rounds,
    )
    verdict = output.verdict([result], 0.0, None)
    assert not verdict["ok"]
    assert verdict["failed_rounds"] == 1
    data = result.to_json()
    assert data["upgrade"]["leader_handover_ms"] == 1500.0
    assert [s["old"] for s in data["upgrade"]["swaps"]] == ["old-1", "old-2"]
    lines = output.render_upgrades([result])
    assert "schema 0009 -> 0012; leader handover 1500 ms (bound 1000 ms)" in lines[0]
    assert lines[2].strip() == "old-2 (leader) -> new-3 in 2.50 s, old exit 0"


def test_other_scenarios_have_no_upgrade_key() -> None:
    assert "upgrade" not in ScenarioResult("kill", 4000, 3, 1).to_json()


def _request(**kwargs: object) -> plan.Request:
    return plan.Request(**{"scenario": ROLLING_UPGRADE, "rounds": 1, **kwargs})  # type: ignore[arg-type]


def test_the_upgrade_is_refused_without_a_release_naming_the_option() -> None:
    reason = plan.upgrade_refusal(_request())
    assert reason is not None
    assert "--from-release" in reason
    assert plan.upgrade_refusal(_request(from_release="4b4f865")) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scenario": "kill", "from_release": "4b4f865"},
        {"from_release": "4b4f865", "against": Path("x")},
        {"from_release": "4b4f865", "keep": True},
        {"from_release": "4b4f865", "duration_s": 60.0},
    ],
)
def test_the_upgrade_runs_only_on_its_own_new_cluster(kwargs: dict[str, object]) -> None:
    assert plan.upgrade_refusal(_request(**kwargs)) is not None


@pytest.mark.parametrize("scenario", [ALL, MIXED])
def test_all_and_mixed_never_run_the_upgrade(scenario: str) -> None:
    assert ROLLING_UPGRADE not in plan.wanted(plan.Request(scenario=scenario, rounds=1))


def test_the_cli_exits_64_naming_the_option_before_starting_anything(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "allocator.cli",
            "drill",
            "--scenario",
            ROLLING_UPGRADE,
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == Exit.USAGE, done.stderr
    assert "--from-release" in done.stderr
    assert not (tmp_path / "state").exists()


def test_a_release_folder_needs_its_own_allocator_command(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="bin/allocator"):
        release.resolve(str(tmp_path))
    command = tmp_path / ".venv" / "bin" / "allocator"
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n")
    assert release.resolve(str(tmp_path)) == tmp_path.resolve()
    assert release.allocator_command(tmp_path, "run") == [str(command), "run"]
