"""The soak's resource sampling and its judgement (:mod:`allocator.drill.resources`): a fake
``/proc`` tree for :func:`sample` and the sampler thread, synthetic logs for :func:`judge`, and
one sample of this very process through the real ``/proc``."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from allocator.drill import resources
from allocator.drill.resources import Bound, ProcessSample, ResourceLog, Sampler, judge, sample
from tests import output_schemas

INTERVAL_S = 10.0
WAIT_S = 10.0


def fake_process(root: Path, pid: int, *, rss_kib: int, fds: int, threads: int) -> None:
    """``/proc/<pid>`` as the kernel shows it, as far as :func:`sample` reads it."""
    base = root / str(pid)
    (base / "fd").mkdir(parents=True, exist_ok=True)
    for entry in (base / "fd").iterdir():
        entry.unlink()
    for fd in range(fds):
        (base / "fd" / str(fd)).touch()
    (base / "status").write_text(
        f"Name:\tallocator\nState:\tS (sleeping)\nPid:\t{pid}\n"
        f"VmPeak:\t  999999 kB\nVmRSS:\t  {rss_kib} kB\nThreads:\t{threads}\n"
    )


def wait_until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        pause.wait(0.01)


def steady(
    log: ResourceLog,
    node: str,
    pid: int,
    *,
    start_s: float = 0.0,
    until_s: float = 1800.0,
    rss_mib: float = 60.0,
    fds: int = 24,
    threads: int = 9,
    rss_per_s: float = 0.0,
    fds_per_s: float = 0.0,
    threads_per_s: float = 0.0,
) -> None:
    """One incarnation sampled every ``INTERVAL_S``, with optional linear growth."""
    t = start_s
    while t <= until_s:
        age = t - start_s
        log.add(
            node,
            t,
            pid,
            ProcessSample(
                rss_mib=rss_mib + rss_per_s * age,
                open_files=fds + int(fds_per_s * age),
                threads=threads + int(threads_per_s * age),
            ),
        )
        t += INTERVAL_S


# -- sample ------------------------------------------------------------------------------


def test_sample_reads_status_and_counts_fds(tmp_path: Path) -> None:
    fake_process(tmp_path, 4242, rss_kib=62_668, fds=24, threads=9)
    got = sample(4242, tmp_path)
    assert got == ProcessSample(rss_mib=62_668 / 1024, open_files=24, threads=9)
    assert round(got.rss_mib, 1) == 61.2


def test_a_process_that_is_gone_gives_none(tmp_path: Path) -> None:
    assert sample(4242, tmp_path) is None


def test_a_process_vanishing_between_reads_gives_none(tmp_path: Path) -> None:
    # status was still there, the fd folder already gone: the process exited mid-sample
    fake_process(tmp_path, 4242, rss_kib=1024, fds=3, threads=1)
    for entry in (tmp_path / "4242" / "fd").iterdir():
        entry.unlink()
    (tmp_path / "4242" / "fd").rmdir()
    assert sample(4242, tmp_path) is None


def test_a_zombie_without_memory_gives_none(tmp_path: Path) -> None:
    fake_process(tmp_path, 4242, rss_kib=1024, fds=0, threads=1)
    (tmp_path / "4242" / "status").write_text("Name:\tallocator\nState:\tZ (zombie)\nThreads:\t1\n")
    assert sample(4242, tmp_path) is None


def test_sample_of_this_process_through_the_real_proc() -> None:
    before = sample(os.getpid())
    assert before is not None
    assert before.rss_mib > 0
    assert before.threads >= 1
    assert before.open_files >= 1
    release = threading.Event()
    extra = threading.Thread(target=release.wait, daemon=True)
    extra.start()
    try:
        with contextlib.ExitStack() as files:
            for _ in range(5):
                files.enter_context(Path(__file__).open("rb"))
            during = sample(os.getpid())
    finally:
        release.set()
        extra.join(WAIT_S)
    assert during is not None
    assert during.open_files >= before.open_files + 5
    assert during.threads >= before.threads + 1


# -- judge -------------------------------------------------------------------------------


def test_steady_usage_passes() -> None:
    log = ResourceLog()
    for n, node in enumerate(("node-1", "node-2", "node-3")):
        steady(log, node, 100 + n)
    got = judge(log, Bound())
    assert got["ok"] is True
    assert got["problems"] == []
    assert got["not_judged"] == []
    assert got["growth"] == {
        node: {"rss_mib": 0.0, "open_files": 0, "threads": 0}
        for node in ("node-1", "node-2", "node-3")
    }
    assert got["bound"] == {"rss_growth_mib": 64, "fd_growth": 32, "thread_growth": 16}
    assert set(got) == {"bound", "nodes", "growth", "ok", "problems", "not_judged"}
    output_schemas.assert_valid("drill", got, "resources")
    first = got["nodes"]["node-1"][0]
    assert first == {"t_s": 0.0, "pid": 100, "rss_mib": 60.0, "open_files": 24, "threads": 9}


@pytest.mark.parametrize(
    ("leak", "resource", "words"),
    [
        ({"rss_per_s": 0.05}, "rss_mib", "MiB (bound 64)"),
        ({"fds_per_s": 0.03}, "open_files", "open files (bound 32)"),
        ({"threads_per_s": 0.02}, "threads", "threads (bound 16)"),
    ],
)
def test_a_leak_over_the_bound_fails_naming_node_and_resource(
    leak: dict[str, float], resource: str, words: str
) -> None:
    log = ResourceLog()
    steady(log, "node-1", 100)
    steady(
        log,
        "node-2",
        200,
        rss_per_s=leak.get("rss_per_s", 0.0),
        fds_per_s=leak.get("fds_per_s", 0.0),
        threads_per_s=leak.get("threads_per_s", 0.0),
    )
    got = judge(log, Bound())
    assert got["ok"] is False
    assert len(got["problems"]) == 1
    problem = got["problems"][0]
    assert problem.startswith(f"node-2: {resource} grew by ")
    assert words in problem
    assert "pid 200" in problem
    output_schemas.assert_valid("drill", got, "resources")
    assert got["growth"]["node-2"][resource] > Bound().limit(resource)
    assert got["growth"]["node-1"] == {"rss_mib": 0.0, "open_files": 0, "threads": 0}


def test_growth_at_the_bound_passes_and_just_over_fails() -> None:
    log = ResourceLog()
    steady(log, "node-1", 100, until_s=120.0 + 9 * INTERVAL_S)
    # ten steady samples after the warm-up, then five with 16 threads more
    for i in range(5):
        log.add("node-1", 2000.0 + i, 100, ProcessSample(60.0, 24, 9 + 16))
    assert judge(log, Bound())["ok"] is True
    assert judge(log, Bound(thread_growth=15))["problems"] == [
        "node-1: threads grew by 16 threads (bound 15) in pid 100 between t=120.0 s and t=2004.0 s"
    ]


def test_single_spikes_do_not_fail_and_do_not_hide_a_leak() -> None:
    log = ResourceLog()
    steady(log, "node-1", 100)
    entries = log.nodes()["node-1"]
    # a spike at the very first and the very last judged sample: the medians ignore them
    spiky = ResourceLog()
    for e in entries:
        rss = e.sample.rss_mib + (500.0 if e.t_s in (120.0, 1800.0) else 0.0)
        spiky.add("node-1", e.t_s, e.pid, ProcessSample(rss, e.sample.open_files, 9))
    assert judge(spiky)["ok"] is True
    # a real leak with one low outlier at the end still fails
    leaky = ResourceLog()
    steady(leaky, "node-1", 100, rss_per_s=0.1)
    leaky.add("node-1", 1810.0, 100, ProcessSample(60.0, 24, 9))
    assert judge(leaky)["ok"] is False


def test_restarts_do_not_count_as_growth() -> None:
    log = ResourceLog()
    # every incarnation starts 100 MiB, 40 files and 20 threads above the one before
    for i in range(4):
        steady(
            log,
            "node-1",
            100 + i,
            start_s=i * 600.0,
            until_s=i * 600.0 + 590.0,
            rss_mib=60.0 + 100.0 * i,
            fds=24 + 40 * i,
            threads=9 + 20 * i,
        )
    got = judge(log)
    assert got["ok"] is True
    assert got["growth"]["node-1"] == {"rss_mib": 0.0, "open_files": 0, "threads": 0}
    assert {e["pid"] for e in got["nodes"]["node-1"]} == {100, 101, 102, 103}


def test_the_leaking_incarnation_fails_even_among_restarts() -> None:
    log = ResourceLog()
    steady(log, "node-1", 100, until_s=590.0)
    steady(log, "node-1", 101, start_s=600.0, until_s=3600.0, rss_per_s=0.05)
    steady(log, "node-1", 102, start_s=3610.0, until_s=4000.0)
    problems = judge(log)["problems"]
    assert len(problems) == 1
    assert "pid 101" in problems[0]


def test_the_warm_up_is_excluded() -> None:
    log = ResourceLog()
    # start-up: memory, files and threads climb for the first two minutes, then stay
    t = 0.0
    while t <= 1800.0:
        ramp = min(t, 110.0) / 110.0
        log.add(
            "node-1",
            t,
            100,
            ProcessSample(20.0 + 200.0 * ramp, 5 + int(60 * ramp), 2 + int(30 * ramp)),
        )
        t += INTERVAL_S
    got = judge(log)
    assert got["ok"] is True
    assert got["growth"]["node-1"] == {"rss_mib": 0.0, "open_files": 0, "threads": 0}
    # judged with no warm-up, the same samples fail in all three resources
    assert len(judge(log, warmup_s=0.0)["problems"]) == 3


def test_a_node_that_never_lived_past_the_warm_up_is_not_judged() -> None:
    log = ResourceLog(["node-1", "node-2", "node-3"])
    steady(log, "node-1", 100)
    # node-2 restarted every 100 s, each time with more memory: never judged, never failed
    for i in range(18):
        steady(
            log,
            "node-2",
            200 + i,
            start_s=i * 100.0,
            until_s=i * 100.0 + 90.0,
            rss_mib=60.0 + 100 * i,
        )
    # node-3 was never sampled at all
    got = judge(log)
    assert got["ok"] is True
    assert got["not_judged"] == ["node-2", "node-3"]
    assert set(got["growth"]) == {"node-1"}
    assert got["nodes"]["node-3"] == []
    output_schemas.assert_valid("drill", got, "resources")


# -- the sampler thread -----------------------------------------------------------------


class Pids:
    """The nodes' current pids, changed by the test while the sampler runs."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self._lock = threading.Lock()
        self._pids = dict(pids)
        self.fail = False
        self.failures = 0

    def set(self, node: str, pid: int) -> None:
        with self._lock:
            self._pids[node] = pid

    def __call__(self) -> Mapping[str, int]:
        with self._lock:
            if self.fail:
                self.failures += 1
                raise ValueError("nodes.json half written")
            return dict(self._pids)


