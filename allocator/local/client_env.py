"""The environment that points the CLI at an embedded cluster (``allocator local env``)."""

from __future__ import annotations

import contextlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator import config as config_mod
from allocator.core import files
from allocator.core.errors import LocalClusterError
from allocator.local.folder import SECRETS_DIR
from allocator.local.info import ClusterInfo

STATE_DIR_ENV = "ALLOCATOR_LOCAL_STATE_DIR"
CLAIM_URL_ENV = "ALLOCATOR_CLAIM_DATABASE_URL"
ZK_AUTH_FILE = "zookeeper-auth"
ADMIN_TOKEN_FILE = "admin-token"  # noqa: S105 (a file name)
# Variables that would win over ours or clash with them: a production file's keys would mix
# in (ALLOCATOR_CONFIG); a secret's value and its _FILE together are an error.
UNSET = (
    config_mod.CONFIG_PATH_ENV,
    config_mod.env_name("zookeeper.auth"),
    config_mod.env_name("node.admin_token"),
    config_mod.secret_file_env("postgres.url"),
    CLAIM_URL_ENV + "_FILE",
)


@dataclass(frozen=True)
class ClientEnv:
    """What ``allocator local env`` prints: variables to export, and variables to unset."""

    state_dir: Path
    running: bool
    variables: dict[str, str]
    unset: tuple[str, ...] = UNSET

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form: state folder, running, variables and those to unset."""
        return {
            "state_dir": str(self.state_dir),
            "running": self.running,
            "variables": self.variables,
            "unset": list(self.unset),
        }

    def shell(self) -> list[str]:
        """POSIX shell lines for ``eval``: a comment, ``unset``, then one ``export`` each."""
        return [
            f'# allocator local cluster in {self.state_dir}: eval "$(allocator local env)"',
            f"unset {' '.join(self.unset)}",
            *(f"export {name}={shlex.quote(value)}" for name, value in self.variables.items()),
        ]


def client_env(info: ClusterInfo) -> ClientEnv:
    """The environment of the cluster ``info`` describes; writes its secret files.

    ZooKeeper hosts (the ensemble plus the nodes' chroot); ``ALLOCATOR_POSTGRES_URL`` as the
    nodes' login role (what ``status``, ``watch`` and ``fence status`` read);
    ``ALLOCATOR_CLAIM_DATABASE_URL`` as ``allocator_app``, a consumer (``claim``);
    ``ALLOCATOR_LOCAL_STATE_DIR``, so every ``allocator local`` command of that shell acts on
    this cluster. No secret value is ever among them: the ZooKeeper identity and the admin
    token are written to files in ``<state>/secrets/`` (:func:`write_secret`) and named by
    ``*_FILE`` variables; the URLs carry no password (``trust`` on loopback). Every path is
    absolute, so the exports work from any folder. ``local down --purge`` removes the files."""
    state_dir = info.state_dir.resolve()
    variables = {
        STATE_DIR_ENV: str(state_dir),
        config_mod.env_name("zookeeper.hosts"): info.node_zk_hosts,
        config_mod.env_name("postgres.url"): info.node_database_url,
        CLAIM_URL_ENV: info.consumer_database_url,
    }
    secrets = {
        "zookeeper.auth": (ZK_AUTH_FILE, info.zk_auth),
        "node.admin_token": (ADMIN_TOKEN_FILE, info.admin_token),
    }
    for key, (name, value) in secrets.items():
        if not value:
            continue
        path = state_dir / SECRETS_DIR / name
        try:
            write_secret(path, value)
        except OSError as exc:
            raise LocalClusterError(f"cannot write {path}: {exc.strerror or exc}") from exc
        variables[config_mod.secret_file_env(key)] = str(path)
    return ClientEnv(state_dir, info.running, variables)


def write_secret(path: Path, value: str) -> Path:
    """``value`` (and a line break) in ``path``, mode 0600 in a folder of mode 0700, replaced
    atomically; left alone when it already holds exactly that."""
    text = value + "\n"
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == text and path.stat().st_mode & 0o077 == 0:
            return path
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.parent.chmod(0o700)
    return files.write_atomic(path, text.encode("utf-8"), mode=files.PRIVATE_MODE)
