"""Fuzz: every CLI command's arguments, in-process (issue 10, must-show 8).

Walks ``allocator.cli.main`` for every command and subcommand and throws generated argument
lists at each: its own options with nonsense values (numbers out of range, NaN, huge, odd
unicode, paths that are missing, a file, too long), unknown options, extra arguments,
repeated and missing ones. Every answer must be documented (:func:`clikit.check_answer`):
an exit code the CLI documents, one error line, never a traceback.

Nothing heavy or remote runs: every command works in a fresh temporary folder (no cluster
recorded there), libpq points at a closed port, and the entry points that would reach out
raise :class:`Reached` instead: opening a PostgreSQL connection, starting a kazoo client,
starting the embedded cluster's servers (``LocalCluster.up`` runs up to there: its state
folder, lock and record are real; ``local up``, ``demo``, ``drill``, ``bench``), building a
node (``run``), spawning a process and any HTTP request. Reaching one means the arguments
passed validation; then every float option in effect must be finite and not negative, and
every duration not negative (a NaN or a negative duration must be refused before the work
starts).

Inputs (``ci`` profile): 25 per command (28 commands: 700), 40 per command group (the
``allocator`` group and its 5 subgroups: 240).
"""

from __future__ import annotations

import math
import subprocess
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import click
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from allocator.cli import main
from allocator.commands import run as run_cmd
from allocator.commands.options import Duration
from allocator.core import logs
from allocator.local.cluster import LocalCluster
from tests.fuzz.clikit import check_answer, clean_environment, invoke
from tests.fuzz.profiles import examples

PER_COMMAND = 25
PER_GROUP = 40

pytestmark = pytest.mark.timeout(120)  # a command that blocks fails the test, not the run


class Reached(BaseException):
    """Raised where a command would start real work; a BaseException, so that no
    ``except Exception`` in the product swallows it. Carries the command's parameters."""

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__()
        self.params = params


def _reach(*args: Any, **kwargs: Any) -> NoReturn:
    context = click.get_current_context(silent=True)
    raise Reached(dict(context.params) if context is not None else {})


Named = tuple[tuple[str, ...], click.Command]


def walk(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[Named]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield (*path, name), command
            yield from walk(command, (*path, name))
        else:
            yield (*path, name), command


ALL = list(walk(main))
LEAVES = [(path, command) for path, command in ALL if not isinstance(command, click.Group)]
GROUPS: list[Named] = [((), main), *((p, c) for p, c in ALL if isinstance(c, click.Group))]


def _ids(items: list[Named]) -> list[str]:
    return [" ".join(path) or "allocator" for path, _ in items]


# -- values --------------------------------------------------------------------------------

SURROGATES = st.sampled_from(["\udc80", "\udcff", "a\udcffb"])
"""What Python makes of bytes on a command line that are not UTF-8 (surrogateescape)."""
NASTY_TEXT = [
    "",
    " ",
    "-",
    "--",
    "-1",
    "0",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "9" * 40,
    str(2**63),
    "1_000",
    "١٢٣",
    "0x10",
    "a\nb",
    "a\rb",
    "\x1b[2J",
    "\t",
    "\u2028",
    "x" * 3000,
    "'",
    '"',
    "a 'b",
    "=",
    "pool.min_blocks=0",
    "pool.min_blocks=",
    "node.admin_token=abc",
    "postgres.url=postgresql://u:hunter2hunter2@127.0.0.1:1/db",
    "zookeeper.hosts=127.0.0.1:1",
    "postgresql://u@127.0.0.1:1/db",
    "postgresql://u:hunter2hunter2@127.0.0.1:1/db",
    "host=127.0.0.1 port=1 password=hunter2hunter2",
    "NAME=VALUE",
    "ALLOCATOR_POOL_MIN_BLOCKS=8",
    "=x",
    "1,8,32",
    "1,,2",
    "0,1",
    "n1",
    "SIGKILL",
    "sigstop",
]
SYNTAX = " '\"\\=,.:;/@#%$&*?[]{}()<>|!~`+-_\n\t\r\x1baZ09é名"
"""Characters that quoting, splitting and parsing trip on."""
texts = st.one_of(
    st.sampled_from(NASTY_TEXT),
    st.text(st.characters(exclude_characters="\x00"), max_size=20),
    st.text(st.sampled_from(SYNTAX), max_size=12),
    SURROGATES,
)
"""Any argument text; no NUL, which no command line can carry."""

SAFE_NAMES = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,11}", fullmatch=True)
PATHS = st.one_of(
    SAFE_NAMES,
    st.sampled_from(
        [
            "",
            ".",
            "missing/deeper/file",
            "a-file",
            "a-dir",
            "binary.toml",
            "bad.toml",
            "x" * 300,
            "a\nb",
            "ü名",
            "a-file/below-a-file",
            "a\udcffb",
        ]
    ),
)
"""Relative paths only: a command's folder is a fresh temporary one, nothing outside it."""


