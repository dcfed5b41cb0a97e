"""One admin port: every kit, every doc and the configuration's default name the same one.

Rules:

- The admin port is the port of ``node.admin_address``'s default in the configuration model.
- Every place the Dockerfile, a file under deploy/ or docs/ names the admin server's port
  (an admin address, its variable or a Kubernetes env entry's value below it; a URL of an
  admin endpoint; a Prometheus target; ``EXPOSE``; ``containerPort``; the Service's
  ``admin`` port; "admin port N") names that port, or a host port the compose file
  publishes it on (its nodes share one host, so each gets its own).
- Nothing there names 9100: that is Prometheus node_exporter's port, which a node's host
  often runs; the admin server sharing it is a scrape of the wrong process.
- README.md is not scanned yet: its first screen is being rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from allocator.config.sections import NodeConfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yml"
TEXT_SUFFIXES = {".md", ".yml", ".yaml", ".env", ".toml", ".service", ".sh", ".json", ""}
NODE_EXPORTER_PORT = 9100

# Each names the admin port in its first group. Case-insensitive.
HOST = r"[\w.\]\)>-]"
MENTIONS = (
    # A URL of an admin endpoint, e.g. http://10.0.0.5:8470/status, or the API proxy's.
    HOST + r":(\d+)/(?:healthz|readyz|metrics|status|cluster|step-down|proxy)\b",
    r"\bEXPOSE\s+(\d+)",
    r"\bcontainerPort:\s*(\d+)",
    r"-\s*name:\s*admin\s*\n\s*port:\s*(\d+)",
    r"\badmin (?:HTTP server )?(?:on )?port (\d+)",
)
# Each matches a stretch of text in which every host:port is an admin address: the key,
# its variable (with a Kubernetes env entry's value on the next line), a Prometheus target
# list.
ADDRESS_LINES = (
    r"admin_address\b[^\n]*(?:\n\s*value:[^\n]*)?",
    r"\btargets:[^\n]*",
)
HOST_PORT = HOST + r":(\d+)\b"


def admin_port() -> int:
    default = NodeConfig.model_fields["admin_address"].default
    return int(default.rpartition(":")[2])


def scanned_files() -> list[Path]:
    files = [ROOT / "Dockerfile", ROOT / "README.md"]
    for folder in (ROOT / "deploy", ROOT / "docs"):
        files += sorted(
            path for path in folder.rglob("*") if path.is_file() and path.suffix in TEXT_SUFFIXES
        )
    return files


def named_admin_ports(text: str) -> Iterator[tuple[int, str]]:
    """Every admin port ``text`` names, each with the line it is on."""
    for pattern in MENTIONS:
        for match in re.finditer(pattern, text, flags=re.IGNORECASE):
            yield int(match.group(1)), _line_at(text, match.start(1))
    for pattern in ADDRESS_LINES:
        for stretch in re.finditer(pattern, text, flags=re.IGNORECASE):
            for match in re.finditer(HOST_PORT, stretch.group(0)):
                yield int(match.group(1)), _line_at(text, stretch.start() + match.start(1))


def _line_at(text: str, offset: int) -> str:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return text[start : end if end != -1 else len(text)].strip()


def compose_host_ports() -> set[int]:
    """Host ports the compose file publishes a node's admin port on."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    published = set()
    for service in services.values():
        if "ALLOCATOR_NODE_ADMIN_ADDRESS" not in (service.get("environment") or {}):
            continue
        for mapping in service.get("ports", []):
            host, _, container = str(mapping).rpartition(":")
            assert int(container) == admin_port(), f"a node publishes {mapping}"
            published.add(int(host.rpartition(":")[2]))
    return published


def test_the_default_is_not_node_exporters_port() -> None:
    assert admin_port() != NODE_EXPORTER_PORT


def test_the_scan_finds_every_kind_of_mention() -> None:
    """The patterns have teeth: each finds the port in a line shaped like the kits'."""
    samples = {
        "ALLOCATOR_NODE_ADMIN_ADDRESS=0.0.0.0:1234": {1234},
        'admin_address = "10.0.0.5:1234"   # or "0.0.0.0:1235"': {1234, 1235},
        '- name: ALLOCATOR_NODE_ADMIN_ADDRESS\n  value: "$(POD_IP):1234"': {1234},
        "curl -s http://<node>:1234/healthz": {1234},
        "`/api/v1/namespaces/<ns>/pods/allocator-0:1234/proxy/`": {1234},
        "EXPOSE 1234": {1234},
        "containerPort: 1234": {1234},
        "- name: admin\n  port: 1234": {1234},
        "probes on the admin port 1234": {1234},
        '- targets: ["node-1:1234", "node-2:1234"]': {1234},
    }
    for sample, ports in samples.items():
        assert {found for found, _ in named_admin_ports(sample)} == ports, sample


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_kit_and_doc_names_the_configured_admin_port(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    allowed = {admin_port(), *compose_host_ports()}
    wrong = [f"{port}: {line}" for port, line in named_admin_ports(text) if port not in allowed]
    assert not wrong, f"{path.relative_to(ROOT)} names another admin port than {admin_port()}"
    assert not re.search(rf"(?<!\d){NODE_EXPORTER_PORT}(?!\d)", text), (
        f"{path.relative_to(ROOT)} names node_exporter's port {NODE_EXPORTER_PORT}"
    )


def test_the_kits_name_the_admin_port_where_expected() -> None:
    """The scan sees the port in each kit (a renamed key would otherwise hide a mention)."""
    seen = {
        path.relative_to(ROOT).as_posix()
        for path in scanned_files()
        if any(port == admin_port() for port, _ in named_admin_ports(path.read_text()))
    }
    assert {
        "Dockerfile",
        "deploy/compose/docker-compose.yml",
        "deploy/compose/prometheus/prometheus.yml",
        "deploy/k8s/statefulset.yaml",
        "deploy/k8s/service.yaml",
        "deploy/systemd/node1.env",
        "docs/admin-http.md",
        "docs/operations.md",
    } <= seen
