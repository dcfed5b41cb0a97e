"""The Python ID client: claims Snowflake ID blocks in the background and hands their IDs out
from memory. How to use it: docs/claiming-ids.md §7; the SQL it calls: docs/design.md §6.

Public (``__all__``): :class:`IdClient`, :class:`AsyncIdClient`, :func:`claim_once`, the
values they return, the errors they raise, the claimer protocols and the claimers; the rest is
internal. It needs only the base install, psycopg, psycopg-pool and structlog
(tests/unit/test_layers.py, tests/integration/test_client_only_install.py).
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
