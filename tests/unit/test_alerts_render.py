"""``allocator alerts render``: the shipped rules with their runbook links pointing at another
copy of the runbook, and nothing else changed (issue 21).

Rules: the rendered rules pass ``promtool check rules`` and the rules' own unit tests
rendered the same way; the rendered PrometheusRule, as an overlay's patch, replaces the
base's rules in ``kubectl kustomize``; a runbook URL that is not absolute http(s), and a
file that is not alert rules, are refused with one line (exit 2). promtool and kubectl
come from scripts/install-system-deps.sh: a missing one fails these tests, never skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from allocator import cli
from allocator.alert_rules import DEFAULT_RUNBOOK, runbook_links, with_runbook
from allocator.core.exits import Exit

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "allocator-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "allocator-alerts.test.yml"
K8S = ROOT / "deploy" / "k8s"
OURS = "https://wiki.example.com/allocator/operations"
EX_USAGE = Exit.USAGE


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: run scripts/install-system-deps.sh (Debian's {package})")
    return path


def render(*args: str) -> Result:
    return CliRunner().invoke(cli.main, ["alerts", "render", *args], env={})


def annotations(groups: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [rule["annotations"] for group in groups for rule in group["rules"]]


def test_only_the_runbook_links_change() -> None:
    text = RULES.read_text()
    rendered = with_runbook(text, OURS)
    before, after = text.splitlines(), rendered.splitlines()
    assert len(before) == len(after)
    changed = [(old, new) for old, new in zip(before, after, strict=True) if old != new]
    assert len(changed) == len(runbook_links(text)) > 0
    for old, new in changed:
        assert old.split("#")[-1] == new.split("#")[-1]  # the same anchor
        assert new.strip().startswith(f"runbook_url: {OURS}#")
    shipped = yaml.safe_load(text)["groups"]
    ours = yaml.safe_load(rendered)["groups"]
    for old_notes, new_notes in zip(annotations(shipped), annotations(ours), strict=True):
        anchor = old_notes["runbook_url"].removeprefix(f"{DEFAULT_RUNBOOK}#")
        assert new_notes == {**old_notes, "runbook_url": f"{OURS}#{anchor}"}


def test_rendering_the_default_back_gives_the_shipped_files() -> None:
    for path in (RULES, RULE_TESTS, K8S / "prometheusrule.yaml"):
        text = path.read_text()
        assert with_runbook(with_runbook(text, OURS), DEFAULT_RUNBOOK) == text, path


def test_rendered_rules_pass_promtool_and_their_unit_tests(tmp_path: Path) -> None:
    promtool = tool("promtool", "prometheus")
    for source in (RULES, RULE_TESTS):
        result = render("--runbook-base", OURS, str(source), "-o", str(tmp_path / source.name))
        assert result.exit_code == 0, result.output
    for args in (["check", "rules", RULES.name], ["test", "rules", RULE_TESTS.name]):
        done = subprocess.run(
            [promtool, *args], cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_rendered_prometheusrule_replaces_the_bases_rules_in_an_overlay(
    tmp_path: Path,
) -> None:
    kubectl = tool("kubectl", "kubernetes-client")
    overlay = tmp_path / "overlays" / "eu1"
    overlay.mkdir(parents=True)
    result = render(
        "--runbook-base",
        OURS,
        str(K8S / "prometheusrule.yaml"),
        "-o",
        str(overlay / "prometheusrule.yaml"),
    )
    assert result.exit_code == 0, result.output
    # bases: and patchesStrategicMerge: as kubectl 1.20's kustomize v2 takes them (newer ones
    # warn, and take them too; the README shows today's `patches:`).
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "nameSuffix": "-eu1",
                "bases": [os.path.relpath(K8S, overlay)],
                "patchesStrategicMerge": ["prometheusrule.yaml"],
            }
        )
    )
    done = subprocess.run(
        [kubectl, "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (rule,) = [doc for doc in yaml.safe_load_all(done.stdout) if doc["kind"] == "PrometheusRule"]
    assert rule["metadata"]["name"] == "allocator-eu1"
    shipped = yaml.safe_load(RULES.read_text())["groups"]
    assert len(annotations(rule["spec"]["groups"])) == len(annotations(shipped))
    for notes in annotations(rule["spec"]["groups"]):
        assert notes["runbook_url"].startswith(f"{OURS}#")


def test_the_rendered_rules_are_printed_without_output() -> None:
    result = render("--runbook-base", OURS, str(RULES))
    assert result.exit_code == 0, result.output
    assert result.stdout == with_runbook(RULES.read_text(), OURS)


@pytest.mark.parametrize(
    ("runbook", "message"),
    [
        ("docs/operations.md", "not an absolute http(s) URL"),
        ("ftp://docs.example.com/operations", "not an absolute http(s) URL"),
        ("https:///operations", "not an absolute http(s) URL"),
        ("https://wiki.example.com/ops#alerts", "has a '#'"),
        ("https://wiki.example.com/on call", "characters a URL may not hold"),
        ("https://wiki.example.com/{{ $labels.job }}", "characters a URL may not hold"),
        ("", "empty"),
    ],
)
def test_a_runbook_url_that_cannot_resolve_is_refused(runbook: str, message: str) -> None:
    result = render("--runbook-base", runbook, str(RULES))
    assert result.exit_code == EX_USAGE, result.output
    assert "--runbook-base" in result.output
    assert message in result.output
    assert "groups:" not in result.output


def test_what_is_not_alert_rules_is_refused(tmp_path: Path) -> None:
    no_anchor = tmp_path / "no-anchor.yml"
    no_anchor.write_text("groups:\n  - rules:\n      - annotations:\n          runbook_url: x\n")
    cases = {
        ROOT / "README.md": "no runbook_url in it",
        tmp_path / "missing.yml": "cannot read it",
        no_anchor: "line 4: a runbook_url without an #anchor",
    }
    for path, message in cases.items():
        result = render("--runbook-base", OURS, str(path))
        assert result.exit_code == EX_USAGE, result.output
        assert result.stderr.count("\n") == 1
        assert message in result.stderr
    result = render("--runbook-base", OURS, str(RULES), "-o", str(tmp_path / "no" / "dir.yml"))
    assert result.exit_code == EX_USAGE, result.output
    assert "cannot write it" in result.stderr
