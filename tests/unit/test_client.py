"""allocator.client without a database: the buffer, the claimer thread/task, errors, close.

Rules: every test uses an in-memory claimer (``InMemoryClaimer`` or the scripted fake here);
waits are on conditions with deadlines, never fixed sleeps; speed is never asserted (the
bench measures it).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from allocator import client as client_mod
from allocator.client import (
    AsyncIdClient,
    Block,
    ClaimArgumentError,
    ClientClosedError,
    IdClient,
    InMemoryClaimer,
    PoolEmptyError,
    UnusedIds,
    claimers,
)
from allocator.client.base import backoff_delay, merge_ranges
from allocator.core.errors import AllocatorError, DatabaseError, DatabaseUnavailableError
from allocator.core.exits import Exit

FIRST = 1 << 22
DEADLINE_S = 10.0

MakeClient = Callable[..., IdClient]


def wait_until(predicate: Callable[[], bool], timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.001)


def ids_of(blocks: list[Block]) -> set[int]:
    return {i for b in blocks for i in range(b.first_id, b.last_id + 1)}


class ScriptedClaimer:
    """Raises the scripted errors first (one per call), then delegates to an InMemoryClaimer."""

    def __init__(self, errors: list[Exception], **pool: int) -> None:
        self.errors = list(errors)
        self.pool = InMemoryClaimer(**pool)
        self.calls = 0

    def claim(self, consumer: str, n: int) -> list[Block]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.pool.claim(consumer, n)

    def close(self) -> None:
        pass


@pytest.fixture
def make_client() -> Iterator[MakeClient]:
    made: list[IdClient] = []

    def make(claimer: object, **kwargs: object) -> IdClient:
        kwargs.setdefault("backoff_initial_s", 0.001)
        kwargs.setdefault("backoff_max_s", 0.01)
        made.append(IdClient(claimer, "unit-test", **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for made_client in made:
        made_client.close(timeout=5)


# -- handing out IDs ------------------------------------------------------------------------


def test_ids_ascend_without_gaps_within_blocks_and_across_boundaries(
    make_client: MakeClient,
) -> None:
    pool = InMemoryClaimer(block_size=8, first_id=FIRST)
    client = make_client(pool, batch_blocks=2)
    ids = [client.next_id() for _ in range(1000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 1000
    assert set(ids) <= ids_of(pool.handed_out)
    # InMemoryClaimer's blocks are adjacent, so the stream has no gap at any boundary.
    assert ids == list(range(FIRST, FIRST + 1000))


def test_take_and_take_ranges_span_blocks(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=100, first_id=FIRST)
    client = make_client(pool)
    first = client.next_id()
    taken = client.take(250)
    ranges = client.take_ranges(120)
    assert taken == list(range(first + 1, first + 251))
    assert sum(last - first_id + 1 for first_id, last in ranges) == 120
    assert ranges[0][0] == first + 251
    # One range per block touched, never crossing a block's end.
    assert [(r[0] - FIRST) // 100 for r in ranges] == [2, 3]
    assert all((r[0] - FIRST) // 100 == (r[1] - FIRST) // 100 for r in ranges)
    assert client.next_id() == first + 371


def test_take_rejects_a_non_positive_count(make_client: MakeClient) -> None:
    client = make_client(InMemoryClaimer())
    with pytest.raises(ValueError, match="n must be >= 1"):
        client.take(0)


def test_many_threads_get_disjoint_ids(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=64, first_id=FIRST)
    client = make_client(pool, batch_blocks=3, refill_at=0.3)
    per_thread, threads = 20_000, 8
    results: list[list[int]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads)

    def work(out: list[int]) -> None:
        barrier.wait()
        for i in range(per_thread):
            if i % 1000 == 999:
                out.extend(client.take(7))
            else:
                out.append(client.next_id())

    workers = [threading.Thread(target=work, args=(out,)) for out in results]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(DEADLINE_S)
    every = [i for out in results for i in out]
    assert len(every) == threads * (per_thread + 20 * 6)
    assert len(set(every)) == len(every)
    assert set(every) <= ids_of(pool.handed_out)
    for out in results:  # each thread sees its own IDs ascending
        assert out == sorted(out)


# -- the prefetch (double buffer) ------------------------------------------------------------


def test_next_segment_is_claimed_before_the_current_one_runs_out(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=100, first_id=FIRST)
    client = make_client(pool, refill_at=0.5)
    for _ in range(50):
        client.next_id()
    assert len(pool.claims) == 1  # 50 left: not yet
    client.next_id()  # hands out the trigger ID: 49 left
    wait_until(lambda: client.get_stats()["prefetched_blocks"] == 1)
    assert len(pool.claims) == 2
    assert client.get_stats()["ids_available"] == 49 + 100
    for _ in range(49 + 100):
        client.next_id()
    stats = client.get_stats()
    assert stats["waits"] == 1  # only the very first call waited
    assert stats["claims"] >= 2


def test_refill_at_one_claims_the_next_segment_as_soon_as_one_starts(
    make_client: MakeClient,
) -> None:
    pool = InMemoryClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, refill_at=1.0)
    client.next_id()
    wait_until(lambda: len(pool.claims) == 2)


def test_start_wait_buffers_the_first_segment(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, batch_blocks=3)
    client.start(wait=True)
    assert client.get_stats()["ids_available"] == 30
    assert client.next_id() == FIRST
    assert client.get_stats()["waits"] == 0


def test_constructor_does_no_io() -> None:
    pool = InMemoryClaimer()
    before = threading.active_count()
    client = IdClient(pool, "idle")
    assert pool.claims == []
    assert threading.active_count() == before
    assert client.close() == UnusedIds(count=0, ranges=())
    assert pool.claims == []


def test_a_url_client_connects_only_when_used() -> None:
    # An unreachable URL: building and closing the client must not touch the network.
    client = IdClient("postgresql://nobody@127.0.0.1:1/none", "idle")
    assert client.close().count == 0


# -- an empty pool, failures, retries -------------------------------------------------------


def test_empty_pool_raises_pool_empty_error_after_the_deadline(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=10, blocks=0)
    client = make_client(pool, wait_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(PoolEmptyError, match=r"within 0\.2 s: the pool is empty") as caught:
        client.next_id()
    assert time.monotonic() - started >= 0.2
    assert isinstance(caught.value, AllocatorError)
    assert isinstance(caught.value.__cause__, PoolEmptyError)
    stats = client.get_stats()
    assert stats["pool_empty_answers"] >= 1
    assert stats["wait_timeouts"] == 1
    # The claimer keeps retrying with backoff: once the pool is stocked, IDs flow again.
    pool.add_blocks(1)
    assert client.next_id() == FIRST


def test_a_timed_out_take_gives_back_what_it_gathered(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=10, first_id=FIRST, blocks=1)
    client = make_client(pool, wait_timeout_s=0.1)
    with pytest.raises(PoolEmptyError):
        client.take(15)
    assert client.take(10) == list(range(FIRST, FIRST + 10))


def test_database_unavailable_is_retried_until_a_claim_succeeds(make_client: MakeClient) -> None:
    claimer = ScriptedClaimer(
        [DatabaseUnavailableError("down"), DatabaseUnavailableError("still down")],
        first_id=FIRST,
    )
    client = make_client(claimer)
    assert client.next_id() == FIRST
    assert claimer.calls == 3
    assert client.get_stats()["claim_failures"] == 2


def test_database_unavailable_past_the_deadline_raises_it(make_client: MakeClient) -> None:
    claimer = ScriptedClaimer([DatabaseUnavailableError("down")] * 1000)
    client = make_client(claimer, wait_timeout_s=0.1)
    with pytest.raises(DatabaseUnavailableError, match=r"within 0\.1 s: down"):
        client.next_id()


def test_bad_arguments_fail_at_once_and_stop_the_claimer(make_client: MakeClient) -> None:
    claimer = ScriptedClaimer([ClaimArgumentError("bad consumer", sqlstate="AL001")])
    client = make_client(claimer, wait_timeout_s=30)
    started = time.monotonic()
    with pytest.raises(ClaimArgumentError, match="bad consumer") as caught:
        client.next_id()
    assert time.monotonic() - started < 10  # not the 30 s deadline
    assert caught.value.sqlstate == "AL001"
    assert caught.value.exit_code == Exit.USAGE
    with pytest.raises(ClaimArgumentError):
        client.next_id()
    assert claimer.calls == 1


def test_other_database_errors_fail_waiting_callers_at_once(make_client: MakeClient) -> None:
    claimer = ScriptedClaimer([DatabaseError("permission denied")], first_id=FIRST)
    client = make_client(claimer, wait_timeout_s=30, backoff_initial_s=0.2, backoff_max_s=0.2)
    with pytest.raises(DatabaseError, match="permission denied"):
        client.next_id()
    # ...while the claimer keeps retrying: fixed, it recovers.
    wait_until(lambda: client.get_stats()["claims"] == 1)
    assert client.next_id() == FIRST


def test_a_claimer_bug_becomes_a_database_error(make_client: MakeClient) -> None:
    claimer = ScriptedClaimer([RuntimeError("boom")], first_id=FIRST)
    client = make_client(claimer, wait_timeout_s=30)
    with pytest.raises(DatabaseError, match="unexpected RuntimeError: boom"):
        client.next_id()
    wait_until(lambda: client.get_stats()["claims"] == 1)
    assert client.next_id() == FIRST


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    low = [backoff_delay(a, initial_s=0.1, max_s=2.0, rng=lambda lo, hi: lo) for a in range(8)]
    high = [backoff_delay(a, initial_s=0.1, max_s=2.0, rng=lambda lo, hi: hi) for a in range(8)]
    assert high == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])
    assert low == pytest.approx([h / 2 for h in high])
    assert backoff_delay(10_000, initial_s=0.1, max_s=2.0) <= 2.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_blocks": 0}, "batch_blocks"),
        ({"batch_blocks": 1001}, "batch_blocks"),
        ({"batch_blocks": 4, "max_batch_blocks": 2}, "max_batch_blocks"),
        ({"max_batch_blocks": 1001}, "max_batch_blocks"),
        ({"refill_at": 0.0}, "refill_at"),
        ({"refill_at": 1.5}, "refill_at"),
        ({"wait_timeout_s": 0}, "wait_timeout_s"),
        ({"wait_timeout_s": float("nan")}, "wait_timeout_s"),
        ({"backoff_initial_s": 1.0, "backoff_max_s": 0.5}, "backoff_max_s"),
    ],
)
def test_settings_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IdClient(InMemoryClaimer(), "x", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("consumer", ["", "  ", "x" * 129, "a\nb"])
def test_bad_consumer_names_are_refused_before_any_io(consumer: str) -> None:
    with pytest.raises(ClaimArgumentError) as caught:
        IdClient(InMemoryClaimer(), consumer)
    assert caught.value.sqlstate == "AL001"


# -- close ---------------------------------------------------------------------------------


def test_close_reports_the_unused_ids_and_refuses_further_use(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=100, first_id=FIRST)
    client = make_client(pool, batch_blocks=2)
    assert client.take(10) == list(range(FIRST, FIRST + 10))
    report = client.close()
    # Both blocks, the rest of the first and all of the second; adjacent, so merged.
    assert report == UnusedIds(count=190, ranges=((FIRST + 10, FIRST + 199),))
    assert report.to_json()["count"] == 190
    with pytest.raises(ClientClosedError):
        client.next_id()
    with pytest.raises(ClientClosedError):
        client.take(3)
    assert client.close() is report


def test_close_reports_a_prefetched_segment_too(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, refill_at=1.0)
    client.next_id()
    wait_until(lambda: client.get_stats()["prefetched_blocks"] == 1)
    report = client.close()
    assert report.ranges == ((FIRST + 1, FIRST + 19),)
    assert report.count == 19


def test_unused_ranges_merge_only_when_adjacent() -> None:
    assert merge_ranges([(1, 4), (5, 9), (20, 29), (30, 30), (10, 12)]) == (
        (1, 9),
        (20, 30),
        (10, 12),
    )


class GatedClaimer(InMemoryClaimer):
    """Every claim after the first waits for a permit from the test."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.permits = threading.Semaphore(0)
        self.waiting = threading.Event()
        self.requested: list[int] = []

    def claim(self, consumer: str, n: int) -> list[Block]:
        self.requested.append(n)
        if len(self.requested) > 1:
            self.waiting.set()
            if not self.permits.acquire(timeout=DEADLINE_S):
                raise DatabaseUnavailableError("no permit")
        return super().claim(consumer, n)


