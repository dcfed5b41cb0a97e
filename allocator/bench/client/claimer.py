"""The claimer the client bench hands to :class:`~allocator.client.IdClient`."""

from __future__ import annotations

import time

from allocator.client import Block, PostgresClaimer


class RecordingClaimer:
    """Claims through PostgreSQL and remembers where every block and segment starts, so the
    latency loop can tell which calls crossed a boundary. A
    :class:`~allocator.client.NonBlockingClaimer` like the client's own, so the bench
    measures the prefetch the client makes on the caller's thread."""

    def __init__(self, url: str) -> None:
        self._inner = PostgresClaimer(url, application_name="allocator-bench-client")
        self.block_starts: set[int] = set()
        self.segment_starts: set[int] = set()
        self.block_sizes: set[int] = set()
        self.begun_at_ns: list[int] = []
        """``perf_counter_ns()`` of every prefetch sent from the calling thread."""
        self.collected_at_ns: list[int] = []
        """``perf_counter_ns()`` of every prefetch answer collected by a ``poll``."""

    def claim(self, consumer: str, n: int) -> list[Block]:
        return self._record(self._inner.claim(consumer, n))

    def begin(self, consumer: str, n: int) -> bool:
        self.begun_at_ns.append(time.perf_counter_ns())
        return self._inner.begin(consumer, n)

    def poll(self) -> list[Block] | None:
        blocks = self._inner.poll()
        if blocks is None:
            return None
        self.collected_at_ns.append(time.perf_counter_ns())
        return self._record(blocks)

    def finish(self, timeout_s: float | None = None) -> list[Block]:
        return self._record(self._inner.finish(timeout_s))

    def _record(self, blocks: list[Block]) -> list[Block]:
        if blocks:
            self.segment_starts.add(min(b.first_id for b in blocks))
            self.block_starts.update(b.first_id for b in blocks)
            self.block_sizes.update(b.size for b in blocks)
        return blocks

    def close(self) -> None:
        self._inner.close()