def prepare_folder(folder: Path) -> None:
    (folder / "a-file").write_text("not a folder\n")
    (folder / "a-dir").mkdir()
    (folder / "binary.toml").write_bytes(b"\xff\xfe\x00[pool]\n")
    (folder / "bad.toml").write_text("[pool\nmin_blocks = = 1\n")


def numbers(kind: click.ParamType) -> st.SearchStrategy[str]:
    edges = ["0", "-1", "1", "-0", "2147483648", str(2**63), str(10**30), "1e400"]
    if isinstance(kind, click.FloatRange | type(click.FLOAT)):
        edges += ["nan", "inf", "-inf", "-0.5", "1e-400", "0.1"]
    if isinstance(kind, click.IntRange | click.FloatRange):
        edges += [str(kind.min), str(kind.max)] if kind.min is not None else []
    return st.one_of(
        st.sampled_from(edges),
        st.integers(-(10**6), 10**6).map(str),
        st.floats().map(str),
        texts,
    )


DURATION_TEXT = [
    "0",
    "0s",
    "-1s",
    "-0s",
    "1",
    "1.5",
    "30s",
    "500ms",
    "1m30s",
    "2h",
    "1.5ms",
    "0.0001ms",
    "1e3s",
    "inf",
    "nans",
    "1d",
    "1 s",
    "1S",
    "\u0661s",  # an Arabic-Indic digit one
    "9" * 40 + "h",
    "87600h",
    "87601h",
]
"""Durations at the edges of :mod:`allocator.core.durations`: zero, signs, bare numbers,
fractions finer than a microsecond, units it does not know, too long."""


def durations(kind: Duration) -> st.SearchStrategy[str]:
    edges = [str(kind.minimum), str(kind.maximum)]  # a timedelta's own text: not a duration
    return st.one_of(
        st.sampled_from(DURATION_TEXT + edges),
        st.tuples(st.integers(0, 10**6), st.sampled_from(["ms", "s", "m", "h"])).map(
            lambda pair: f"{pair[0]}{pair[1]}"
        ),
        texts,
    )


def plausible(param: click.Parameter) -> st.SearchStrategy[str]:
    """A value of the right type, often in range: gets past click to the command's checks."""
    kind = param.type
    if isinstance(kind, Duration):
        return durations(kind)
    if isinstance(kind, click.Choice):
        return st.sampled_from([str(choice) for choice in kind.choices])
    if isinstance(kind, click.IntRange):
        return st.integers(kind.min, kind.max).map(str)
    if isinstance(kind, click.FloatRange):
        return st.floats(kind.min, kind.max, allow_nan=False).map(str)
    if kind is click.INT:
        return st.integers(-5, 100).map(str)
    if kind is click.FLOAT:
        return st.sampled_from(["nan", "inf", "-inf", "-1", "0", "0.5", "1e400", "-0.0"])
    return value_for(param)


def value_for(param: click.Parameter) -> st.SearchStrategy[str]:
    kind = param.type
    if isinstance(kind, click.Choice):
        choices = [str(choice) for choice in kind.choices]
        return st.one_of(
            st.sampled_from(choices),
            st.sampled_from(choices).map(str.upper),
            st.sampled_from(choices).map(lambda c: f" {c}"),
            texts,
        )
    if isinstance(kind, click.Path | click.File):
        return PATHS
    if isinstance(kind, click.IntRange | click.FloatRange) or kind in (click.INT, click.FLOAT):
        return numbers(kind)
    if isinstance(kind, Duration):
        return durations(kind)
    return texts


UNKNOWN_OPTIONS = st.one_of(
    st.sampled_from(["--bogus", "-x", "--json=maybe", "---", "--x\ny", "--\u00e9", "-\udcff"]),
    texts.map(lambda text: f"--{text}"),
)


