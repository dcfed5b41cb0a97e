"""Layers of the source, checked on its imports.

- DESIGN §1: the allocator core never imports ``jobs``; only the composition root does.
- Issue 20: click only under the CLI: nothing in ``allocator/config/`` imports it (the
  options that load the configuration are :mod:`allocator.commands.options`').
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "allocator"
COMPOSITION_ROOT = PACKAGE / "commands" / "run.py"
CONFIG_PACKAGE = PACKAGE / "config"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_composition_root_imports_jobs() -> None:
    importers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(name == "jobs" or name.startswith("jobs.") for name in imported_modules(path))
    )
    assert importers == [str(COMPOSITION_ROOT.relative_to(PACKAGE))]


def test_the_configuration_does_not_import_click() -> None:
    modules = sorted(CONFIG_PACKAGE.rglob("*.py"))
    assert modules, "the configuration package has moved: point CONFIG_PACKAGE at it"
    importers = sorted(
        str(path.relative_to(PACKAGE))
        for path in modules
        if any(name == "click" or name.startswith("click.") for name in imported_modules(path))
    )
    assert importers == []