def test_a_claim_that_lands_during_close_is_in_the_report(make_client: MakeClient) -> None:
    pool = GatedClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, refill_at=1.0)
    client.next_id()
    assert pool.waiting.wait(DEADLINE_S)  # the prefetch is in flight
    closer = threading.Timer(0.05, pool.permits.release)
    closer.start()
    report = client.close(timeout=DEADLINE_S)
    closer.join()
    assert report.complete
    assert report.ranges == ((FIRST + 1, FIRST + 19),)


def wait_in_thread(client: IdClient, waits: int) -> threading.Thread:
    """A thread blocked in next_id() until the gated claim lands."""
    waiter = threading.Thread(target=client.next_id)
    waiter.start()
    wait_until(lambda: client.get_stats()["waits"] == waits)
    return waiter


def test_a_late_prefetch_doubles_the_batch_up_to_the_maximum(make_client: MakeClient) -> None:
    pool = GatedClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, batch_blocks=2, max_batch_blocks=5)
    try:
        client.take(20)  # all of segment 1; its prefetch (2 blocks) is held at the gate
        wait_until(lambda: len(pool.requested) == 2)
        waiter = wait_in_thread(client, waits=2)  # the first wait was for segment 1
        assert client.get_stats()["batch_blocks"] == 4
        pool.permits.release()
        waiter.join(DEADLINE_S)
        client.take(19)  # the rest of segment 2; its prefetch (4 blocks) is held
        wait_until(lambda: len(pool.requested) == 3)
        waiter = wait_in_thread(client, waits=3)
        assert client.get_stats()["batch_blocks"] == 5  # doubled, capped
        pool.permits.release()
        waiter.join(DEADLINE_S)
        assert pool.requested == [2, 2, 4]
    finally:
        pool.permits.release(10)


