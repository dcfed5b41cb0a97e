"""The cluster as one node shows it on its status page (:mod:`allocator.node.cluster_view`): the
leader since its term began, the queue, the pool, the last handovers; a failing source keeps
its last answer and says why; nothing is read while nobody looks."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from allocator.core.errors import DatabaseUnavailableError
from allocator.core.records import BlockAgeStatus, PoolStatus, TermRecord
from allocator.node.cluster_view import HANDOVERS, ClusterView
from allocator.zookeeper.calls import ZooKeeperCallTimeoutError
from allocator.zookeeper.election import Contender, Identity, Queue
from tests import output_schemas

ELECTED = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
NOW = ELECTED.timestamp() + 90.0


def contender(name: str, sequence: int) -> Contender:
    return Contender(
        f"/election/n-{'0' * 32}-{sequence:010d}",
        sequence,
        Identity(name, f"{name}.host", 100 + sequence, f"http://{name}:8470", True, True),
    )


def term(holder: str, epoch: int, ended: bool) -> TermRecord:
    return TermRecord(
        epoch=epoch,
        holder=holder,
        host=f"{holder}.host",
        pid=1,
        elected_at=ELECTED,
        ended_at=ELECTED if ended else None,
        end_reason="stepped_down" if ended else None,
        generation=1,
    )


class Store:
    def __init__(self) -> None:
        self.reachable = True
        self.reads = 0
        self.holder = "a"
        self.epoch = 7

    def pool_status(self) -> PoolStatus:
        self.reads += 1
        if not self.reachable:
            raise DatabaseUnavailableError("read the pool status: connection refused")
        return PoolStatus(
            available_blocks=40,
            available_ids=40 * 4096,
            claim_rate_blocks_per_s=2.0,
            runway_s=20.0,
            high_water_id=12345,
            cut_position=50,
            claim_position=10,
            epoch=self.epoch,
            holder=self.holder,
            generation=1,
        )

    def block_age_status(self) -> BlockAgeStatus:
        if not self.reachable:
            raise DatabaseUnavailableError("read the block age status: connection refused")
        return BlockAgeStatus(300_000, True, ELECTED, True, 42_000)

    def leader_history(self, limit: int) -> list[TermRecord]:
        assert limit == HANDOVERS
        return [term(self.holder, self.epoch, False), term("b", self.epoch - 1, True)]


def view_of(store: Store, queue: Callable[[], Queue | None], **kwargs: float) -> ClusterView:
    return ClusterView(queue, store, wall_clock=lambda: NOW, **kwargs)  # type: ignore[arg-type]


def test_before_any_read_the_view_is_empty_and_says_so() -> None:
    view = view_of(Store(), lambda: Queue()).to_json()
    assert view["leader"] is None
    assert view["pool"] is None
    assert (view["observed_at"], view["age_s"], view["problems"]) == (None, None, [])
    assert view["now"] == NOW
    output_schemas.assert_valid("cluster", view)


def test_a_read_shows_the_leader_since_its_term_began_the_queue_pool_and_handovers() -> None:
    store = Store()
    view = view_of(store, lambda: Queue([contender("a", 1), contender("b", 2)]))
    view.refresh()
    shown = view.to_json()
    assert shown["leader"]["name"] == "a"
    assert shown["leader"]["epoch"] == 7
    assert shown["leader"]["since"] == ELECTED.isoformat()
    assert [c["name"] for c in shown["contenders"]] == ["a", "b"]
    assert shown["pool"]["available_blocks"] == 40
    assert shown["pool"]["runway_s"] == 20.0
    assert shown["block_age"] == {
        "max_block_age_s": 300.0,
        "oldest_unclaimed_age_s": 42.0,
        "leader_serves": True,
        "serve_aged_without_leader": True,
        "heartbeat_at": ELECTED.isoformat(),
    }
    assert [(t["holder"], t["end_reason"]) for t in shown["handovers"]] == [
        ("a", None),
        ("b", "stepped_down"),
    ]
    assert (shown["observed_at"], shown["age_s"], shown["problems"]) == (NOW, 0.0, [])
    output_schemas.assert_valid("cluster", shown)


def test_a_first_contender_that_does_not_hold_the_fence_yet_has_no_since() -> None:
    store = Store()
    store.holder = "b"  # a took the queue's head; its takeover has not committed yet
    view = view_of(store, lambda: Queue([contender("a", 1)]))
    view.refresh()
    assert view.to_json()["leader"]["since"] is None


def test_a_failing_source_keeps_its_last_answer_and_says_why() -> None:
    store = Store()
    queue: list[Callable[[], Queue | None]] = [lambda: Queue([contender("a", 1)])]
    view = view_of(store, lambda: queue[0]())
    view.refresh()

    def timed_out() -> Queue:
        raise ZooKeeperCallTimeoutError("no answer from ZooKeeper within 1 s")

    queue[0] = timed_out
    store.reachable = False
    view.refresh()
    shown = view.to_json()
    assert shown["leader"]["name"] == "a"
    assert shown["pool"]["available_blocks"] == 40
    assert shown["block_age"]["oldest_unclaimed_age_s"] == 42.0  # kept too
    assert shown["problems"] == [
        "election: no answer from ZooKeeper within 1 s",
        "database: read the pool status: connection refused",
    ]
    assert shown["observed_at"] == NOW  # that of the last complete read
    output_schemas.assert_valid("cluster", shown)
    queue[0] = lambda: None
    store.reachable = True
    view.refresh()
    assert view.to_json()["problems"] == ["election: no ZooKeeper session"]


def test_it_reads_only_once_someone_looks() -> None:
    store = Store()
    view = view_of(store, lambda: Queue([contender("a", 1)]), interval_s=0.01)
    view.start()
    view.stop()
    assert store.reads == 0  # nobody looked: it never read
    view = view_of(store, lambda: Queue([contender("a", 1)]), interval_s=0.01)
    view.start()
    try:
        view.to_json()  # a look wakes it, and it keeps reading
        deadline = time.monotonic() + 10
        while store.reads < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.reads >= 3
        assert view.to_json()["leader"]["name"] == "a"
    finally:
        view.stop()
