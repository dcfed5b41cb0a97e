"""docs/deploy.md as a test reads it: its shell blocks in order, the substitutions its table
states, and a systemd unit of the kit as the test starts it without systemd."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "deploy.md"
RUN, SYSTEMD, INSTALL = "sh", "sh systemd", "sh install"
"""The info strings of the blocks: run as written; what systemd does; never run."""

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    kind: str
    text: str


def blocks(markdown: str) -> list[Block]:
    """The guide's shell blocks (``sh``, ``sh systemd``, ``sh install``) in order."""
    return [
        Block(info.strip(), body)
        for info, body in _FENCE.findall(markdown)
        if info.strip() in (RUN, SYSTEMD, INSTALL)
    ]


def substitute(text: str, pairs: Sequence[tuple[str, str]]) -> str:
    """``text`` with every pair's first string replaced by its second, in order."""
    for old, new in pairs:
        text = text.replace(old, new)
    return text


def systemctl_lines(block: Block) -> list[list[str]]:
    """The commands of a ``sh systemd`` block (comments dropped), each ``systemctl`` or
    ``journalctl``: anything else is an error, so nothing in such a block goes unrun."""
    commands = []
    for line in block.text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] not in ("systemctl", "journalctl"):
            raise ValueError(f"a `sh systemd` block runs systemctl and journalctl only: {line}")
        commands.append(words)
    return commands


@dataclass
class Unit:
    """The [Service] lines of a unit file that starting it by hand needs."""

    environment: list[str] = field(default_factory=list)
    environment_files: list[str] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)
    state_directories: list[str] = field(default_factory=list)
    exec_start_pre: list[str] = field(default_factory=list)
    exec_start: list[str] = field(default_factory=list)


_KEYS = {
    "Environment": "environment",
    "EnvironmentFile": "environment_files",
    "LoadCredential": "credentials",
    "StateDirectory": "state_directories",
    "ExecStartPre": "exec_start_pre",
    "ExecStart": "exec_start",
}


def read_unit(path: Path) -> Unit:
    unit = Unit()
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        if section == "[Service]" and key in _KEYS:
            getattr(unit, _KEYS[key]).append(value)
    return unit


def expand(value: str, specifiers: Mapping[str, str]) -> str:
    """systemd's ``%x`` specifiers (``%%`` is a percent sign)."""

    def one(match: re.Match[str]) -> str:
        letter = match.group(1)
        if letter == "%":
            return "%"
        if letter not in specifiers:
            raise ValueError(f"specifier %{letter} is not known to the test")
        return specifiers[letter]

    return re.sub(r"%(.)", one, value)


def environment_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of an ``EnvironmentFile=`` (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip()
    return values
