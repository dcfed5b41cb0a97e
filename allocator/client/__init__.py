"""The Python ID client: claims Snowflake ID blocks in the background and hands their IDs out
from memory. How to use it: docs/claiming-ids.md §7; the SQL it calls: docs/design.md §6.

Public (``__all__``): :class:`IdClient`, :class:`AsyncIdClient`, :func:`claim_once`, the
values they return, the errors they raise, the claimer protocols and the claimers; the rest is
internal. It needs only the base install, psycopg, psycopg-pool and structlog
(tests/unit/test_layers.py, tests/integration/test_client_only_install.py).
"""

import importlib as _importlib
import warnings as _warnings

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

_EXPORTED_UP_TO_0_2 = {
    "APPLICATION_NAME": ("allocator.client.base", "APPLICATION_NAME"),
    "CLAIM_BLOCKS": ("allocator.client.base", "CLAIM_BLOCKS"),
    "DEFAULT_BACKOFF_INITIAL_S": ("allocator.client.base", "DEFAULT_BACKOFF_INITIAL_S"),
    "DEFAULT_BACKOFF_MAX_S": ("allocator.client.base", "DEFAULT_BACKOFF_MAX_S"),
    "DEFAULT_BATCH_BLOCKS": ("allocator.client.base", "DEFAULT_BATCH_BLOCKS"),
    "DEFAULT_CLOSE_TIMEOUT_S": ("allocator.client.base", "DEFAULT_CLOSE_TIMEOUT_S"),
    "DEFAULT_CONNECT_TIMEOUT_S": ("allocator.client.base", "DEFAULT_CONNECT_TIMEOUT_S"),
    "DEFAULT_REFILL_AT": ("allocator.client.base", "DEFAULT_REFILL_AT"),
    "DEFAULT_STATEMENT_TIMEOUT_MS": ("allocator.client.base", "DEFAULT_STATEMENT_TIMEOUT_MS"),
    "DEFAULT_WAIT_TIMEOUT_S": ("allocator.client.base", "DEFAULT_WAIT_TIMEOUT_S"),
    "MAX_BATCH_BLOCKS": ("allocator.client.base", "MAX_BATCH_BLOCKS"),
    "MAX_CONSUMER_CHARS": ("allocator.client.base", "_MAX_CONSUMER_CHARS"),
    "Range": ("allocator.client.base", "Range"),
    "backoff_delay": ("allocator.client.base", "backoff_delay"),
    "check_consumer": ("allocator.client.base", "check_consumer"),
    "merge_ranges": ("allocator.client.base", "merge_ranges"),
    "translate_claim_error": ("allocator.client.base", "translate_claim_error"),
}
"""Names 0.2.0 exported from here that are internal now: still found, with a warning, until
a later release removes them (the same expand-then-contract rule the migrations follow)."""


def __getattr__(name: str) -> object:
    """An internal name an older importer asks for: the object, and a DeprecationWarning."""
    try:
        module, attribute = _EXPORTED_UP_TO_0_2[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    _warnings.warn(
        f"allocator.client.{name} is internal (exported up to 0.2.0) and will be removed "
        "from the package; use the public names in allocator.client.__all__",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_importlib.import_module(module), attribute)