@st.composite
def argument_lists(draw: st.DrawFn, command: click.Command) -> list[str]:
    """Half well-formed (the command's own options, required ones included, values of the
    right type with nonsense among them: what gets past click), half anything."""
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    well_formed = draw(st.booleans())
    chosen = draw(st.lists(st.sampled_from(options), max_size=4)) if options else []
    if well_formed:
        chosen += [option for option in options if option.required]
    tokens: list[str] = []
    for option in chosen:
        name = draw(st.sampled_from([*option.opts, *option.secondary_opts]))
        if option.is_flag or option.count:
            tokens.append(name)
            continue
        value = draw(st.one_of(plausible(option), value_for(option)))
        if draw(st.booleans()) and name.startswith("--"):
            tokens.append(f"{name}={value}")
        else:
            tokens += [name, value]
    if not well_formed:
        for _ in range(draw(st.integers(0, 3))):
            position = draw(st.integers(0, len(tokens)))
            tokens.insert(position, draw(st.one_of(UNKNOWN_OPTIONS, texts)))
    for argument in arguments:
        if not well_formed and draw(st.integers(0, 4)) == 0:
            continue  # a missing argument
        position = draw(st.integers(0, len(tokens)))
        tokens.insert(position, draw(st.one_of(plausible(argument), value_for(argument))))
    return tokens


# -- the sandbox ---------------------------------------------------------------------------


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No ``ALLOCATOR_*``/``PG*`` variables; every way out raises :class:`Reached`."""
    clean_environment(monkeypatch)
    monkeypatch.setattr(psycopg, "connect", _reach)
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(_reach))
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(_reach))
    monkeypatch.setattr(KazooClient, "start", _reach)
    monkeypatch.setattr(LocalCluster, "_start_missing", _reach)
    monkeypatch.setattr(run_cmd, "build_node", _reach)
    monkeypatch.setattr(logs, "configure", _reach)
    monkeypatch.setattr(subprocess, "Popen", _reach)
    monkeypatch.setattr(urllib.request, "urlopen", _reach)
    return tmp_path


def run_in_fresh_folder(base: Path, args: list[str], counter: list[int]) -> None:
    counter[0] += 1
    folder = base / f"run-{counter[0]}"
    folder.mkdir()
    prepare_folder(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        try:
            result = invoke(args)
        except Reached as reached:
            check_reached(args, reached.params)
            return
    check_answer(result, args)


def check_reached(args: list[str], params: dict[str, Any]) -> None:
    """The command passed validation: what it would work with must make sense."""
    for name, value in params.items():
        shown = f"allocator {args!r}: --{name} = {value} reached the work"
        if isinstance(value, float):
            assert math.isfinite(value), shown
            assert value >= 0, shown
        if isinstance(value, timedelta):
            assert value >= timedelta(0), shown


@pytest.mark.parametrize(("path", "command"), LEAVES, ids=_ids(LEAVES))
def test_command_answers_bad_arguments(
    sandbox: Path, path: tuple[str, ...], command: click.Command
) -> None:
    counter = [0]

    @settings(max_examples=examples(PER_COMMAND))
    @given(args=argument_lists(command))
    def run(args: list[str]) -> None:
        run_in_fresh_folder(sandbox, [*path, *args], counter)

    run()


@pytest.mark.parametrize(("path", "group"), GROUPS, ids=_ids(GROUPS))
def test_group_answers_bad_commands(
    sandbox: Path, path: tuple[str, ...], group: click.Group
) -> None:
    names = sorted(group.commands)
    counter = [0]
    tokens = st.one_of(
        st.sampled_from(names),
        st.sampled_from(names).map(str.upper),
        st.sampled_from(["--help", "--version", "-h", "help", ""]),
        UNKNOWN_OPTIONS,
        texts,
    )

    @settings(max_examples=examples(PER_GROUP))
    @given(args=st.lists(tokens, max_size=3))
    def run(args: list[str]) -> None:
        run_in_fresh_folder(sandbox, [*path, *args], counter)

    run()


def test_every_command_is_fuzzed() -> None:
    """The walk finds every command the CLI registers, subcommands included."""
    names = {" ".join(path) for path, _ in LEAVES}
    assert {"decode", "claim", "run", "local up", "fence rebase", "bench claims"} <= names
    assert len(LEAVES) >= 27
