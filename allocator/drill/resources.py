"""What each node uses over a soak (``allocator drill --duration``): memory (RSS), open
files and threads, sampled from ``/proc`` and judged against a stated :class:`Bound`
(docs/design.md §9). A restart starts a new incarnation; nothing is compared across them.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from allocator.core import logs

logger = logs.get_logger(__name__)

PROC: Final = Path("/proc")
WARMUP_S: Final = 120.0
WINDOW_SAMPLES: Final = 5
MIN_WINDOW_SAMPLES: Final = 3
STOP_TIMEOUT_S: Final = 5.0
KIB_PER_MIB: Final = 1024.0

RESOURCES: Final = ("rss_mib", "open_files", "threads")
UNITS: Final = {"rss_mib": "MiB", "open_files": "open files", "threads": "threads"}


@dataclass(frozen=True)
class ProcessSample:
    """One process at one moment."""

    rss_mib: float
    open_files: int
    threads: int


@dataclass(frozen=True)
class Bound:
    """The largest growth a node may show in one incarnation (:func:`judge`)."""

    rss_growth_mib: float = 64
    fd_growth: int = 32
    thread_growth: int = 16

    def limit(self, resource: str) -> float:
        """The bound on ``resource`` (one of :data:`RESOURCES`)."""
        return {
            "rss_mib": self.rss_growth_mib,
            "open_files": self.fd_growth,
            "threads": self.thread_growth,
        }[resource]

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Entry:
    """One recorded sample of a node: seconds since the run started, the pid, the sample."""

    t_s: float
    pid: int
    sample: ProcessSample

    def as_dict(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t_s, 2),
            "pid": self.pid,
            "rss_mib": round(self.sample.rss_mib, 1),
            "open_files": self.sample.open_files,
            "threads": self.sample.threads,
        }


def sample(pid: int, root: Path = PROC) -> ProcessSample | None:
    """The process's RSS, open files and threads now; ``None`` when it is gone or unreadable.

    Reads ``/proc/<pid>/status`` (``VmRSS`` in kB, reported in MiB; ``Threads``) and counts
    ``/proc/<pid>/fd``. A process can exit (or turn zombie, which has no ``VmRSS``) between
    those reads: then ``None``. A pid reused by another process between two samples is not
    detected (it needs the pid space to wrap within one sampling interval)."""
    base = root / str(pid)
    try:
        status = (base / "status").read_text(encoding="utf-8", errors="replace")
        open_files = len(os.listdir(base / "fd"))
    except OSError:  # gone, a zombie's fd folder, or not ours to read
        return None
    fields: dict[str, str] = {}
    for line in status.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    try:
        rss_kib = int(fields["VmRSS"].split()[0])
        threads = int(fields["Threads"])
    except (KeyError, IndexError, ValueError):  # a zombie or a kernel thread: no memory
        return None
    return ProcessSample(rss_mib=rss_kib / KIB_PER_MIB, open_files=open_files, threads=threads)


class ResourceLog:
    """Every sample of every node, in the order added; safe to share between threads."""

    def __init__(self, nodes: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        # nodes named up front are reported (as not judged) even if never sampled
        self._entries: dict[str, list[Entry]] = {node: [] for node in nodes}

    def add(self, node: str, t_s: float, pid: int, sample: ProcessSample | None) -> None:
        """Record ``sample`` of ``node`` (pid ``pid``) at ``t_s``; ``None`` records nothing."""
        with self._lock:
            entries = self._entries.setdefault(node, [])
            if sample is not None:
                entries.append(Entry(t_s=t_s, pid=pid, sample=sample))

    def nodes(self) -> dict[str, list[Entry]]:
        """A copy: each node's entries in the order added."""
        with self._lock:
            return {node: list(entries) for node, entries in self._entries.items()}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(entries) for entries in self._entries.values())


@dataclass(frozen=True)
class Growth:
    """One incarnation's growth in one resource, with the window it was measured over."""

    value: float
    pid: int
    from_s: float
    to_s: float


def incarnations(entries: Iterable[Entry]) -> list[list[Entry]]:
    """Runs of consecutive entries with the same pid: a new pid starts a new incarnation, so
    a restart never counts as growth (nor as shrinkage)."""
    runs: list[list[Entry]] = []
    for entry in entries:
        if runs and runs[-1][-1].pid == entry.pid:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def _value(entry: Entry, resource: str) -> float:
    return float(getattr(entry.sample, resource))


def _median(values: list[float], resource: str) -> float:
    if resource == "rss_mib":
        return statistics.median(values)
    return statistics.median_low(values)


