"""SessionGuard and Term: when a node may write (no servers; a fake clock)."""

from __future__ import annotations

from kazoo.protocol.states import KazooState

from allocator.core.leadership import SessionGuard, Term
from allocator.fence import Token


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def connected_guard(timeout_s: float = 10.0) -> tuple[SessionGuard, FakeClock]:
    clock = FakeClock()
    guard = SessionGuard(timeout_s, clock=clock)
    guard(KazooState.CONNECTED)
    return guard, clock


def test_term_may_write_only_when_active_and_connected() -> None:
    guard, _ = connected_guard()
    term = Term(token=Token(0, 7), guard=guard)
    assert not term.may_write()  # not before the fence is taken
    term.activate()
    assert term.may_write()


def test_suspension_withdraws_trust_at_once_and_reconnect_restores_session_only() -> None:
    guard, _ = connected_guard()
    term = Term(token=Token(0, 7), guard=guard)
    term.activate()
    guard(KazooState.SUSPENDED)
    assert not term.may_write()
    guard(KazooState.CONNECTED)
    assert guard.connected
    assert term.may_write()  # the term itself was not paused: the node loop decides
    term.pause()
    assert not term.may_write()


def test_own_timer_declares_loss_after_a_whole_session_timeout() -> None:
    guard, clock = connected_guard(timeout_s=10.0)
    guard(KazooState.SUSPENDED)
    clock.now += 9.9
    assert not guard.check_timer()
    clock.now += 0.2
    assert guard.check_timer()
    assert guard.lost
    assert "own timer" in guard.lost_reason
    guard(KazooState.CONNECTED)  # a late reconnect does not undo a declared loss
    assert not guard.connected


def test_kazoo_lost_is_final_until_reset() -> None:
    guard, _ = connected_guard()
    term = Term(token=Token(0, 1), guard=guard)
    term.activate()
    guard(KazooState.LOST)
    assert guard.lost
    assert not term.may_write()
    guard.reset()
    guard(KazooState.CONNECTED)
    assert guard.connected


def test_an_ended_term_never_writes_again() -> None:
    guard, _ = connected_guard()
    term = Term(token=Token(0, 3), guard=guard)
    term.activate()
    term.end("fenced")
    term.activate()
    term.end("later reason")
    assert not term.may_write()
    assert term.end_reason == "fenced"


def test_timer_does_nothing_while_connected() -> None:
    guard, clock = connected_guard(timeout_s=1.0)
    clock.now += 100
    assert not guard.check_timer()
    assert guard.suspended_for_s is None
