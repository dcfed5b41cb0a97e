"""deploy/systemd/: the units pass ``systemd-analyze verify``; the example configuration is one
a node runs with; every name in the kit is real.

Rules:

- ``systemd-analyze verify`` (Debian's ``systemd``, installed by
  ``scripts/install-system-deps.sh``) runs offline, without systemd as PID 1, on a scratch
  root (``--root``) holding the units, copies of the system's targets and slices (what a
  service depends on by default) and an executable stand-in for
  ``/opt/allocator/bin/allocator`` (verify checks every ``Exec*=`` binary). It passes only
  with exit 0 and no output at all: systemd reports an unknown or malformed setting as a
  warning and still exits 0. A broken copy of the unit is fed to it too, so a verify that
  finds nothing cannot pass. A missing ``systemd-analyze`` fails the test, never skips it.
- The example ``allocator.toml`` is loaded with ``node1.env`` and the unit's own
  ``Environment=`` lines (specifiers resolved as systemd would for ``allocator@node1``, the
  credentials directory a temporary folder holding made-up secrets) by the project's
  loader, and the same environment, with no other ``ALLOCATOR_*`` or ``PG*`` variable,
  passes ``allocator config check`` (offline: no ``--database``): exit 0, no warning.
- Every ``ALLOCATOR_*`` name anywhere in the kit is a configuration key's variable, a
  secret's ``*_FILE`` or ``ALLOCATOR_CONFIG``; every credential a unit loads is made by
  the README's commands; every ``deploy/systemd/`` file the README installs exists.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from allocator import cli
from allocator.config import (
    CONFIG_PATH_ENV,
    KEYS,
    env_name,
    load_config,
    secret_file_env,
)
from tests.deploy_env import NODE_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "deploy" / "systemd"
NODE_UNIT = KIT / "allocator@.service"
MIGRATE_UNIT = KIT / "allocator-migrate.service"
EXAMPLE_TOML = KIT / "allocator.toml"
NODE_ENV = KIT / "node1.env"
README = KIT / "README.md"
INSTANCE = "node1"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")
ALLOCATOR_BIN = "opt/allocator/bin/allocator"
VARIABLE = re.compile(r"\bALLOCATOR_[A-Z0-9_]*[A-Z0-9]\b")
ASSIGNMENT = re.compile(r"^#?\s*(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")
SPECIFIER = re.compile(r"%.")


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is missing: run scripts/install-system-deps.sh (systemd)")
    return found


def unit_settings(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of every setting of a unit file, in order."""
    settings: list[tuple[str, str, str]] = []
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.append((section, key.strip(), value.strip()))
    return settings


def unit_values(path: Path, key: str) -> list[str]:
    return [value for _, name, value in unit_settings(path) if name == key]


def resolve(text: str, credentials: Path) -> str:
    """``text`` with the specifiers this kit uses resolved as systemd would for the
    instance ``node1`` of a system unit."""
    known = {
        "%i": INSTANCE,
        "%S": "/var/lib",
        "%d": str(credentials),
        "%n": f"allocator@{INSTANCE}.service",
    }

    def one(match: re.Match[str]) -> str:
        if match[0] not in known:
            pytest.fail(f"unexpected specifier {match[0]} in {text!r}")
        return known[match[0]]

    return SPECIFIER.sub(one, text)


def env_file(path: Path) -> dict[str, str]:
    """The assignments of an EnvironmentFile= (comments skipped)."""
    result: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            result[name.strip()] = value.strip().strip('"')
    return result


def credentials_loaded(unit: Path) -> dict[str, str]:
    """LoadCredential= of ``unit``: credential name -> source path."""
    pairs = (value.split(":", 1) for value in unit_values(unit, "LoadCredential"))
    return dict(pairs)


def node_environment(credentials: Path) -> dict[str, str]:
    """What ``allocator@node1``'s processes get: the unit's Environment= lines, then its
    EnvironmentFile= (which wins), with made-up secrets in the credentials folder."""
    credentials.mkdir()
    made_up = {
        "zookeeper-auth": f"allocator:{secrets.token_hex(16)}",
        "admin-token": secrets.token_hex(32),
        "pgpass": f"*:*:allocator:allocator_node_login:{secrets.token_hex(16)}",
    }
    assert set(credentials_loaded(NODE_UNIT)) == set(made_up)
    for name, value in made_up.items():
        (credentials / name).write_text(value + "\n")
    env: dict[str, str] = {}
    for value in unit_values(NODE_UNIT, "Environment"):
        for assignment in shlex.split(value):
            name, _, text = assignment.partition("=")
            env[name] = resolve(text, credentials)
    files = unit_values(NODE_UNIT, "EnvironmentFile")
    assert files == ["/etc/allocator/%i.env"]
    env.update(env_file(NODE_ENV))
    return env


