"""The invariant checker (:mod:`allocator.core.verify`) on synthetic data: clean runs pass, each
kind of violation is caught.

Rules: no servers. Each test starts from one clean run (two terms, blocks cut by each inside
its term, some claimed by two consumers) and breaks exactly one thing, then asserts the
checker names the right invariant. A checker that passes everything would pass the demo,
the drill and the chaos tests too; these tests are what make its silence mean something.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from allocator.core.layout import MAX_ID, Layout
from allocator.core.verify import (
    MAX_PER_RULE,
    Claim,
    LedgerRow,
    ServingRow,
    TermRow,
    Violation,
    WriteRow,
    check,
    counts_text,
    summary,
)

LAYOUT = Layout()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
BLOCK = 4096
EPOCH_A = 4_294_967_307
EPOCH_B = 4_294_967_400


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def first_id(ms_after_t0: int, lane: int = 0) -> int:
    return LAYOUT.encode(int(T0.timestamp() * 1000) + ms_after_t0, 0, lane, 0)


def clean_run() -> tuple[list[Claim], list[LedgerRow], list[TermRow]]:
    """Term A cuts blocks 1-4 (t=1..4 s), hands over at t=5 s; term B cuts blocks 5-8."""
    terms = [
        TermRow(EPOCH_A, "node-1", at(0), at(5), "superseded"),
        TermRow(EPOCH_B, "node-2", at(5), None, None),
    ]
    ledger: list[LedgerRow] = []
    claims: list[Claim] = []
    for i in range(1, 9):
        epoch = EPOCH_A if i <= 4 else EPOCH_B
        first = first_id(i * 1000)
        consumer = None if i in (4, 8) else ("c1" if i % 2 else "c2")
        ledger.append(
            LedgerRow(
                block_id=i,
                first_id=first,
                last_id=first + BLOCK - 1,
                epoch=epoch,
                cut_at=at(i),
                claimed_by=consumer,
                claimed_at=at(i + 0.5) if consumer else None,
            )
        )
        if consumer:
            claims.append(Claim(i, first, first + BLOCK - 1, consumer, returned_at=i + 0.5))
    return claims, ledger, terms


def kinds(violations: list[Violation]) -> set[str]:
    return {v.invariant for v in violations}


def test_a_clean_run_passes() -> None:
    claims, ledger, terms = clean_run()
    assert check(claims, ledger, terms, LAYOUT) == []


def test_ledger_rows_in_any_order_and_unrecorded_claims_are_fine() -> None:
    claims, ledger, terms = clean_run()
    # A claim whose reply was lost is claimed in the ledger but in no record: allowed.
    assert check(claims[1:], list(reversed(ledger)), list(reversed(terms)), LAYOUT) == []


def test_i1_overlapping_ledger_blocks() -> None:
    claims, ledger, terms = clean_run()
    ledger[5] = dataclasses.replace(
        ledger[5], first_id=ledger[4].last_id, last_id=ledger[5].last_id
    )
    found = check(claims, ledger, terms, LAYOUT)
    assert "I1" in kinds(found)
    assert any("overlap" in v.message for v in found)


def test_i1_malformed_block() -> None:
    claims, ledger, terms = clean_run()
    ledger[3] = dataclasses.replace(ledger[3], last_id=ledger[3].first_id - 1)
    assert any(
        v.invariant == "I1" and "malformed" in v.message
        for v in check(claims, ledger, terms, LAYOUT)
    )


def test_i1_block_handed_out_twice() -> None:
    claims, ledger, terms = clean_run()
    claims.append(dataclasses.replace(claims[0], consumer="c2"))
    found = check(claims, ledger, terms, LAYOUT)
    assert any(v.invariant == "I1" and "handed out twice" in v.message for v in found)


def test_i1_consumers_got_overlapping_ranges() -> None:
    claims, ledger, terms = clean_run()
    # Two different block ids whose ranges overlap, both in the records (the ledger agrees
    # for neither, so I4 fires too; the overlap itself is I1).
    claims.append(Claim(99, claims[0].first_id + 1, claims[0].last_id + 1, "c2"))
    found = check(claims, ledger, terms, LAYOUT)
    assert any(v.invariant == "I1" and "overlap" in v.message for v in found)


def test_i1_ledger_says_another_consumer_claimed_it() -> None:
    claims, ledger, terms = clean_run()
    ledger[0] = dataclasses.replace(ledger[0], claimed_by="intruder")
    found = check(claims, ledger, terms, LAYOUT)
    assert kinds(found) == {"I1"}
    assert "intruder" in found[0].message


def test_i2_block_not_after_an_earlier_one() -> None:
    claims, ledger, terms = clean_run()
    # Block 6 moves below block 5 (still disjoint from everything): cut order broken.
    low = first_id(4500)
    ledger[5] = dataclasses.replace(ledger[5], first_id=low, last_id=low + BLOCK - 1)
    found = check([c for c in claims if c.block_id != 6], ledger, terms, LAYOUT)
    assert "I2" in kinds(found)
    assert "I1" not in kinds(found)


def test_i3_stale_token_after_a_newer_one() -> None:
    claims, ledger, terms = clean_run()
    # Epoch A writes block 7, after epoch B wrote blocks 5 and 6: a stale write.
    ledger[6] = dataclasses.replace(ledger[6], epoch=EPOCH_A)
    found = check(claims, ledger, terms, LAYOUT)
    assert found == [
        Violation(
            "I3",
            f"block 7 carries token (0, {EPOCH_A}), older than token (0, {EPOCH_B}) of block 5 "
            "cut before it: a stale write committed",
        )
    ]


def test_i3_a_newer_token_among_the_older_ones_makes_the_older_ones_stale() -> None:
    claims, ledger, terms = clean_run()
    ledger[1] = dataclasses.replace(ledger[1], epoch=EPOCH_B)  # block 2, between A's blocks
    found = check(claims, ledger, terms, LAYOUT)
    assert kinds(found) == {"I3"}
    assert [m.split(" carries")[0] for m in (v.message for v in found)] == ["block 3", "block 4"]


def test_i3_a_legitimate_cut_stamped_after_the_successors_takeover_is_accepted() -> None:
    """The case a time comparison gets wrong: epoch A's last cut took the fence lock first,
    but its ``cut_at`` reads later than B's ``elected_at`` (the takeover's timestamp) and
    than A's ``ended_at``. In first-ID order the tokens never decrease: clean."""
    claims, ledger, terms = clean_run()
    ledger[3] = dataclasses.replace(ledger[3], cut_at=at(5.2))  # A's block 4; B took over at 5
    ledger[4] = dataclasses.replace(ledger[4], cut_at=at(5.1))  # B's first block
    assert check(claims, ledger, terms, LAYOUT) == []


