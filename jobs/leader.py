"""The leader-only jobs on APScheduler 3: started after the fence is taken, stopped first."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from allocator.config import Config
from allocator.core import logs
from allocator.core.clock import wall_clock_ms
from allocator.core.leadership import Term
from allocator.metrics import NodeMetrics
from allocator.node.seams import LeaderHooks, LeaderStore
from jobs import aging, refill, retention, sampling
from jobs.context import LeaderContext
from jobs.low_water import LowWaterCheck

log = logs.get_logger(__name__)

REFILL_JOB = "refill"
RETENTION_JOB = "retention"
SAMPLING_JOB = "sampling"
AGING_JOB = "aging"
LOW_WATER_JOB = "lowwater"
RETENTION_INTERVAL_S = 60.0


class QuietSkips(logging.Filter):
    """Drops APScheduler's "skipped: maximum number of running instances" for the check.

    The low-water check runs ten times a second: while one check waits on a slow database,
    APScheduler skips the next ones, and a warning for each would repeat ten times a second;
    the other jobs' skips are still logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the low-water check's skip warning."""
        message = record.getMessage()
        return not ("maximum number of running instances" in message and "LowWaterCheck" in message)


_QUIET_SKIPS = QuietSkips()
logging.getLogger("apscheduler.scheduler").addFilter(_QUIET_SKIPS)


class LeaderJobs:
    """The real :class:`allocator.node.seams.LeaderJobsPort`, built by ``allocator run``.

    One BackgroundScheduler per node, started once; a term adds its jobs and removes them
    when it ends. Job errors are logged and counted, never fatal.
    """

    def __init__(
        self,
        db: LeaderStore,
        config: Config,
        metrics: NodeMetrics,
        now_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._db = db
        self._config = config
        self._metrics = metrics
        self._now_ms = now_ms
        self._scheduler = BackgroundScheduler(
            timezone=UTC, job_defaults={"misfire_grace_time": None}
        )
        self._scheduler.add_listener(self._on_error, EVENT_JOB_ERROR)
        self._ctx: LeaderContext | None = None
        self._job_ids: tuple[str, ...] = ()

    def start_scheduler(self) -> None:
        """Start the node's one scheduler (no jobs yet)."""
        self._scheduler.start()

    def shutdown(self) -> None:
        """Shut the scheduler down at the node's exit."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)

    def start(self, term: Term, hooks: LeaderHooks) -> None:
        """Add this term's jobs; refill runs at once.

        Job ids carry the term's token (``refill-<generation>-<epoch>``): APScheduler counts
        running instances per id, so a run stuck in an old term (a black-holed database,
        say) can never make a later term's runs be skipped as "max instances reached".
        """
        ctx = LeaderContext(term, self._db, self._config, self._metrics, hooks, self._now_ms)
        self._ctx = ctx
        ctx.wake_refill = self.wake_refill
        suffix = f"-{term.token.generation}-{term.token.epoch}"
        refill_id, sampling_id, retention_id, aging_id, low_water_id = (
            REFILL_JOB + suffix,
            SAMPLING_JOB + suffix,
            RETENTION_JOB + suffix,
            AGING_JOB + suffix,
            LOW_WATER_JOB + suffix,
        )
        self._job_ids = (  # refill first
            refill_id,
            sampling_id,
            retention_id,
            aging_id,
            low_water_id,
        )
        pool = ctx.config.pool
        common: dict[str, Any] = {"max_instances": 1, "coalesce": True, "replace_existing": True}
        now = datetime.now(UTC)
        self._scheduler.add_job(
            refill.run,
            "interval",
            args=[ctx],
            id=refill_id,
            seconds=pool.refill_interval_s,
            next_run_time=now,
            **common,
        )
        self._scheduler.add_job(
            sampling.run,
            "interval",
            args=[ctx],
            id=sampling_id,
            seconds=pool.sample_interval_s,
            next_run_time=now,
            **common,
        )
        self._scheduler.add_job(
            aging.run,
            "interval",
            args=[ctx],
            id=aging_id,
            seconds=pool.refill_interval_s,
            # At once, like the refill: blocks that aged while the leadership changed hands
            # are voided now (and the refill woken), not one interval later, when claims
            # would find them first and get "pool empty" after voiding a bounded few.
            next_run_time=now,
            **common,
        )
        self._scheduler.add_job(
            retention.run,
            "interval",
            args=[ctx],
            id=retention_id,
            seconds=min(RETENTION_INTERVAL_S, pool.retention_s),
            **common,
        )
        self._scheduler.add_job(
            LowWaterCheck(ctx).run,
            "interval",
            id=low_water_id,
            seconds=pool.low_watermark_check_s,
            **common,
        )

    def stop(self, timeout_s: float) -> bool:
        """Remove the jobs, then wait for the one in flight; False if it outlived the wait.

        The run in flight stops at its next ``may_write`` check; writes already past that
        check roll back through ``commit_if``.
        """
        for job_id in self._job_ids:
            if self._scheduler.get_job(job_id) is not None:
                self._scheduler.remove_job(job_id)
        self._job_ids = ()
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return True
        if ctx.busy.acquire(timeout=timeout_s):
            ctx.busy.release()
            return True
        return False

    def wake_refill(self) -> None:
        """Run the refill now (the low-water check's call) instead of at its next interval."""
        if not self._job_ids:
            return
        job = self._scheduler.get_job(self._job_ids[0])
        if job is not None:
            job.modify(next_run_time=datetime.now(UTC))

    def _on_error(self, event: JobExecutionEvent) -> None:
        if self._ctx is not None:
            task = event.job_id.split("-", 1)[0]
            self._ctx.metrics.job_errors.labels(task=task).inc()
        log.error("job_failed", job=event.job_id, error=repr(event.exception))
