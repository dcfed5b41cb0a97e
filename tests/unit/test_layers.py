"""Layers of the source, checked on its imports (issue 20; docs/architecture.md draws them).

Every module of ``allocator`` and ``jobs`` sits in one layer; a module imports only from
its own layer or one below (imports inside functions count too), the core imports no I/O
library, click lives only in the CLI, and no two modules import each other, directly or
round a longer loop. ALLOWED lists the exceptions with the reason for each: none today.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the domain: values and rules, no I/O library
    ("core", ("allocator", "allocator.core", "allocator.fence", "allocator.fence.report")),
    ("config", ("allocator.config",)),
    # what talks to PostgreSQL, ZooKeeper, HTTP, Prometheus and the state folder
    (
        "adapters",
        (
            "allocator.postgres",
            "allocator.zookeeper",
            "allocator.fence.znodes",
            "allocator.http",
            "allocator.metrics",
            "allocator.session",
        ),
    ),
    # applications use the client alone: the core's errors and the driver's translation
    ("client", ("allocator.client",)),
    # operators' procedures, without click
    ("procedures", ("allocator.fence.rebase", "allocator.pool", "allocator.cluster_status")),
    ("node", ("allocator.node",)),
    ("jobs", ("jobs",)),
    # the embedded cluster, drills and benches: tooling behind the CLI
    ("tooling", ("allocator.local", "allocator.drill", "allocator.bench")),
    ("cli", ("allocator.commands", "allocator.cli", "allocator.console")),
)
IO_LIBRARIES = ("kazoo", "psycopg", "psycopg_pool", "click", "apscheduler", "sqlalchemy", "alembic")
ALLOWED: dict[tuple[str, str], str] = {}
"""(importer, imported) pairs that break a rule, each with why: none."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] == "migrations":
        parts = ("allocator", *parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for top in ("allocator", "jobs"):
        for path in (ROOT / top).rglob("*.py"):
            found[module_name(path)] = path
    return found


def imports(path: Path, known: set[str]) -> Iterator[str]:
    """Every module ``path`` imports: external ones by their top name, ours in full (``from
    package import submodule`` names the submodule)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    yield full


def layer_of(module: str) -> int | None:
    """The layer of the longest prefix that names ``module`` or a package holding it."""
    matches = [
        (len(prefix), index)
        for index, (_name, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1] if matches else None


MODULES = modules()
OURS = set(MODULES)


def our_imports(module: str) -> set[str]:
    return {
        name
        for name in imports(MODULES[module], OURS)
        if name in OURS and name != module and not name.startswith("allocator.migrations")
    }


def test_every_module_has_a_layer() -> None:
    orphans = sorted(
        m for m in MODULES if layer_of(m) is None and not m.startswith("allocator.migrations")
    )
    assert orphans == []


def test_no_import_runs_up_a_layer() -> None:
    upward = []
    for module in sorted(MODULES):
        low = layer_of(module)
        if low is None:
            continue
        for name in sorted(our_imports(module)):
            high = layer_of(name)
            if high is not None and high > low and (module, name) not in ALLOWED:
                upward.append(f"{module} ({LAYERS[low][0]}) -> {name} ({LAYERS[high][0]})")
    assert upward == []


@pytest.mark.parametrize("layer", ["core", "config", "client"])
def test_the_lower_layers_import_no_io_library_but_their_own(layer: str) -> None:
    """The core imports none; the configuration parses URLs with psycopg's conninfo only;
    the client is psycopg's user by definition."""
    allowed = {"core": (), "config": ("psycopg",), "client": ("psycopg", "psycopg_pool")}[layer]
    found = sorted(
        f"{module} -> {name}"
        for module in MODULES
        if layer_of(module) == [n for n, _ in LAYERS].index(layer)
        for name in imports(MODULES[module], OURS)
        if name.split(".")[0] in IO_LIBRARIES and name.split(".")[0] not in allowed
    )
    assert found == []


def test_click_only_under_the_cli() -> None:
    cli = [n for n, _ in LAYERS].index("cli")
    importers = sorted(
        module
        for module in MODULES
        if layer_of(module) != cli
        and any(name.split(".")[0] == "click" for name in imports(MODULES[module], OURS))
    )
    assert importers == []


def test_jobs_see_the_node_through_its_seams_only() -> None:
    found = sorted(
        f"{module} -> {name}"
        for module in MODULES
        if module.split(".")[0] == "jobs"
        for name in our_imports(module)
        if (name.startswith("allocator.node") and name != "allocator.node.seams")
        or name.startswith("allocator.postgres")
    )
    assert found == []


def test_only_the_composition_root_imports_jobs() -> None:
    importers = sorted(
        module
        for module in MODULES
        if module.startswith("allocator")
        and any(name.split(".")[0] == "jobs" for name in imports(MODULES[module], OURS))
    )
    assert importers == ["allocator.commands.run"]


def test_no_import_cycle() -> None:
    graph = {module: our_imports(module) for module in MODULES}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for name in sorted(graph.get(module, ())):
            if name.startswith(module + ".") or module.startswith(name + "."):
                continue  # a package and its own modules (its face hands them on)
            if state.get(name) == 1:
                cycles.append([*stack[stack.index(name) :], name])
            elif name not in state:
                visit(name)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []
