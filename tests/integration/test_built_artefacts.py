"""Issue 21, item 2: the built artefacts work outside the tree.

The sdist and the wheel (built once per session, :mod:`tests.fixtures.artefacts`) pass
``twine check --strict`` and say what they are: this distribution's name and version, its
licence and its requirements. The wheel, installed with the ``node`` extra into a fresh
virtual environment outside the checkout (not editable; dependencies from a local wheelhouse
alone), then does the whole job with nothing else importable: ``allocator migrate`` on an
empty database, one ``allocator run`` node that leads and cuts, and a claim through the
Python client over a consumer role, which gets an ID of a block that node cut.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from packaging.metadata import Metadata
from packaging.requirements import Requirement

from allocator import DISTRIBUTION, VERSION_MESSAGE, __version__
from allocator.local.nodes import node_env
from allocator.local.tcp_ports import pick_free_ports
from allocator.postgres import migrate
from tests.fixtures import zk
from tests.fixtures.artefacts import ROOT, Artefacts, Popen, Venv, run
from tests.fixtures.nodes import DEADLINE_S, SESSION_TIMEOUT_MS, wait_for
from tests.fixtures.pg import consumer_login

pytestmark = pytest.mark.integration

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
STEM = f"{DISTRIBUTION.replace('-', '_')}-{__version__}"
NODE_NAME = "wheel-node"
CONSUMER = "built-artefacts"
FAST = {
    "ALLOCATOR_POOL_MIN_BLOCKS": "40",
    "ALLOCATOR_POOL_LOW_WATERMARK_BLOCKS": "10",
    "ALLOCATOR_POOL_REFILL_INTERVAL_S": "0.2",
    "ALLOCATOR_POOL_SAMPLE_INTERVAL_S": "0.5",
}


def expected_requirements() -> set[Requirement]:
    """pyproject.toml's requirements: the base ones, and the node extra's under its marker."""
    base = {Requirement(text) for text in PROJECT["dependencies"]}
    node = PROJECT["optional-dependencies"]["node"]
    return base | {Requirement(f'{text}; extra == "node"') for text in node}


def check_metadata(text: str) -> Metadata:
    meta = Metadata.from_email(text)  # validates every field it reads
    assert meta.name == DISTRIBUTION
    assert str(meta.version) == __version__
    assert meta.license_expression == "Apache-2.0"
    assert meta.license_files == ["LICENSE"]
    assert str(meta.requires_python) == ">=3.11"
    needed = {
        requirement
        for requirement in meta.requires_dist or []
        if requirement.marker is None or requirement.marker.evaluate({"extra": "node"})
    }
    assert needed == expected_requirements()  # the client's, and the node's under its extra
    assert "node" in (meta.provides_extra or [])
    return meta


def test_the_sdist_and_the_wheel_say_what_they_are(artefacts: Artefacts) -> None:
    assert artefacts.sdist.name == f"{STEM}.tar.gz"
    assert artefacts.wheel.name == f"{STEM}-py3-none-any.whl"
    twine = [sys.executable, "-m", "twine", "check", "--strict"]
    run([*twine, str(artefacts.sdist), str(artefacts.wheel)], cwd=artefacts.wheel.parent)
    license_text = (ROOT / "LICENSE").read_bytes()

    with zipfile.ZipFile(artefacts.wheel) as wheel:
        names = wheel.namelist()
        check_metadata(wheel.read(f"{STEM}.dist-info/METADATA").decode())
        assert wheel.read(f"{STEM}.dist-info/licenses/LICENSE") == license_text
    assert {name.split("/", 1)[0] for name in names} == {"allocator", "jobs", f"{STEM}.dist-info"}
    assert "allocator/migrations/sql/0001/tables.sql" in names
    assert "allocator/py.typed" in names

    with tarfile.open(artefacts.sdist) as sdist:
        members = {member.name for member in sdist.getmembers()}
        pkg_info = sdist.extractfile(f"{STEM}/PKG-INFO")
        assert pkg_info is not None
        check_metadata(pkg_info.read().decode())
        license_file = sdist.extractfile(f"{STEM}/LICENSE")
        assert license_file is not None
        assert license_file.read() == license_text
    assert {f"{STEM}/pyproject.toml", f"{STEM}/migrations/sql/0001/tables.sql"} <= members
    assert not [name for name in members if name.startswith(f"{STEM}/tests/")]


@pytest.fixture(scope="module")
def node_install(artefacts: Artefacts, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    env = Venv.create(tmp_path_factory.mktemp("wheel-node"))
    env.install(artefacts, "[node]")
    return env


@contextlib.contextmanager
def running_node(install: Venv, db_url: str, zk_hosts: str, log: Path) -> Iterator[Popen]:
    """``allocator run`` of the install, configured as a deployment would be (variables);
    stopped (SIGTERM, then SIGKILL to its own process group) if the test did not stop it."""
    env = node_env(
        name=NODE_NAME,
        zk_hosts=zk_hosts,
        postgres_url=db_url,
        admin_port=pick_free_ports(1)[0],
        admin_token=secrets.token_hex(16),
        zk_auth=zk.ZK_AUTH,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        state_dir=install.folder / "state",
        extra=FAST,
    )
    with log.open("wb") as out:
        node = install.start("allocator", "run", env=env, log=out)
    try:
        yield node
    finally:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(DEADLINE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.pid, signal.SIGKILL)
                node.wait(DEADLINE_S)


def pool_and_fence(db_url: str) -> tuple[int, int, str | None]:
    """(available blocks, the fence's epoch, its holder)."""
    with psycopg.connect(db_url) as conn:
        available = conn.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()
        fence = conn.execute("SELECT epoch, holder FROM allocator.fence").fetchone()
    assert available is not None
    assert fence is not None
    return int(available[0]), int(fence[0]), fence[1]


CLAIM = """
import json, sys
import allocator
from allocator.client import IdClient

with IdClient(sys.argv[1], sys.argv[2]) as client:
    first = client.next_id()
print(json.dumps({"id": first, "file": allocator.__file__}))
"""


def test_the_installed_wheel_migrates_runs_a_node_and_serves_a_claim(
    node_install: Venv, empty_db_url: str, zk_hosts: str, tmp_path: Path
) -> None:
    version = node_install.command("allocator", "--version").stdout
    fields = {"prog": "allocator", "version": __version__, "package": DISTRIBUTION}
    assert version == VERSION_MESSAGE % fields + "\n"

    assert migrate.current_revision(empty_db_url) is None
    node_install.command("allocator", "migrate", "--database-url", empty_db_url)
    assert migrate.current_revision(empty_db_url) == migrate.head_revision()  # the checkout's

    log = tmp_path / "node.log"
    with running_node(node_install, empty_db_url, zk_hosts, log) as node:

        def cut() -> tuple[int, int, str | None] | None:
            assert node.poll() is None, f"the node exited {node.returncode}:\n{log.read_text()}"
            reading = pool_and_fence(empty_db_url)
            return reading if reading[0] > 0 else None

        _, epoch, holder = wait_for(cut, "the installed node to cut blocks")
        assert holder == NODE_NAME
        with consumer_login(empty_db_url, "wheel_app") as consumer_url:
            answer = json.loads(node_install.run(CLAIM, consumer_url, CONSUMER).stdout)
        assert Path(answer["file"]).is_relative_to(node_install.site)
        node.send_signal(signal.SIGTERM)
        assert node.wait(DEADLINE_S) == 0, log.read_text()

    with psycopg.connect(empty_db_url) as conn:
        block = conn.execute(
            "SELECT epoch, claimed_by FROM allocator.block_ledger"
            " WHERE %s BETWEEN first_id AND last_id",
            (answer["id"],),
        ).fetchone()
    assert block == (epoch, CONSUMER)  # a block that node cut, claimed by the client