def test_without_a_maximum_the_batch_stays_fixed(make_client: MakeClient) -> None:
    pool = GatedClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, batch_blocks=2)
    try:
        client.take(20)
        wait_until(lambda: len(pool.requested) == 2)
        waiter = wait_in_thread(client, waits=2)
        assert client.get_stats()["batch_blocks"] == 2
        pool.permits.release()
        waiter.join(DEADLINE_S)
    finally:
        pool.permits.release(10)


def test_close_wakes_a_waiting_caller(make_client: MakeClient) -> None:
    client = make_client(InMemoryClaimer(blocks=0), wait_timeout_s=30)
    failures: list[BaseException] = []

    def wait_for_an_id() -> None:
        try:
            client.next_id()
        except AllocatorError as exc:
            failures.append(exc)

    waiter = threading.Thread(target=wait_for_an_id)
    waiter.start()
    wait_until(lambda: client.get_stats()["waits"] == 1)
    client.close()
    waiter.join(DEADLINE_S)
    assert not waiter.is_alive()
    assert [type(f) for f in failures] == [ClientClosedError]


def test_context_manager_starts_and_closes() -> None:
    pool = InMemoryClaimer(block_size=10, first_id=FIRST)
    with IdClient(pool, "ctx") as client:
        assert client.next_id() == FIRST
    with pytest.raises(ClientClosedError):
        client.next_id()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_never_hands_out_the_parents_ids(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=100, first_id=FIRST)
    client = make_client(pool)
    client.next_id()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what using the inherited client does
        try:
            client.next_id()
            outcome = b"handed out an ID"
        except ClientClosedError:
            outcome = b"refused"
        except BaseException:
            outcome = b"other error"
        os.write(write_end, outcome)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        outcome = pipe.read()
    os.waitpid(pid, 0)
    assert outcome == b"refused"
    assert client.next_id() == FIRST + 1  # the parent carries on