def test_i3_judges_blocks_in_first_id_order() -> None:
    _claims, ledger, terms = clean_run()
    # The stale block was inserted with a smaller block_id than B's (say a sequence cache):
    # by first ID it still comes after B's blocks, and that is what counts.
    stale = dataclasses.replace(ledger[7], block_id=0, epoch=EPOCH_A, claimed_by=None)
    found = check([], [*ledger[:7], stale], terms, LAYOUT)
    assert any(v.invariant == "I3" and v.message.startswith("block 0 carries token") for v in found)


def test_i3_epoch_that_never_held_the_fence() -> None:
    claims, ledger, terms = clean_run()
    ledger[2] = dataclasses.replace(ledger[2], epoch=EPOCH_A + 1)
    found = check(claims, ledger, terms, LAYOUT)
    assert kinds(found) == {"I3"}
    assert "never held the fence" in found[0].message


def test_i3_two_terms_at_once_and_a_fence_moving_back() -> None:
    claims, ledger, terms = clean_run()
    overlapping = [dataclasses.replace(terms[0], ended_at=None, end_reason=None), terms[1]]
    assert any("two terms at once" in v.message for v in check(claims, ledger, overlapping, LAYOUT))
    backwards = [terms[0], dataclasses.replace(terms[1], epoch=EPOCH_A - 1)]
    found = check([], [], backwards, LAYOUT)
    assert [v.invariant for v in found] == ["I3"]
    assert "backwards" in found[0].message


