"""The Python ID client: claims Snowflake ID blocks in the background and hands their IDs out
from memory (how to use it: docs/claiming-ids.md; the SQL it calls: docs/design.md §6).

Public: the clients :class:`IdClient` (threads) and :class:`AsyncIdClient` (asyncio),
:func:`claim_once`, the values they return (:class:`Block`, :class:`UnusedIds`), the errors
they raise, the claimer protocols and the claimers an application builds; the rest of the
package is internal. It needs no more than ``pip install snowflake-block-allocator`` (psycopg,
psycopg-pool, structlog) and ``allocator.core``/``allocator.postgres.errors`` (checked by
tests/unit/test_layers.py and tests/integration/test_client_only_install.py).
"""

from allocator.client.aio import AsyncIdClient
from allocator.client.base import (
    AsyncClaimer,
    Block,
    ClaimArgumentError,
    Claimer,
    ClaimsPausedError,
    ClientClosedError,
    NonBlockingClaimer,
    PoolEmptyError,
    UnusedIds,
)
from allocator.client.claimers import (
    AsyncPostgresClaimer,
    InMemoryClaimer,
    PostgresClaimer,
    claim_once,
)
from allocator.client.threaded import IdClient
from allocator.core.errors import DatabaseError, DatabaseUnavailableError

__all__ = [
    "AsyncClaimer",
    "AsyncIdClient",
    "AsyncPostgresClaimer",
    "Block",
    "ClaimArgumentError",
    "Claimer",
    "ClaimsPausedError",
    "ClientClosedError",
    "DatabaseError",
    "DatabaseUnavailableError",
    "IdClient",
    "InMemoryClaimer",
    "NonBlockingClaimer",
    "PoolEmptyError",
    "PostgresClaimer",
    "UnusedIds",
    "claim_once",
]