# -- the prefetch on the caller's thread (NonBlockingClaimer) --------------------------------

CLAIMER_THREAD = "allocator-claimer:unit-test"


class WatchedClaimer(InMemoryClaimer):
    """A non-blocking InMemoryClaimer that notes which thread calls begin, poll and finish;
    ``answer_errors`` answer the next begun claims (one each) instead of blocks."""

    def __init__(self, answer_errors: list[Exception] | None = None, **kwargs: int) -> None:
        super().__init__(non_blocking=True, **kwargs)
        self.calls: list[tuple[str, str]] = []
        self.answer_errors = list(answer_errors or [])
        self._answering = False

    def _note(self, what: str) -> None:
        self.calls.append((what, threading.current_thread().name))

    def begin(self, consumer: str, n: int) -> bool:
        self._note("begin")
        return super().begin(consumer, n)

    def poll(self) -> list[Block] | None:
        self._note("poll")
        self._answering = True  # InMemoryClaimer.poll answers through claim()
        try:
            return super().poll()
        finally:
            self._answering = False

    def claim(self, consumer: str, n: int) -> list[Block]:
        if self._answering and self.answer_errors:
            raise self.answer_errors.pop(0)
        return super().claim(consumer, n)

    def finish(self, timeout_s: float | None = None) -> list[Block]:
        self._note("finish")
        return super().finish(timeout_s)

    def threads_of(self, what: str) -> set[str]:
        return {thread for call, thread in self.calls if call == what}


