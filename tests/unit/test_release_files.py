"""Issue 21, item 1: the distribution's own name, its licence, its changelog and its version.

Rules: the distribution is :data:`allocator.DISTRIBUTION` (the index's ``allocator`` is
another project) and its version is ``allocator.__version__``, which pyproject.toml reads;
LICENSE is the Apache License 2.0 the metadata names, byte for byte as the Apache Software
Foundation publishes it; CHANGELOG.md has one entry per release, newest first, the newest
being this version; ``allocator --version`` names the command, the version and the
distribution; every ``pip install`` in a shell block of the docs and the kits, and in the
Dockerfile, names the distribution, never ``allocator``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import tomllib
from datetime import date
from pathlib import Path

from click.testing import CliRunner
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from allocator import DISTRIBUTION, VERSION_MESSAGE, __version__, cli

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
"""https://www.apache.org/licenses/LICENSE-2.0.txt (Debian ships the same bytes as
/usr/share/common-licenses/Apache-2.0)."""
RELEASE = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2})$", re.M)
SHELL_BLOCK = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.M | re.S)


def test_pyproject_names_the_distribution_and_reads_the_version_from_the_package() -> None:
    project = PYPROJECT["project"]
    assert project["name"] == DISTRIBUTION
    assert project["dynamic"] == ["version"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "allocator.__version__"}
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]


def test_the_license_is_the_apache_license_2_0_unmodified() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256


def test_the_changelog_has_one_entry_per_release_newest_first_this_one_on_top() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = [
        (Version(m["version"]), date.fromisoformat(m["date"])) for m in RELEASE.finditer(text)
    ]
    assert releases, "CHANGELOG.md lists no release"
    assert releases[0][0] == Version(__version__)
    versions = [version for version, _ in releases]
    assert versions == sorted(set(versions), reverse=True)  # no repeats, newest first
    dates = [day for _, day in releases]
    assert dates == sorted(dates, reverse=True)


def test_version_names_the_command_the_version_and_the_distribution() -> None:
    result = CliRunner().invoke(cli.main, ["--version"])
    assert result.exit_code == 0, result.output
    fields = {"prog": "allocator", "version": __version__, "package": DISTRIBUTION}
    assert result.output == VERSION_MESSAGE % fields + "\n"
    assert DISTRIBUTION in result.output
    assert __version__ in result.output


def installed_names(command: str) -> list[str]:
    """The distributions a ``pip install`` command line names (paths and options skipped)."""
    words = shlex.split(command, comments=True)
    if "install" not in words or not any(w.endswith("pip") or w == "pip3" for w in words):
        return []
    names = []
    for word in words[words.index("install") + 1 :]:
        if word.startswith(("-", ".", "/")) or "/" in word.split("@")[0]:
            continue
        try:
            names.append(Requirement(word).name)
        except InvalidRequirement:
            continue
    return names


def pip_commands() -> list[tuple[str, str]]:
    """(file, command) for every pip command in a shell block of the docs and the kits, and
    in the Dockerfile's RUN instructions."""
    found = []
    for path in sorted([*ROOT.glob("docs/**/*.md"), *ROOT.glob("deploy/**/*.md")]):
        for block in SHELL_BLOCK.findall(path.read_text()):
            where = str(path.relative_to(ROOT))
            joined = block.replace("\\\n", " ")
            found += [(where, line) for line in joined.splitlines() if "pip" in line]
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for line in dockerfile.splitlines():
        for command in line.split("&&"):
            if "pip" in command:
                found.append(("Dockerfile", command.removeprefix("RUN ").strip()))
    return found


def test_every_pip_install_names_the_distribution_never_allocator() -> None:
    commands = pip_commands()
    named = [(where, name) for where, command in commands for name in installed_names(command)]
    assert ("docs/claiming-ids.md", DISTRIBUTION) in named  # the guide's install line is seen
    assert ("Dockerfile", DISTRIBUTION) in named
    wrong = [(where, name) for where, name in named if name.lower() == "allocator"]
    assert not wrong, f"pip install of the index's unrelated 'allocator': {wrong}"


def test_the_alerts_runbook_lives_at_the_projects_published_home() -> None:
    """The shipped runbook_url default points into the Repository the metadata names."""
    from allocator.alert_rules import DEFAULT_RUNBOOK

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert DEFAULT_RUNBOOK.startswith(urls["Repository"] + "/")
    assert DEFAULT_RUNBOOK.endswith("/docs/operations.md")