def test_the_sampler_samples_every_node_and_stops(tmp_path: Path) -> None:
    fake_process(tmp_path, 100, rss_kib=10 * 1024, fds=4, threads=2)
    fake_process(tmp_path, 200, rss_kib=20 * 1024, fds=5, threads=3)
    pids = Pids({"node-1": 100, "node-2": 200, "node-3": 300})  # node-3's pid is gone
    log = ResourceLog()
    ticks = itertools.count(1000)
    sampler = Sampler(pids, 0.01, log, clock=lambda: float(next(ticks)), root=tmp_path)
    sampler.start()
    try:
        wait_until(lambda: len(log.nodes().get("node-1", [])) >= 3)
        pids.fail = True  # a failing lookup skips ticks; the thread goes on
        pids.set("node-1", 101)  # node-1 restarted
        fake_process(tmp_path, 101, rss_kib=30 * 1024, fds=6, threads=4)
        wait_until(lambda: pids.failures >= 1)
        pids.fail = False
        wait_until(lambda: any(e.pid == 101 for e in log.nodes()["node-1"]))
    finally:
        assert sampler.stop() is True
    count = len(log)
    entries = log.nodes()
    assert entries["node-3"] == []
    assert {e.pid for e in entries["node-1"]} == {100, 101}
    assert entries["node-2"][0].sample == ProcessSample(20.0, 5, 3)
    times = [e.t_s for e in entries["node-1"]]
    assert times == sorted(times)
    assert times[0] > 0
    # stopped means stopped: no sample arrives afterwards, and stopping again is harmless
    assert sampler.stop() is True
    assert len(log) == count