def test_the_prefetch_is_sent_and_collected_on_the_callers_thread(
    make_client: MakeClient,
) -> None:
    pool = WatchedClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, batch_blocks=2, refill_at=0.5)
    ids = [client.next_id() for _ in range(200)]
    assert ids == list(range(FIRST, FIRST + 200))
    stats = client.get_stats()
    assert stats["claims_on_claimer_thread"] == 1  # only the first segment
    assert stats["claims_begun"] == 10  # one per later segment, the last still out
    assert stats["claims_on_caller_thread"] == 9
    assert stats["claims_handed_over"] == 0
    assert stats["claims"] == 10
    assert stats["waits"] == 1  # only the very first call
    assert pool.threads_of("begin") == pool.threads_of("poll") == {"MainThread"}
    assert pool.threads_of("finish") == set()


def test_a_begun_claim_not_yet_answered_is_polled_again_at_the_next_boundary(
    make_client: MakeClient,
) -> None:
    pool = WatchedClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, batch_blocks=3, refill_at=1.0)
    pool.hold_answers()
    assert client.next_id() == FIRST  # segment 1 installed: its prefetch is begun at once
    assert pool.begun == [("unit-test", 3)]
    assert client.take(10) == list(range(FIRST + 1, FIRST + 11))  # into block 2: not in yet
    assert pool.calls.count(("poll", "MainThread")) == 1
    assert client.get_stats()["prefetched_blocks"] == 0
    pool.release_answers()
    assert client.take(10) == list(range(FIRST + 11, FIRST + 21))  # into block 3: collected
    stats = client.get_stats()
    assert stats["prefetched_blocks"] == 3
    assert stats["claims_on_caller_thread"] == 1
    assert stats["claims_handed_over"] == 0
    assert stats["waits"] == 1