def test_i4_returned_claim_missing_from_the_ledger() -> None:
    claims, ledger, terms = clean_run()
    lost = ledger.pop(0)  # e.g. a claim that returned, then the crash lost the block
    found = check(claims, ledger, terms, LAYOUT)
    assert kinds(found) == {"I4"}
    assert f"block {lost.block_id}" in found[0].message


def test_i4_returned_claim_unclaimed_in_the_ledger() -> None:
    claims, ledger, terms = clean_run()
    ledger[0] = dataclasses.replace(ledger[0], claimed_by=None, claimed_at=None)
    found = check(claims, ledger, terms, LAYOUT)
    assert kinds(found) == {"I4"}
    assert "not durable" in found[0].message


def test_i4_consumer_got_other_bounds_than_the_ledger() -> None:
    claims, ledger, terms = clean_run()
    claims[0] = dataclasses.replace(claims[0], last_id=claims[0].last_id - 1)
    assert kinds(check(claims, ledger, terms, LAYOUT)) == {"I4"}


def test_i5_timestamp_going_backwards() -> None:
    claims, ledger, terms = clean_run()
    # Block 6 carries 4.999 s, after block 5 carried 5 s. (Within one datacenter the time is
    # the IDs' top bits, so I2 breaks with it: the point is that I5 is named.)
    earlier = first_id(4999, lane=31)
    ledger[5] = dataclasses.replace(ledger[5], first_id=earlier, last_id=earlier + BLOCK - 1)
    found = check([c for c in claims if c.block_id != 6], ledger, terms, LAYOUT)
    assert "I5" in kinds(found)


def test_i5_id_past_the_layout() -> None:
    claims, ledger, terms = clean_run()
    ledger.append(LedgerRow(9, MAX_ID + 1, MAX_ID + BLOCK, EPOCH_B, at(9), None, None))
    found = check(claims, ledger, terms, LAYOUT)
    assert any(v.invariant == "I5" and "past the layout" in v.message for v in found)


@pytest.mark.parametrize("count", [1, 200])
def test_summary_counts_and_limits(count: int) -> None:
    violations = [Violation("I3", f"stale {i}") for i in range(count)]
    text = summary(violations, limit=5)
    assert text.startswith(f"{count} violation(s) (I3: {count})")
    assert len(text.splitlines()) == 1 + min(count, 5)


def test_counts_and_json_name_each_violation() -> None:
    found = [Violation("I3", "b"), Violation("I1", "a"), Violation("I3", "c")]
    assert counts_text(found) == "I1: 1, I3: 2"
    assert counts_text([]) == "none"
    assert found[0].to_json() == {"invariant": "I3", "message": "b"}


def test_one_broken_rule_is_capped() -> None:
    ledger = [
        LedgerRow(i, first_id(i), first_id(i) + BLOCK - 1, 7, at(i), None, None)
        for i in range(1, MAX_PER_RULE + 20)
    ]
    found = check([], ledger, [], LAYOUT)  # no history: no block's epoch ever held the fence
    assert len(found) == MAX_PER_RULE
    assert kinds(found) == {"I3"}


# -- the rules added with the production faults (docs/design.md §11) ------------------------


def write(write_id: int, seconds: float, epoch: int, generation: int = 0) -> WriteRow:
    return WriteRow(write_id, at(seconds), "requeue", generation, epoch, 3)