def test_the_sampler_shares_the_runs_time_axis(tmp_path: Path) -> None:
    fake_process(tmp_path, 100, rss_kib=1024, fds=1, threads=1)
    log = ResourceLog()
    with Sampler(
        lambda: {"node-1": 100}, 60.0, log, clock=lambda: 1500.0, origin_s=1000.0, root=tmp_path
    ):
        wait_until(lambda: len(log) >= 1)
    assert log.nodes()["node-1"][0].t_s == 500.0


def test_a_sampling_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Sampler(dict, 0.0, ResourceLog())


def test_a_short_incarnation_is_judged_on_windows_that_never_overlap() -> None:
    log = ResourceLog()
    log.add("node-1", 0.0, 100, ProcessSample(60.0, 24, 1))  # inside the warm-up
    for i, threads in enumerate([9, 9, 9, 30, 30, 30]):  # six after it: three per window
        log.add("node-1", 120.0 + i, 100, ProcessSample(60.0, 24, threads))
    growth = resources.node_growth(log.nodes()["node-1"])
    assert growth is not None
    assert growth["threads"].value == 21
    # five after the warm-up are too few for two windows of three: not judged
    short = ResourceLog()
    for e in log.nodes()["node-1"][:-1]:
        short.add("node-1", e.t_s, e.pid, e.sample)
    assert judge(short)["not_judged"] == ["node-1"]