def test_a_late_answer_is_handed_over_to_the_claimer_thread(make_client: MakeClient) -> None:
    pool = WatchedClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, refill_at=1.0)
    pool.hold_answers()
    assert client.take(10) == list(range(FIRST, FIRST + 10))  # begun, not answered
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(client.next_id()))
    waiter.start()  # finds nothing buffered: hands the claim over and waits
    wait_until(lambda: ("finish", CLAIMER_THREAD) in pool.calls)
    polls_by_callers = pool.calls.count(("poll", "MainThread")) + sum(
        1 for call, thread in pool.calls if call == "poll" and thread == waiter.name
    )
    pool.release_answers()
    waiter.join(DEADLINE_S)
    assert got == [FIRST + 10]
    stats = client.get_stats()
    assert stats["claims_handed_over"] == 1
    assert stats["claims_on_caller_thread"] == 0
    assert stats["claims_on_claimer_thread"] == 1  # it finished the claim, sent no other
    assert stats["waits"] == 2
    # After the hand-over only the claimer thread touched the claim.
    assert polls_by_callers == sum(
        1 for call, thread in pool.calls if call == "poll" and thread != CLAIMER_THREAD
    )
    assert pool.threads_of("finish") == {CLAIMER_THREAD}
    assert len(pool.claims) == 2


def test_close_finishes_a_begun_claim_and_reports_it(make_client: MakeClient) -> None:
    pool = WatchedClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, refill_at=1.0)
    pool.hold_answers()
    assert client.next_id() == FIRST  # the prefetch is begun, not answered
    release = threading.Timer(0.05, pool.release_answers)
    release.start()
    report = client.close(timeout=DEADLINE_S)
    release.join()
    assert report.complete
    assert report.ranges == ((FIRST + 1, FIRST + 19),)
    assert pool.threads_of("finish") == {CLAIMER_THREAD}
    assert client.get_stats()["claim_in_flight"] == 0


def test_close_that_stops_waiting_for_a_begun_claim_says_so(make_client: MakeClient) -> None:
    pool = WatchedClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool, refill_at=1.0)
    pool.hold_answers()
    assert client.next_id() == FIRST
    report = client.close(timeout=0.05)
    assert not report.complete  # the begun claim's IDs are lost (logged when it lands)
    assert report.ranges == ((FIRST + 1, FIRST + 9),)
    pool.release_answers()
    wait_until(lambda: client.get_stats()["claim_in_flight"] == 0)
    assert client.close() is report


def test_a_failed_begun_claim_is_retried_by_the_claimer_thread(make_client: MakeClient) -> None:
    pool = WatchedClaimer(block_size=10, first_id=FIRST, blocks=1)
    client = make_client(pool, refill_at=0.5)
    assert client.take(10) == list(range(FIRST, FIRST + 10))  # the prefetch is begun
    assert client.get_stats()["claims_begun"] == 1
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(client.next_id()))
    waiter.start()  # collects AL003 at the boundary, then waits for the claimer's retries
    wait_until(lambda: client.get_stats()["pool_empty_answers"] >= 2)
    stats = client.get_stats()
    assert stats["claims_on_caller_thread"] == 1
    assert stats["claims_on_claimer_thread"] >= 2  # the first segment, then retries
    assert stats["claims_begun"] == 1  # no begin while the claims fail
    pool.add_blocks(2)
    waiter.join(DEADLINE_S)
    assert got == [FIRST + 10]
    # Recovered: the next prefetch is the caller's again.
    client.take(5)
    wait_until(lambda: client.get_stats()["claims_begun"] == 2)


def test_a_begun_claim_refused_for_bad_arguments_stops_the_claimer(
    make_client: MakeClient,
) -> None:
    pool = WatchedClaimer(
        [ClaimArgumentError("bad count", sqlstate="AL002")], block_size=10, first_id=FIRST
    )
    client = make_client(pool, refill_at=1.0, wait_timeout_s=30)
    assert client.take(10) == list(range(FIRST, FIRST + 10))
    started = time.monotonic()
    with pytest.raises(ClaimArgumentError, match="bad count") as caught:
        client.next_id()
    assert time.monotonic() - started < 10  # not the 30 s deadline
    assert caught.value.sqlstate == "AL002"
    assert client.get_stats()["claims_on_claimer_thread"] == 1
    assert pool.begun == [("unit-test", 1)]


def test_a_begun_claim_failing_otherwise_fails_waiters_and_recovers(
    make_client: MakeClient,
) -> None:
    pool = WatchedClaimer([DatabaseError("permission denied")], block_size=10, first_id=FIRST)
    client = make_client(pool, refill_at=1.0, wait_timeout_s=30)
    assert client.take(10) == list(range(FIRST, FIRST + 10))
    with pytest.raises(DatabaseError, match="permission denied"):
        client.next_id()
    # The claimer thread backs off, claims again, and the client recovers.
    wait_until(lambda: client.get_stats()["claims"] == 2)
    assert client.next_id() == FIRST + 10
    assert client.get_stats()["claims_on_claimer_thread"] == 2


def test_a_claimer_without_the_capability_claims_on_its_thread(make_client: MakeClient) -> None:
    pool = InMemoryClaimer(block_size=10, first_id=FIRST)  # begin() declines
    client = make_client(pool, refill_at=0.5)
    client.take(100)
    stats = client.get_stats()
    assert stats["claims_begun"] == stats["claims_on_caller_thread"] == 0
    assert stats["claims_on_claimer_thread"] >= 10
    assert not isinstance(ScriptedClaimer([]), client_mod.NonBlockingClaimer)
    assert isinstance(pool, client_mod.NonBlockingClaimer)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_leaves_a_begun_claim_alone(make_client: MakeClient) -> None:
    pool = WatchedClaimer(block_size=100, first_id=FIRST)
    client = make_client(pool, refill_at=1.0)
    pool.hold_answers()
    client.next_id()
    assert pool.claim_begun
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: use and close the inherited client, then report
        polls = len(pool.calls)
        try:
            client.next_id()
            outcome = b"handed out an ID"
        except ClientClosedError:
            client.close()
            outcome = b"refused"
        except BaseException:
            outcome = b"other error"
        if len(pool.calls) != polls or not pool.claim_begun:
            outcome = b"touched the claim"
        os.write(write_end, outcome)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        outcome = pipe.read()
    os.waitpid(pid, 0)
    assert outcome == b"refused"
    pool.release_answers()
    assert client.take(99) == list(range(FIRST + 1, FIRST + 100))
    assert client.next_id() == FIRST + 100  # the parent collects its claim


def test_in_memory_claimer_non_blocking_mode() -> None:
    pool = InMemoryClaimer(block_size=10, first_id=FIRST, non_blocking=True)
    assert pool.begin("x", 2)
    assert not pool.begin("x", 1)  # one claim at a time
    pool.hold_answers()
    assert pool.poll() is None
    with pytest.raises(DatabaseUnavailableError, match="no answer"):
        pool.finish(0.01)
    assert not pool.claim_begun  # abandoned
    assert pool.begin("x", 2)
    pool.release_answers()
    assert pool.finish() == [Block(1, FIRST, FIRST + 9), Block(2, FIRST + 10, FIRST + 19)]
    assert not InMemoryClaimer().begin("x", 1)


# -- asyncio ---------------------------------------------------------------------------------


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_async_ids_ascend_and_are_unique_across_tasks() -> None:
    pool = InMemoryClaimer(block_size=16, first_id=FIRST)

    async def main() -> list[list[int]]:
        async with AsyncIdClient(pool.as_async(), "async", batch_blocks=2) as client:

            async def work() -> list[int]:
                out = []
                for i in range(2000):
                    out.append(await client.next_id())
                    if i % 100 == 0:
                        await asyncio.sleep(0)
                out.extend(await client.take(33))
                return out

            return list(await asyncio.gather(*(work() for _ in range(5))))

    results = run(main())
    assert isinstance(results, list)
    every = [i for out in results for i in out]
    assert len(every) == len(set(every)) == 5 * 2033
    assert set(every) <= ids_of(pool.handed_out)
    assert all(out == sorted(out) for out in results)