def test_requeue_and_prune_writes_by_their_term_are_clean() -> None:
    claims, ledger, terms = clean_run()
    writes = [write(1, 2.5, EPOCH_A), write(2, 6.5, EPOCH_B)]
    assert check(claims, ledger, terms, LAYOUT, writes) == []


def test_a_write_of_an_older_token_after_a_newer_one_is_a_stale_write() -> None:
    claims, ledger, terms = clean_run()
    writes = [write(1, 6.5, EPOCH_B), write(2, 7.0, EPOCH_A)]
    found = check(claims, ledger, terms, LAYOUT, writes)
    assert [str(v) for v in found] == [
        f"I3: write 2 carries token (0, {EPOCH_A}), older than token (0, {EPOCH_B}) of write 1 "
        "written before it: a stale write committed"
    ]


def test_a_write_stamped_after_its_term_ended_but_in_order_is_accepted() -> None:
    claims, ledger, terms = clean_run()
    writes = [write(1, 5.3, EPOCH_A), write(2, 5.2, EPOCH_B)]  # clocks disagree; order holds
    assert check(claims, ledger, terms, LAYOUT, writes) == []


def test_a_write_with_a_token_that_never_held_the_fence_is_caught() -> None:
    claims, ledger, terms = clean_run()
    found = check(claims, ledger, terms, LAYOUT, [write(1, 2.5, EPOCH_A, generation=7)])
    assert any("never held the fence" in v.message for v in found if v.invariant == "I3")


def test_a_block_of_an_older_token_cut_after_a_newer_one_is_caught_by_order() -> None:
    claims, ledger, terms = clean_run()
    ledger[6] = dataclasses.replace(ledger[6], epoch=EPOCH_A)  # block 7, cut in B's term
    found = check(claims, ledger, terms, LAYOUT)
    assert any("block 7 carries token" in v.message for v in found if v.invariant == "I3")


def test_blocks_of_another_generation_never_held_the_fence() -> None:
    claims, ledger, terms = clean_run()
    terms = [dataclasses.replace(term, generation=1) for term in terms]
    found = check(claims, ledger, terms, LAYOUT)
    assert sum("never held the fence" in v.message for v in found) == len(ledger)


def ahead(row: LedgerRow, lead_ms: int) -> LedgerRow:
    """The same cut, but the block carries a millisecond ``lead_ms`` later (same lane)."""
    shift = lead_ms << (LAYOUT.datacenter_bits + LAYOUT.lane_bits + LAYOUT.sequence_bits)
    return dataclasses.replace(row, first_id=row.first_id + shift, last_id=row.last_id + shift)


def test_a_block_further_ahead_of_the_database_clock_than_allowed_is_caught() -> None:
    _claims, ledger, terms = clean_run()
    claims: list[Claim] = []  # the moved block no longer matches what consumers got
    ledger[2:] = [ahead(row, 1500) for row in ledger[2:]]  # from block 3 on: 1.5 s ahead
    found = check(claims, ledger, terms, LAYOUT, max_clock_ahead_ms=1000)
    assert [v.invariant for v in found] == ["I5"]  # block 4 keeps the lead block 3 had
    assert "block 3" in found[0].message
    assert "past the database clock" in found[0].message
    assert check(claims, ledger, terms, LAYOUT, max_clock_ahead_ms=2000) == []


def test_a_mark_already_ahead_may_keep_its_lead_but_never_grow_it() -> None:
    _claims, ledger, terms = clean_run()
    claims: list[Claim] = []
    kept = [ahead(row, 3_600_000) for row in ledger]  # an hour ahead throughout
    assert check(claims, kept, terms, LAYOUT, initial_lead_ms=3_600_000) == []
    grown = [*kept[:4], *(ahead(row, 3_700_000) for row in ledger[4:])]
    found = check(claims, grown, terms, LAYOUT, initial_lead_ms=3_600_000)
    assert [(v.invariant, "block 5" in v.message) for v in found] == [("I5", True)]
    # Without the initial lead the first such block is already a violation.
    assert check(claims, kept, terms, LAYOUT)[0].invariant == "I5"


