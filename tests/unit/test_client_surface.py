"""The public surface of ``allocator.client`` is small and pinned: what an application uses,
each name documented, and no helper re-exported (issue 23)."""

from __future__ import annotations

import inspect
import re
import types
from pathlib import Path

import pytest

import allocator.client

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = {
    # the clients and the one-shot claim
    "IdClient",
    "AsyncIdClient",
    "claim_once",
    # what they return
    "Block",
    "UnusedIds",
    # what an application catches
    "PoolEmptyError",
    "ClaimsPausedError",
    "ClaimArgumentError",
    "ClientClosedError",
    "DatabaseUnavailableError",
    "DatabaseError",
    # the claimer protocols, and the claimers an application builds or tests with
    "Claimer",
    "NonBlockingClaimer",
    "AsyncClaimer",
    "PostgresClaimer",
    "AsyncPostgresClaimer",
    "InMemoryClaimer",
}
HOMES = ("allocator.client.", "allocator.core.errors")
"""Where a public name may be defined: the package's modules, or the project's errors."""


def test_all_is_the_agreed_set_without_duplicates() -> None:
    assert sorted(allocator.client.__all__) == sorted(PUBLIC)
    assert len(allocator.client.__all__) == len(PUBLIC)


def test_every_public_name_is_importable_and_documented() -> None:
    for name in allocator.client.__all__:
        obj = getattr(allocator.client, name)
        assert obj.__module__.startswith(HOMES), name
        assert (inspect.getdoc(obj) or "").strip(), f"{name} has no docstring"


def test_the_public_classes_document_their_public_methods() -> None:
    undocumented = [
        f"{name}.{attribute}"
        for name in allocator.client.__all__
        if inspect.isclass(cls := getattr(allocator.client, name))
        and not issubclass(cls, Exception)
        for attribute, member in vars(cls).items()
        if not attribute.startswith("_")
        and (inspect.isfunction(member) or isinstance(member, property))
        and not (inspect.getdoc(member) or "").strip()
    ]
    assert undocumented == []


def test_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from allocator.client import *", namespace)  # noqa: S102
    assert set(namespace) - {"__builtins__"} == PUBLIC


def test_nothing_else_is_reexported_from_the_package() -> None:
    """Besides ``__all__`` the package holds only its own submodules (Python sets those as
    attributes on import); helpers, constants and internal types stay in their modules."""
    extra = {
        name
        for name, value in vars(allocator.client).items()
        if not name.startswith("_") and name not in PUBLIC
    }
    assert extra, "the package's submodules are expected here"
    for name in sorted(extra):
        value = vars(allocator.client)[name]
        assert isinstance(value, types.ModuleType), f"{name} is re-exported but not public"
        assert value.__name__ == f"allocator.client.{name}", name


def test_the_docs_use_only_public_names() -> None:
    """README.md and docs/*.md show applications the public surface only."""
    imports = re.compile(r"from allocator\.client import (?:\(([\w\s,]+)\)|([\w ,]+))")
    dotted = re.compile(r"allocator\.client\.(\w+)")
    private = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        names = {m.group(1) for m in dotted.finditer(text)}
        for match in imports.finditer(text):
            names |= {n.strip() for n in (match.group(1) or match.group(2)).split(",")}
        private += [f"{path.name}: {name}" for name in sorted(names - PUBLIC - {""})]
    assert private == []


def test_a_name_the_previous_release_exported_still_imports_with_a_warning() -> None:
    """0.2.0 exported helpers from the package; an importer of one keeps working for a
    release, warned, and gets the very object the internal module holds."""
    from allocator.client import base

    with pytest.warns(DeprecationWarning, match=r"check_consumer is internal"):
        found = allocator.client.check_consumer
    assert found is base.check_consumer
    with pytest.warns(DeprecationWarning, match=r"MAX_CONSUMER_CHARS is internal"):
        assert allocator.client.MAX_CONSUMER_CHARS == base._MAX_CONSUMER_CHARS


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        allocator.client.no_such_name  # noqa: B018