def test_async_prefetch_happens_before_exhaustion() -> None:
    pool = InMemoryClaimer(block_size=100, first_id=FIRST)

    async def main() -> dict[str, int]:
        client = AsyncIdClient(pool.as_async(), "async", refill_at=0.5)
        for _ in range(51):
            await client.next_id()
        for _ in range(100):  # let the claimer task run
            if client.get_stats()["prefetched_blocks"]:
                break
            await asyncio.sleep(0.001)
        before = client.get_stats()
        for _ in range(149):
            await client.next_id()
        after = client.get_stats()
        await client.aclose()
        return {"prefetched": before["prefetched_blocks"], "waits": after["waits"]}

    assert run(main()) == {"prefetched": 1, "waits": 1}


def test_async_empty_pool_raises_pool_empty_error_after_the_deadline() -> None:
    async def main() -> float:
        client = AsyncIdClient(
            InMemoryClaimer(blocks=0).as_async(),
            "async",
            wait_timeout_s=0.2,
            backoff_initial_s=0.001,
            backoff_max_s=0.01,
        )
        started = time.monotonic()
        try:
            with pytest.raises(PoolEmptyError, match="pool is empty"):
                await client.next_id()
            return time.monotonic() - started
        finally:
            await client.aclose()

    elapsed = run(main())
    assert isinstance(elapsed, float)
    assert elapsed >= 0.2


def test_async_close_reports_unused_ids() -> None:
    pool = InMemoryClaimer(block_size=50, first_id=FIRST)

    async def main() -> tuple[UnusedIds, str]:
        client = AsyncIdClient(pool.as_async(), "async")
        await client.take(20)
        report = await client.aclose()
        try:
            await client.next_id()
        except ClientClosedError as exc:
            return report, type(exc).__name__
        return report, "no error"

    assert run(main()) == (
        UnusedIds(count=30, ranges=((FIRST + 20, FIRST + 49),)),
        "ClientClosedError",
    )


def test_async_bad_arguments_fail_at_once() -> None:
    claimer = ScriptedClaimer([ClaimArgumentError("bad count", sqlstate="AL002")])

    async def main() -> None:
        client = AsyncIdClient(claimers._AsyncAdapter(claimer), "async", wait_timeout_s=30)
        try:
            with pytest.raises(ClaimArgumentError, match="bad count"):
                await client.next_id()
        finally:
            await client.aclose()

    started = time.monotonic()
    run(main())
    assert time.monotonic() - started < 10


def test_an_unreachable_database_raises_database_unavailable(unused_tcp_port: int) -> None:
    url = f"postgresql://nobody@127.0.0.1:{unused_tcp_port}/allocator"
    with IdClient(url, "unit-test", wait_timeout_s=0.5, backoff_max_s=0.05) as client:
        with pytest.raises(DatabaseUnavailableError, match="PostgreSQL is unreachable"):
            client.next_id()
        assert client.get_stats()["claim_failures"] >= 1


class EmptyOnceClaimer(InMemoryClaimer):
    """Returns no block on its first call (claim_blocks never does; a custom claimer might)."""

    def claim(self, consumer: str, n: int) -> list[Block]:
        if not self.claims:
            self.claims.append((consumer, n))
            return []
        return super().claim(consumer, n)


def test_an_empty_answer_counts_as_an_empty_pool(make_client: MakeClient) -> None:
    pool = EmptyOnceClaimer(block_size=10, first_id=FIRST)
    client = make_client(pool)
    assert client.next_id() == FIRST
    assert client.get_stats()["pool_empty_answers"] == 1


def test_claim_once_checks_its_arguments_before_any_io() -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    with pytest.raises(ClaimArgumentError, match="between 1 and 1000") as caught:
        client_mod.claim_once(url, "orders", 0)
    assert caught.value.sqlstate == "AL002"
    with pytest.raises(ClaimArgumentError, match="non-empty"):
        client_mod.claim_once(url, "", 1)