@pytest.fixture(scope="module")
def scratch_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root for ``systemd-analyze --root``: the system's targets and slices (what a
    service depends on by default), our units, and a stand-in for the virtualenv's
    ``allocator``."""
    system_units = sorted(SYSTEM_UNITS.glob("*.target")) + sorted(SYSTEM_UNITS.glob("*.slice"))
    if not system_units:
        pytest.fail(f"{SYSTEM_UNITS} is missing: run scripts/install-system-deps.sh (systemd)")
    root = tmp_path_factory.mktemp("root")
    system = root / SYSTEM_UNITS.relative_to("/")
    system.mkdir(parents=True)
    for unit in system_units:
        shutil.copy(unit, system / unit.name, follow_symlinks=False)
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    for unit in (NODE_UNIT, MIGRATE_UNIT):
        shutil.copy(unit, units / unit.name)
    stand_in = root / ALLOCATOR_BIN
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    return root


def verify(root: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [systemd_analyze(), "verify", f"--root={root}", *units],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_units_pass_systemd_analyze_verify(scratch_root: Path) -> None:
    result = verify(scratch_root, f"allocator@{INSTANCE}.service", MIGRATE_UNIT.name)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_verify_reports_a_broken_unit_and_a_missing_binary(scratch_root: Path) -> None:
    units = scratch_root / "etc" / "systemd" / "system"
    text = NODE_UNIT.read_text()
    (units / "broken@.service").write_text(text.replace("KillSignal=", "KillSignall="))
    result = verify(scratch_root, f"broken@{INSTANCE}.service")
    assert "Unknown key 'KillSignall'" in result.stderr

    (units / "absent@.service").write_text(text.replace("bin/allocator", "bin/absent"))
    result = verify(scratch_root, f"absent@{INSTANCE}.service")
    assert result.returncode != 0
    assert "/opt/allocator/bin/absent is not executable" in result.stderr


def test_example_config_loads_as_the_node_unit_gives_it(tmp_path: Path) -> None:
    env = node_environment(tmp_path / "credentials")
    assert env[CONFIG_PATH_ENV] == "/etc/allocator/allocator.toml"
    config = load_config(EXAMPLE_TOML, env={k: v for k, v in env.items() if k != CONFIG_PATH_ENV})
    assert config.node.name == INSTANCE
    assert config.node.state_dir == f"/var/lib/allocator/{INSTANCE}"
    assert config.node.log_format == "json"
    assert config.zookeeper.auth.get_secret_value().startswith("allocator:")
    assert len(config.node.admin_token.get_secret_value()) == 64
    assert not config.zookeeper.insecure
    # The password comes from libpq's password file, never from the shared file.
    assert ":" not in config.postgres.url.get_secret_value().split("://")[1].split("@")[0]
    assert env["PGPASSFILE"] == str(tmp_path / "credentials" / "pgpass")
    # A node asked to stop finishes before systemd's SIGKILL.
    (timeout_stop,) = unit_values(NODE_UNIT, "TimeoutStopSec")
    assert config.node.shutdown_timeout_s < float(timeout_stop)


def test_example_config_passes_config_check_as_the_node_unit_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith(("ALLOCATOR_", "PG")):
            monkeypatch.delenv(name)
    env = node_environment(tmp_path / "credentials")
    env[CONFIG_PATH_ENV] = str(EXAMPLE_TOML)
    result = CliRunner().invoke(cli.main, ["config", "check"], env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""  # no warning: a node would run with this, with ACLs
    assert "# configuration is valid" in result.stdout
    # The unit checks the same before every start, and runs the node from the same place.
    assert unit_values(NODE_UNIT, "ExecStartPre") == ["/opt/allocator/bin/allocator run --check"]
    assert unit_values(NODE_UNIT, "ExecStart") == ["/opt/allocator/bin/allocator run"]


def test_every_allocator_variable_in_the_kit_is_a_real_name() -> None:
    real = NODE_VARIABLES
    for path in sorted(KIT.iterdir()):
        used = set(VARIABLE.findall(path.read_text()))
        assert used <= real, f"{path.name}: {sorted(used - real)}"
    # The example env file sets (or shows, commented out) only configuration keys.
    shown = [
        m["name"] for line in NODE_ENV.read_text().splitlines() if (m := ASSIGNMENT.match(line))
    ]
    assert shown
    assert set(shown) <= {env_name(key) for key in KEYS}


def test_units_hand_every_secret_over_as_a_credential_file() -> None:
    loaded = credentials_loaded(NODE_UNIT)
    env_lines = unit_values(NODE_UNIT, "Environment")
    for key, name in (("zookeeper.auth", "zookeeper-auth"), ("node.admin_token", "admin-token")):
        assert f"{secret_file_env(key)}=%d/{name}" in env_lines
        assert name in loaded
    assert "PGPASSFILE=%d/pgpass" in env_lines
    # No secret value is set in a unit or an example file.
    for path in (NODE_UNIT, MIGRATE_UNIT, NODE_ENV):
        text = path.read_text()
        assert not re.search(r"^(?!#).*\bALLOCATOR_(ZOOKEEPER_AUTH|NODE_ADMIN_TOKEN)=", text, re.M)
    example = tomllib.loads(EXAMPLE_TOML.read_text())
    assert "auth" not in example["zookeeper"]
    assert "admin_token" not in example["node"]
    migrate = credentials_loaded(MIGRATE_UNIT)
    assert list(migrate) == ["migrate-database-url"]
    (start,) = unit_values(MIGRATE_UNIT, "ExecStart")
    assert shlex.split(start) == [
        "/opt/allocator/bin/allocator",
        "migrate",
        "--database-url-file",
        "%d/migrate-database-url",
    ]


def test_readme_makes_every_credential_and_installs_files_that_exist() -> None:
    readme = README.read_text()
    made = set(re.findall(r"> /etc/allocator/credentials/([\w-]+)", readme))
    for unit in (NODE_UNIT, MIGRATE_UNIT):
        for name, source in credentials_loaded(unit).items():
            assert source == f"/etc/allocator/credentials/{name}"
            assert name in made, f"the README never makes the credential {name}"
    installed = set(re.findall(r"deploy/systemd/([\w@.-]+[\w])", readme))
    assert {NODE_UNIT.name, MIGRATE_UNIT.name, EXAMPLE_TOML.name, NODE_ENV.name} <= installed
    for name in installed:
        assert (KIT / name).is_file(), name
    for needed in ("useradd --system", "python3 -m venv /opt/allocator", "allocator-migrate"):
        assert needed in readme
    assert f"systemctl enable --now allocator@{INSTANCE}" in readme


OPERATOR_SHELLS = (README, ROOT / "docs" / "operations.md", ROOT / "docs" / "deploy.md")
"""The pages that tell an operator how to set up a shell on a node's host."""