# -- the recorded layout (docs/design.md §11: checked on every cut) -------------------------


def test_blocks_of_the_recorded_datacenter_are_clean() -> None:
    claims, ledger, terms = clean_run()
    assert check(claims, ledger, terms, LAYOUT, datacenter_id=0) == []


def test_a_block_of_another_datacenter_is_caught_when_the_datacenter_is_known() -> None:
    claims, ledger, terms = clean_run()
    assert check(claims, ledger, terms, LAYOUT) == []  # unknown: not judged
    found = check(claims, ledger, terms, LAYOUT, datacenter_id=3)
    assert len(found) == len(ledger)
    assert kinds(found) == {"I1"}
    assert "datacenter 0, not in this cluster's 3" in found[0].message


def test_a_block_spanning_two_milliseconds_is_caught() -> None:
    claims, ledger, terms = clean_run()
    wide = dataclasses.replace(ledger[7], last_id=first_id(8001) + 10)
    found = check(claims, [*ledger[:7], wide], terms, LAYOUT, datacenter_id=0)
    assert [v.invariant for v in found] == ["I1"]
    assert "block 8" in found[0].message
    assert "spans more than one" in found[0].message


# -- I7: the bound on an ID's age ---------------------------------------------------------------


def serving(
    first_s: float, last_s: float, *, serve_aged: bool = True, stretch_id: int = 1
) -> ServingRow:
    """A stretch of term B's heartbeats with a bound of 2 s, stale after 1 s."""
    return ServingRow(stretch_id, 0, EPOCH_B, 2000, serve_aged, 1000, at(first_s), at(last_s))


def handed_out_late(claimed_s: float, consumer: str = "c1") -> list[LedgerRow]:
    """The clean run, with block 8 (first ID at t=8 s) handed out at ``claimed_s``."""
    _claims, ledger, _terms = clean_run()
    ledger[7] = dataclasses.replace(ledger[7], claimed_by=consumer, claimed_at=at(claimed_s))
    return ledger


def age_check(ledger: list[LedgerRow], stretches: list[ServingRow]) -> list[Violation]:
    claims, _ledger, terms = clean_run()
    return check(claims, ledger, terms, LAYOUT, serving=stretches, serving_grace_ms=100)


def test_an_aged_block_handed_out_while_a_leader_served_is_caught() -> None:
    found = age_check(handed_out_late(10.5), [serving(5, 20)])  # 2.5 s old, bound 2 s
    assert kinds(found) == {"I7"}
    assert "block 8" in found[0].message
    assert "2500 ms after" in found[0].message
    assert age_check(handed_out_late(9.5), [serving(5, 20)]) == []  # 1.5 s old: inside


def test_the_bound_is_judged_only_where_the_database_held_it() -> None:
    late = handed_out_late(30)  # 22 s old
    assert age_check(late, []) == []  # no heartbeat ever: no bound (an older leader)
    assert age_check(late, [serving(5, 20)]) == []  # stale since 21 s: served as allowed
    assert age_check(late, [serving(5, 29.2)]) != []  # within leader_stale_ms of the last beat
    assert age_check(late, [serving(29.95, 40)]) == []  # inside the grace of a stretch's start
    assert kinds(age_check(late, [serving(5, 20, serve_aged=False)])) == {"I7"}  # held on
    refused_then_served = [
        serving(5, 20, serve_aged=False),
        serving(25, 26, serve_aged=True, stretch_id=2),
    ]
    assert age_check(late, refused_then_served) == []  # the next leader's setting serves


def test_voided_blocks_are_not_hand_outs() -> None:
    assert age_check(handed_out_late(30, "allocator:voided-aged"), [serving(5, 40)]) == []
