"""The ID client while an operator has paused claims (SQLSTATE AL004, ``allocator pool pause``).

Rules: as tests/unit/test_client.py: in-memory claimers only, waits on conditions with
deadlines, no speed asserted. A paused pool is, for the client, an empty pool with another
name: retried with backoff within ``wait_timeout_s``, the connection kept, and a final error
that says the claims are paused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest

from allocator.client import (
    AsyncIdClient,
    Block,
    ClaimsPausedError,
    IdClient,
    InMemoryClaimer,
    PoolEmptyError,
)
from allocator.client.base import (
    CLAIMS_PAUSED_SQLSTATE,
    KEEP_CONNECTION_SQLSTATES,
    translate_claim_error,
)

FIRST = 1 << 22
PAUSED = "claim ID blocks: claims paused: no ID block is handed out until an operator resumes"


class ServerAnswer(psycopg.Error):
    """A driver error carrying a SQLSTATE, as the server's answer would."""

    def __init__(self, message: str, sqlstate: str) -> None:
        self._state = sqlstate
        super().__init__(message)

    @property
    def sqlstate(self) -> str | None:
        return self._state


class PausedThenServing:
    """Answers like a paused database until :meth:`resume`, then like ``InMemoryClaimer``."""

    def __init__(self) -> None:
        self.paused = True
        self.pool = InMemoryClaimer(block_size=10, first_id=FIRST)
        self.refusals = 0

    def claim(self, consumer: str, n: int) -> list[Block]:
        if self.paused:
            self.refusals += 1
            raise ClaimsPausedError(PAUSED)
        return self.pool.claim(consumer, n)

    def resume(self) -> None:
        self.paused = False

    def close(self) -> None:
        pass


@pytest.fixture
def paused() -> PausedThenServing:
    return PausedThenServing()


@pytest.fixture
def client(paused: PausedThenServing) -> Iterator[IdClient]:
    made = IdClient(
        paused,
        "unit-test",
        wait_timeout_s=0.2,
        backoff_initial_s=0.001,
        backoff_max_s=0.01,
    )
    yield made
    made.close(timeout=5)


def test_al004_translates_to_claims_paused_which_is_a_kind_of_pool_empty() -> None:
    """Code that already retries PoolEmptyError (AL003) retries a pause too."""
    error = translate_claim_error(ServerAnswer("claims paused: …", CLAIMS_PAUSED_SQLSTATE))
    assert isinstance(error, ClaimsPausedError)
    assert isinstance(error, PoolEmptyError)
    assert error.sqlstate == "AL004"
    assert error.exit_code == 75
    assert CLAIMS_PAUSED_SQLSTATE in KEEP_CONNECTION_SQLSTATES


def test_a_pause_is_retried_until_the_deadline_then_says_claims_are_paused(
    client: IdClient, paused: PausedThenServing
) -> None:
    with pytest.raises(ClaimsPausedError, match=r"within 0\.2 s: claims are paused") as caught:
        client.next_id()
    assert isinstance(caught.value.__cause__, ClaimsPausedError)
    assert paused.refusals > 1  # retried, not given up at the first answer
    stats = client.get_stats()
    assert stats["claims_paused_answers"] >= 1
    assert stats["wait_timeouts"] == 1


def test_claims_resume_and_ids_flow_again(client: IdClient, paused: PausedThenServing) -> None:
    with pytest.raises(ClaimsPausedError):
        client.next_id()
    paused.resume()
    assert client.next_id() == FIRST


def test_the_async_client_retries_a_pause_too(paused: PausedThenServing) -> None:
    async def run() -> int:
        async with AsyncIdClient(
            InMemoryAsync(paused),
            "unit-test",
            wait_timeout_s=0.2,
            backoff_initial_s=0.001,
            backoff_max_s=0.01,
        ) as client:
            with pytest.raises(ClaimsPausedError, match="claims are paused"):
                await client.next_id()
            paused.resume()
            return await client.next_id()

    assert asyncio.run(run()) == FIRST


class InMemoryAsync:
    def __init__(self, claimer: PausedThenServing) -> None:
        self._claimer = claimer

    async def claim(self, consumer: str, n: int) -> list[Block]:
        return self._claimer.claim(consumer, n)

    async def close(self) -> None:
        pass