def operator_exports(page: Path) -> dict[str, str]:
    """The ``export NAME=value`` lines of the ``sh`` block that sets ``ALLOCATOR_CONFIG``."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", page.read_text(), re.S | re.M)
    (block,) = (b for b in blocks if "export ALLOCATOR_CONFIG=" in b)
    return dict(re.findall(r"^export (\w+)=(\S+)$", block, re.M))


@pytest.mark.parametrize("page", OPERATOR_SHELLS, ids=lambda p: p.name)
def test_the_operator_shell_has_every_secret_the_node_unit_hands_over(page: Path) -> None:
    """Issue 24: operators were told of the ZooKeeper and admin-token files but not of
    pgpass, so `allocator status` logged in without a password. Every variable the node
    unit points at a credential (``%d/<name>``) is exported, pointing at the same file in
    /etc/allocator/credentials/."""
    exports = operator_exports(page)
    handed = {
        name: value
        for line in unit_values(NODE_UNIT, "Environment")
        for name, _, value in [line.partition("=")]
        if value.startswith("%d/")
    }
    assert set(handed) == {
        "ALLOCATOR_ZOOKEEPER_AUTH_FILE",
        "ALLOCATOR_NODE_ADMIN_TOKEN_FILE",
        "PGPASSFILE",
    }
    loaded = credentials_loaded(NODE_UNIT)
    for name, value in handed.items():
        assert exports.get(name) == loaded[value.removeprefix("%d/")], (page.name, name)
    assert exports["ALLOCATOR_CONFIG"] == "/etc/allocator/allocator.toml"


def sql_statements(text: str) -> list[str]:
    """The SQL statements of ``text`` without comments, ``SET``s, psql's ``\\`` commands and
    ``PASSWORD`` clauses, whitespace collapsed: what a database's roles come out as."""
    kept = (
        line
        for line in text.splitlines()
        if not line.lstrip().startswith(("--", "\\")) and not line.startswith("SET ")
    )
    joined = re.sub(r"\s+PASSWORD '[^']*'", "", " ".join(kept))
    return [" ".join(s.split()) for s in joined.split(";") if s.strip()]


def test_the_readme_s_database_steps_are_the_guide_s_which_run_on_each_version() -> None:
    """The README's superuser SQL makes the roles and the database exactly as docs/deploy.md's
    block does; that block runs on PostgreSQL 15 (test_deploy_guide.py), 16 and 18
    (test_postgres_versions.py), so these steps are tested there too."""
    readme_blocks = re.findall(r"^```sql\n(.*?)^```$", README.read_text(), re.S | re.M)
    (readme,) = (b for b in readme_blocks if "CREATE ROLE allocator_owner" in b)
    guide_text = (ROOT / "docs" / "deploy.md").read_text()
    heredocs = re.findall(r"<<SQL\n(.*?)^SQL$", guide_text, re.S | re.M)
    (guide,) = (h for h in heredocs if "CREATE ROLE allocator_owner" in h)
    assert "CREATE ROLE allocator_migrator LOGIN IN ROLE allocator_owner" in sql_statements(readme)
    assert sql_statements(readme) == sql_statements(guide)
