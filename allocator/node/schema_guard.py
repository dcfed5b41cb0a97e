"""The node's check of the schema revision, at start and each time the database answers
again after it had not (the probe's reconnect: a failover or a restore may bring another
schema). A schema this release cannot use stops the node: exit 78, one line naming the
database's revision, what this release accepts and the way out (docs/upgrades.md)."""

from __future__ import annotations

import threading

from allocator.core import logs
from allocator.core.errors import SchemaMismatchError
from allocator.node.seams import NodeStore
from allocator.postgres import compat

log = logs.get_logger(__name__)


class SchemaGuard:
    """Reads the database's schema stamp and judges it (:func:`allocator.postgres.compat.judge`);
    logs each revision it accepts once."""

    def __init__(self, name: str, store: NodeStore) -> None:
        self._name = name
        self._store = store
        self._lock = threading.Lock()
        self._accepted: str | None = None
        self.refusal: SchemaMismatchError | None = None
        """The refusal met on a reconnect (the run raises it once it has stopped)."""

    def check(self, when: str) -> None:
        """Raise :class:`SchemaMismatchError` for a schema this node cannot use; a database
        that does not answer raises as every read does (retryable)."""
        stamp = self._store.schema_stamp()
        verdict = compat.judge(stamp)
        if not verdict.usable:
            log.error("schema_refused", name=self._name, when=when, error=verdict.message)
            raise SchemaMismatchError(verdict.message)
        with self._lock:
            if stamp.revision == self._accepted:
                return
            self._accepted = stamp.revision
        log.info(
            "schema_accepted",
            name=self._name,
            when=when,
            revision=stamp.revision,
            head=compat.HEAD,
            newer=verdict.newer,
        )
