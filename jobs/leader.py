"""The leader-only jobs on APScheduler 3: started after the fence is taken, stopped first.

Rules: one BackgroundScheduler per node, started once; a term adds its jobs and removes
them when it ends. ``stop`` removes every job, then waits (bounded) for the run in flight,
which itself stops at its next ``may_write`` check; writes already past that check roll
back through ``commit_if``. Job errors are logged and counted, never fatal.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from jobs import refill, retention, sampling
from jobs.context import LeaderContext

log = logging.getLogger(__name__)

REFILL_JOB = "refill"
RETENTION_JOB = "retention"
SAMPLING_JOB = "sampling"
RETENTION_INTERVAL_S = 60.0


class LeaderJobs:
    def __init__(self) -> None:
        self._scheduler = BackgroundScheduler(
            timezone=UTC, job_defaults={"misfire_grace_time": None}
        )
        self._scheduler.add_listener(self._on_error, EVENT_JOB_ERROR)
        self._ctx: LeaderContext | None = None

    def start_scheduler(self) -> None:
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)

    def start(self, ctx: LeaderContext) -> None:
        """Add this term's jobs; refill runs at once."""
        self._ctx = ctx
        ctx.wake_refill = self.wake_refill
        pool = ctx.config.pool
        common: dict[str, Any] = {"max_instances": 1, "coalesce": True, "replace_existing": True}
        now = datetime.now(UTC)
        self._scheduler.add_job(
            refill.run,
            "interval",
            args=[ctx],
            id=REFILL_JOB,
            seconds=pool.refill_interval_s,
            next_run_time=now,
            **common,
        )
        self._scheduler.add_job(
            sampling.run,
            "interval",
            args=[ctx],
            id=SAMPLING_JOB,
            seconds=pool.sample_interval_s,
            next_run_time=now,
            **common,
        )
        self._scheduler.add_job(
            retention.run,
            "interval",
            args=[ctx],
            id=RETENTION_JOB,
            seconds=min(RETENTION_INTERVAL_S, pool.retention_s),
            **common,
        )

    def stop(self, timeout_s: float) -> bool:
        """Remove the jobs, then wait for the one in flight; False if it outlived the wait."""
        for job_id in (REFILL_JOB, SAMPLING_JOB, RETENTION_JOB):
            if self._scheduler.get_job(job_id) is not None:
                self._scheduler.remove_job(job_id)
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return True
        if ctx.busy.acquire(timeout=timeout_s):
            ctx.busy.release()
            return True
        return False

    def wake_refill(self) -> None:
        job = self._scheduler.get_job(REFILL_JOB)
        if job is not None:
            job.modify(next_run_time=datetime.now(UTC))

    def _on_error(self, event: JobExecutionEvent) -> None:
        if self._ctx is not None:
            self._ctx.metrics.job_errors.labels(task=event.job_id).inc()
        log.error("event=job_failed job=%s error=%r", event.job_id, event.exception)
