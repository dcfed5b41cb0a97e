"""Every duration flag of the CLI takes one shape (issue 21, item 6), and its old spelling
still works with a warning.

For each flag: the new spelling, its ``ALLOCATOR_*`` variable, the old spelling (a bare
number, or the flag whose name carried the unit) and the old variable each hand the
command's work the same value; the old ones print one ``warning:`` line. In-process (click's
``CliRunner``), nothing starts: the call where the work would begin is replaced by one that
keeps what it was given and ends the command (:class:`Reached`, exit 99).
``docs/exit-codes.md``'s table of duration flags is checked against the commands (each flag
a :class:`Duration`, its variable the one click reads, its old spellings hidden).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click
import pytest
from click.testing import Result

from allocator import cli
from allocator import cluster_status as status_mod
from allocator.bench.claims import runner as claims_runner
from allocator.bench.client import runner as client_runner
from allocator.bench.slow_consumer import runner as slow_runner
from allocator.bench.sustained import runner as sustained_runner
from allocator.commands import demo as demo_mod
from allocator.commands import local as local_mod
from allocator.commands.options import Duration
from allocator.core.exits import Exit
from allocator.drill import plan as drill_plan
from allocator.pool import pause as pause_mod
from allocator.postgres import migrate as migrate_mod
from tests.fuzz.clikit import clean_environment, invoke

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "a-test-admin-token-0123456789"


REACHED = 99
GOT: list[object] = []


class Reached(click.exceptions.Exit):
    """Where the work would begin: keeps the value under test and ends the command with
    exit 99 (click's own way out, which no handler of the product swallows)."""

    def __init__(self, value: object) -> None:
        GOT.append(value)
        super().__init__(REACHED)


def params() -> dict[str, Any]:
    return click.get_current_context().params


def _watch(patch: pytest.MonkeyPatch) -> None:
    def gather(*args: Any, **kwargs: Any) -> NoReturn:
        raise Reached(params()["duration"].total_seconds())

    patch.setattr(status_mod, "gather", gather)


def _step_down(patch: pytest.MonkeyPatch) -> None:
    def contenders(config: Any) -> NoReturn:
        raise Reached(params()["timeout"].total_seconds())

    patch.setattr(status_mod, "read_contenders_once", contenders)


def _pool_pause(patch: pytest.MonkeyPatch) -> None:
    def pause(url: str, reason: str, timeout_s: float, **kwargs: Any) -> NoReturn:
        raise Reached(timeout_s)

    patch.setattr(pause_mod, "pause", pause)


def _drill(field: str) -> Callable[[pytest.MonkeyPatch], None]:
    def install(patch: pytest.MonkeyPatch) -> None:
        def run(request: drill_plan.Request, progress: Any) -> NoReturn:
            raise Reached(getattr(request, field))

        patch.setattr(drill_plan, "run", run)

    return install


def _local_up(field: str) -> Callable[[pytest.MonkeyPatch], None]:
    def install(patch: pytest.MonkeyPatch) -> None:
        def cluster(*args: Any, **kwargs: Any) -> NoReturn:
            raise Reached(kwargs[field])

        patch.setattr(local_mod, "LocalCluster", cluster)

    return install


def _demo(patch: pytest.MonkeyPatch) -> None:
    class Cluster:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def up(self, **kwargs: Any) -> None:
            return None

    def story(cluster: Any, info: Any, phase_s: float) -> NoReturn:
        raise Reached(phase_s)

    patch.setattr(demo_mod, "LocalCluster", Cluster)
    patch.setattr(demo_mod, "render", lambda info: [])
    patch.setattr(demo_mod, "_failover_story", story)
    patch.setattr(demo_mod, "_stop", lambda cluster: None)


def _bench(module: Any, pick: Callable[..., object]) -> Callable[[pytest.MonkeyPatch], None]:
    def install(patch: pytest.MonkeyPatch) -> None:
        def run(*args: Any, **kwargs: Any) -> NoReturn:
            raise Reached(pick(*args, **kwargs))

        patch.setattr(module, "run", run)

    return install


def _migrate(patch: pytest.MonkeyPatch) -> None:
    def migrate_to(url: str, target: str, lock_timeout_s: float) -> NoReturn:
        raise Reached(lock_timeout_s)

    patch.setattr(migrate_mod, "migrate_to", migrate_to)


@dataclass(frozen=True)
class Flag:
    """One duration flag: how it is spelled now and before, the value its work gets for
    ``new`` (and ``old``, which says the same), and where that work begins."""

    path: tuple[str, ...]
    new: tuple[str, str]
    old: tuple[str, str]
    variable: str
    old_variable: str
    expected: object
    install: Callable[[pytest.MonkeyPatch], None]
    extra: tuple[str, ...] = ()


FLAGS = [
    Flag(
        ("watch",),
        ("--duration", "90s"),
        ("--duration", "90"),
        "ALLOCATOR_WATCH_DURATION",
        "",
        90.0,
        _watch,
    ),
    Flag(
        ("step-down",),
        ("--timeout", "1500ms"),
        ("--timeout", "1.5"),
        "ALLOCATOR_STEP_DOWN_TIMEOUT",
        "",
        1.5,
        _step_down,
    ),
    Flag(
        ("pool", "pause"),
        ("--timeout", "2m"),
        ("--timeout", "120"),
        "",  # ALLOCATOR_POOL_PAUSE_TIMEOUT would be a [pool] key: no variable
        "",
        120.0,
        _pool_pause,
        ("--reason", "a drill"),
    ),
    Flag(
        ("drill",),
        ("--duration", "2h"),
        ("--duration", "7200"),
        "ALLOCATOR_DRILL_DURATION",
        "ALLOCATOR_DRILL_DURATION_S",
        7200.0,
        _drill("duration_s"),
    ),
    Flag(
        ("drill",),
        ("--session-timeout", "2s"),
        ("--session-timeout-ms", "2000"),
        "ALLOCATOR_DRILL_SESSION_TIMEOUT",
        "ALLOCATOR_DRILL_SESSION_TIMEOUT_MS",
        2000,
        _drill("session_timeout_ms"),
    ),
    Flag(
        ("local", "up"),
        ("--session-timeout", "6s"),
        ("--session-timeout-ms", "6000"),
        "ALLOCATOR_LOCAL_UP_SESSION_TIMEOUT",
        "ALLOCATOR_LOCAL_UP_SESSION_TIMEOUT_MS",
        6000,
        _local_up("session_timeout_ms"),
    ),
    Flag(
        ("local", "up"),
        ("--tick", "150ms"),
        ("--tick-ms", "150"),
        "ALLOCATOR_LOCAL_UP_TICK",
        "ALLOCATOR_LOCAL_UP_TICK_MS",
        150,
        _local_up("tick_ms"),
    ),
    Flag(
        ("demo",),
        ("--phase", "2500ms"),
        ("--phase-s", "2.5"),
        "ALLOCATOR_DEMO_PHASE",
        "ALLOCATOR_DEMO_PHASE_S",
        2.5,
        _demo,
    ),
    Flag(
        ("bench", "claims"),
        ("--duration", "1m"),
        ("--seconds", "60"),
        "ALLOCATOR_BENCH_CLAIMS_DURATION",
        "ALLOCATOR_BENCH_CLAIMS_SECONDS",
        60.0,
        _bench(claims_runner, lambda plan, *rest: plan.seconds),
    ),
    Flag(
        ("bench", "client"),
        ("--duration", "750ms"),
        ("--seconds", "0.75"),
        "ALLOCATOR_BENCH_CLIENT_DURATION",
        "ALLOCATOR_BENCH_CLIENT_SECONDS",
        0.75,
        _bench(client_runner, lambda *args, **kwargs: kwargs["seconds"]),
    ),
    Flag(
        ("bench", "slow-consumer"),
        ("--status-every", "1s"),
        ("--status-every-ms", "1000"),
        "ALLOCATOR_BENCH_SLOW_CONSUMER_STATUS_EVERY",
        "ALLOCATOR_BENCH_SLOW_CONSUMER_STATUS_EVERY_MS",
        1000,
        _bench(slow_runner, lambda plan, *rest: plan.status_every_ms),
    ),
]
IDS = [f"{' '.join(flag.path)} {flag.new[0]}" for flag in FLAGS]
NEW_FLAGS = [
    Flag(
        ("migrate",),
        ("--lock-timeout", "90s"),
        ("--lock-timeout", "90s"),  # born with the convention: no old spelling
        "ALLOCATOR_MIGRATE_LOCK_TIMEOUT",
        "",
        90.0,
        _migrate,
        ("--database-url", "postgresql://nobody@127.0.0.1:1/nothing"),
    ),
    Flag(
        ("bench", "sustained"),
        ("--duration", "90s"),
        ("--duration", "90s"),  # born with the convention: no old spelling
        "ALLOCATOR_BENCH_SUSTAINED_DURATION",
        "",
        90.0,
        _bench(sustained_runner, lambda plan, *rest: plan.seconds),
    ),
    Flag(
        ("bench", "sustained"),
        ("--burst-duration", "20s"),
        ("--burst-duration", "20s"),  # born with the convention: no old spelling
        "ALLOCATOR_BENCH_SUSTAINED_BURST_DURATION",
        "",
        20.0,
        _bench(sustained_runner, lambda plan, *rest: plan.burst_seconds),
    ),
]
FLAGS += NEW_FLAGS
IDS += [f"{' '.join(flag.path)} {flag.new[0]}" for flag in NEW_FLAGS]


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_environment(monkeypatch)
    monkeypatch.chdir(tmp_path)  # a bench or drill would write its state folder here


def reach(
    flag: Flag, patch: pytest.MonkeyPatch, args: tuple[str, ...], env: dict[str, str]
) -> tuple[object, Result]:
    """What the work got from ``allocator <path> <args>``, and the result."""
    base = {"ALLOCATOR_NODE_ADMIN_TOKEN": TOKEN, "ALLOCATOR_ZOOKEEPER_INSECURE": "true"}
    flag.install(patch)
    GOT.clear()
    result = invoke([*flag.path, *flag.extra, *args], env={**base, **env})
    assert result.exit_code == REACHED, result.output
    [got] = GOT
    return got, result


@pytest.mark.parametrize("flag", FLAGS, ids=IDS)
def test_the_new_spelling_and_its_variable(flag: Flag, monkeypatch: pytest.MonkeyPatch) -> None:
    got, result = reach(flag, monkeypatch, flag.new, {})
    assert got == flag.expected
    assert "warning" not in result.stderr
    if flag.variable:
        got, result = reach(flag, monkeypatch, (), {flag.variable: flag.new[1]})
        assert got == flag.expected
        assert "warning" not in result.stderr


@pytest.mark.parametrize("flag", FLAGS, ids=IDS)
def test_the_old_spelling_still_works_and_warns(
    flag: Flag, monkeypatch: pytest.MonkeyPatch
) -> None:
    if flag in NEW_FLAGS:
        pytest.skip("a flag born with the convention has no old spelling")
    got, result = reach(flag, monkeypatch, flag.old, {})
    assert got == flag.expected
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert "deprecated" in warning
    assert flag.old[0] in warning
    if flag.old_variable:
        got, result = reach(flag, monkeypatch, (), {flag.old_variable: flag.old[1]})
        assert got == flag.expected
        assert f"warning: {flag.old_variable} is deprecated" in result.stderr


@pytest.mark.parametrize("flag", FLAGS, ids=IDS)
def test_a_bad_value_is_refused_before_any_work(
    flag: Flag, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag.install(monkeypatch)
    env = {"ALLOCATOR_NODE_ADMIN_TOKEN": TOKEN, "ALLOCATOR_ZOOKEEPER_INSECURE": "true"}
    zero_means_something = flag.path == ("demo",)  # no pause around the kill
    for value in ("-1s", "soon", *([] if zero_means_something else ["0s"])):
        result = invoke([*flag.path, *flag.extra, flag.new[0], value], env=env)
        assert result.exit_code == Exit.USAGE, (value, result.output)
        assert f"Invalid value for '{flag.new[0]}'" in result.stderr
    if flag.old[0] != flag.new[0]:
        both = invoke([*flag.path, *flag.extra, *flag.new, *flag.old], env=env)
        assert both.exit_code == Exit.USAGE, both.output
        assert f"give {flag.new[0]} or {flag.old[0]}, not both" in both.stderr


def test_every_duration_flag_is_here() -> None:
    found = set()
    for path, command in leaves():
        for param in command.params:
            duration = isinstance(param, click.Option) and isinstance(param.type, Duration)
            if duration and not param.hidden:
                found.add((path, param.opts[0]))
    assert found == {(flag.path, flag.new[0]) for flag in FLAGS}


def leaves(
    group: click.Group = cli.main, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += leaves(command, (*path, name))
        else:
            found.append(((*path, name), command))
    return found


def test_the_documented_table_is_the_flags() -> None:
    text = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    row = r"^\| `([a-z -]+) (--[a-z-]+) [^`]+` \| (?:`(\w+)`|—[^|]*) \| ([^|]+) \|$"
    rows = re.findall(row, text, re.M)
    documented = {(tuple(words.split()), flag): (var, old) for words, flag, var, old in rows}
    assert set(documented) == {(flag.path, flag.new[0]) for flag in FLAGS}
    for flag in FLAGS:
        variable, old = documented[(flag.path, flag.new[0])]
        assert variable == flag.variable
        if flag.old[0] != flag.new[0]:
            assert f"`{flag.old[0]} " in old
        if flag.old_variable:
            assert f"`{flag.old_variable}`" in old