def incarnation_growth(
    run: list[Entry],
    *,
    warmup_s: float = WARMUP_S,
    window: int = WINDOW_SAMPLES,
    min_window: int = MIN_WINDOW_SAMPLES,
) -> dict[str, Growth] | None:
    """One incarnation's growth per resource, or ``None`` when it is not judged.

    Samples less than ``warmup_s`` after the incarnation's first sample are skipped
    (start-up allocations, pools filling); the first sample is the first *observation*, so
    an incarnation older than the soak skips at least its warm-up. Judged when at least
    ``2 x min_window`` samples are left: with ``n`` of them and ``k = min(window, n // 2)``,
    growth = median of the last ``k`` - median of the first ``k`` (the windows never
    overlap). Medians, so one spike neither fails nor hides a leak; counts use the lower
    median and stay integers."""
    if not run:
        return None
    judged = [e for e in run if e.t_s >= run[0].t_s + warmup_s]
    if len(judged) < 2 * min_window:
        return None
    k = min(window, len(judged) // 2)
    first, last = judged[:k], judged[-k:]
    return {
        resource: Growth(
            value=_median([_value(e, resource) for e in last], resource)
            - _median([_value(e, resource) for e in first], resource),
            pid=run[0].pid,
            from_s=first[0].t_s,
            to_s=last[-1].t_s,
        )
        for resource in RESOURCES
    }


def node_growth(
    entries: Iterable[Entry],
    *,
    warmup_s: float = WARMUP_S,
    window: int = WINDOW_SAMPLES,
    min_window: int = MIN_WINDOW_SAMPLES,
) -> dict[str, Growth] | None:
    """Per resource, the largest growth of the node's judged incarnations; ``None`` if none.

    The largest, so the longest-lived incarnation (where a slow leak shows most) counts, and
    a faster leak in a shorter one is not hidden by it."""
    worst: dict[str, Growth] = {}
    for run in incarnations(entries):
        growth = incarnation_growth(run, warmup_s=warmup_s, window=window, min_window=min_window)
        for resource, g in (growth or {}).items():
            if resource not in worst or g.value > worst[resource].value:
                worst[resource] = g
    return worst or None


def _rounded(resource: str, value: float) -> float | int:
    return round(value, 1) if resource == "rss_mib" else int(value)


def judge(
    log: ResourceLog,
    bound: Bound | None = None,
    *,
    warmup_s: float = WARMUP_S,
    window: int = WINDOW_SAMPLES,
    min_window: int = MIN_WINDOW_SAMPLES,
) -> dict[str, Any]:
    """The run document's ``resources`` object.

    ``ok`` when no node's growth exceeds ``bound`` in any resource (strictly greater fails;
    equal passes); each node and resource over it is one line of ``problems``, naming the
    incarnation (pid) and its window. A node with no judged incarnation is listed in
    ``not_judged``, has no ``growth`` entry and does not make ``ok`` false (the drill's
    plan fails a soak on it all the same)."""
    bound = bound or Bound()
    nodes = log.nodes()
    growth: dict[str, dict[str, float | int]] = {}
    problems: list[str] = []
    not_judged: list[str] = []
    for node, entries in nodes.items():
        worst = node_growth(entries, warmup_s=warmup_s, window=window, min_window=min_window)
        if worst is None:
            not_judged.append(node)
            continue
        growth[node] = {r: _rounded(r, g.value) for r, g in worst.items()}
        for resource, g in worst.items():
            limit = bound.limit(resource)
            if g.value > limit:
                problems.append(
                    f"{node}: {resource} grew by {_rounded(resource, g.value)} "
                    f"{UNITS[resource]} (bound {limit:g}) in pid {g.pid} "
                    f"between t={g.from_s:.1f} s and t={g.to_s:.1f} s"
                )
    return {
        "bound": bound.as_dict(),
        "nodes": {node: [e.as_dict() for e in entries] for node, entries in nodes.items()},
        "growth": growth,
        "ok": not problems,
        "problems": problems,
        "not_judged": not_judged,
    }


class Sampler:
    """Samples every node's current pid into a :class:`ResourceLog` every ``interval_s``.

    ``pids`` names each node's current pid (a node without one is skipped that tick);
    ``t_s`` is ``clock() - origin_s`` (``origin_s`` defaults to ``clock()`` at :meth:`start`),
    so pass the run's own start to share its time axis. Use as a context manager, or
    :meth:`start` and :meth:`stop`. One daemon thread, waiting on an Event (never
    ``time.sleep``), so :meth:`stop` returns within one sample; a failing pid lookup skips
    one tick.
    """

    def __init__(
        self,
        pids: Callable[[], Mapping[str, int]],
        interval_s: float,
        log: ResourceLog,
        clock: Callable[[], float] = time.monotonic,
        *,
        origin_s: float | None = None,
        root: Path = PROC,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("the sampling interval must be positive")
        self._pids = pids
        self._interval_s = interval_s
        self._log = log
        self._clock = clock
        self._origin_s = origin_s
        self._root = root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resource-sampler", daemon=True)

    def start(self) -> Sampler:
        """Starts the sampling thread (and the time axis, unless ``origin_s`` was given)."""
        if self._origin_s is None:
            self._origin_s = self._clock()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop and join (at most ``timeout_s``); whether the thread ended. Idempotent."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("resource_sampler_stuck", timeout_s=timeout_s)
            return False
        return True

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sample_once(self) -> int:
        """Sample every node now; how many samples were recorded."""
        try:
            pids = dict(self._pids())
        except Exception as exc:  # a half-written pid file: try again next tick
            logger.warning("resource_pids_failed", error=repr(exc))
            return 0
        recorded = 0
        for node, pid in pids.items():
            taken = sample(pid, self._root)
            t_s = self._clock() - (self._origin_s or 0.0)
            self._log.add(node, t_s, pid, taken)
            recorded += taken is not None
        return recorded

    def _run(self) -> None:
        # the schedule runs on the real monotonic clock (what Event.wait counts in), whatever
        # clock names the samples' times
        while not self._stop.is_set():
            began = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - began)))
