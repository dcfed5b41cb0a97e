"""``allocator fence rebase`` before it writes anything: which databases it refuses (a
database below ZooKeeper's watermark went backwards: exit 78, the way out named) and the plan
it shows (the watermark beside the fence), from plans built here; no server."""

from __future__ import annotations

import pytest

from allocator.core.errors import AllocatorError, ConfigError
from allocator.fence import Token, Watermark
from allocator.fence.rebase import Plan, describe_plan, refuse_database_behind
from allocator.fence.report import FenceReport, ZooKeeperFence

EPOCH = 0x7_0000_002A
MARK = 123_456
ELECTION_PATH = "/eu1/allocator/election"
WATERMARK_ZNODE = "/eu1/allocator/db-watermark"


def plan(
    watermark: Watermark | None = None,
    problem: str | None = None,
    *,
    zk_generation: int | None = 0,
) -> Plan:
    zk = ZooKeeperFence(
        zk_generation, 0x10, "/eu1/allocator/fence-generation", None, watermark, problem
    )
    report = FenceReport(0, EPOCH, "node-1", zk, high_water_id=MARK)
    return Plan(report, "zk1:2181", "/eu1", ELECTION_PATH, "postgresql://ops@db1/allocator")


@pytest.mark.parametrize(
    "watermark",
    [
        Watermark(Token(0, EPOCH + 1), MARK),  # a newer fence took it after the backup
        Watermark(Token(0, EPOCH), MARK + 1),  # cuts the restored database lacks
        Watermark(Token(1, 5), MARK + 4096),  # both
    ],
    ids=["fence", "mark", "both"],
)
def test_a_database_below_the_watermark_is_refused_with_the_way_out(
    watermark: Watermark,
) -> None:
    with pytest.raises(ConfigError) as caught:
        refuse_database_behind(plan(watermark))
    assert caught.value.exit_code == 78
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("the database went backwards")
    assert f"fence {Token(0, EPOCH)}, mark {MARK}" in message
    assert f"fence {watermark.token}, mark {watermark.high_water_id}" in message
    assert WATERMARK_ZNODE in message
    assert "`allocator pool reset --after-restore`" in message
    assert message.endswith("nothing changed")


@pytest.mark.parametrize(
    ("watermark", "problem"),
    [
        (None, None),  # absent: a wiped ensemble, the usual case for a re-base
        (None, "the watermark znode holds b'x', not JSON"),  # reported, never a refusal
        (Watermark(Token(0, EPOCH), MARK), None),  # at the database
        (Watermark(Token(0, EPOCH - 1), MARK - 1), None),  # behind it: lags, as it does
    ],
    ids=["absent", "unreadable", "equal", "lagging"],
)
def test_no_refusal_unless_the_database_is_below_the_watermark(
    watermark: Watermark | None, problem: str | None
) -> None:
    refuse_database_behind(plan(watermark, problem))


def test_zookeeper_ahead_by_generation_is_still_refused() -> None:
    with pytest.raises(AllocatorError, match="the database was restored") as caught:
        refuse_database_behind(plan(zk_generation=5))
    assert caught.value.exit_code == 1


def test_the_watermark_verdict_comes_first() -> None:
    # Both say the database went back; the watermark's refusal names the way out.
    with pytest.raises(ConfigError, match="pool reset --after-restore"):
        refuse_database_behind(plan(Watermark(Token(5, 1), MARK), zk_generation=5))


def watermark_line(lines: list[str]) -> str:
    [line] = [line for line in lines if line.startswith("watermark")]
    return line


def test_the_plan_shows_the_watermark() -> None:
    copy = Watermark(Token(0, EPOCH - 1), MARK)
    line = watermark_line(describe_plan(plan(copy)))
    assert line == (
        f"watermark  {WATERMARK_ZNODE}: fence {copy.token}, mark {MARK}: "
        "the database is not below it"
    )


def test_the_plan_shows_an_absent_watermark() -> None:
    line = watermark_line(describe_plan(plan()))
    assert line.startswith(f"watermark  {WATERMARK_ZNODE}: none")


def test_the_plan_shows_an_unreadable_watermark_as_ignored() -> None:
    problem = "the watermark znode holds b'x', not JSON"
    line = watermark_line(describe_plan(plan(None, problem)))
    assert line == f"watermark  {WATERMARK_ZNODE}: unreadable, ignored ({problem})"
