"""docs/schemas/: every file is a valid JSON Schema (draft 2020-12) that documents every key
(a title, a description on each property, required keys and ``additionalProperties`` stated),
the README lists each one, and the parts ``status --json`` and ``/cluster`` share are the
same in both. Real output is checked against them where the tests produce it
(:mod:`tests.output_schemas`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests import output_schemas
from tests.output_schemas import SCHEMAS, SUFFIX, load, names

DIALECT = "https://json-schema.org/draft/2020-12/schema"
OUTPUTS = {"status", "node-status", "cluster", "drill"}
SHARED = ("timestamp", "leader", "contender", "election", "term", "block_age")
"""The ``$defs`` of ``status --json`` that ``/cluster`` repeats (each file stands alone)."""


def object_schemas(node: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every sub-schema that lists properties, with its JSON pointer."""
    if isinstance(node, dict):
        if "properties" in node and node.get("type") == "object":
            yield where, node
        for key, value in node.items():
            yield from object_schemas(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from object_schemas(value, f"{where}/{index}")


def test_there_is_one_schema_per_machine_output() -> None:
    assert set(names()) == OUTPUTS


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_each_file_is_a_valid_2020_12_schema_and_so_is_its_closed_form(name: str) -> None:
    schema = load(name)
    assert schema["$schema"] == DIALECT
    Draft202012Validator.check_schema(schema)
    Draft202012Validator.check_schema(output_schemas.closed(schema))
    assert schema["title"]
    assert schema["description"]


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_every_property_says_what_it_means_and_every_object_what_it_requires(name: str) -> None:
    for where, node in object_schemas(load(name)):
        assert node.get("additionalProperties") is True, f"{where}: additionalProperties"
        assert set(node["required"]) <= set(node["properties"]), f"{where}: required"
        for key, prop in node["properties"].items():
            assert len(prop.get("description", "")) >= 8, f"{where}/properties/{key}"


def test_the_readme_links_every_schema_and_states_the_compatibility_rule() -> None:
    readme = (SCHEMAS / "README.md").read_text()
    for name in OUTPUTS:
        assert f"]({name}{SUFFIX})" in readme
    assert "additionalProperties" in readme
    assert "major version" in readme


@pytest.mark.parametrize(
    ("doc", "name"),
    [
        ("operations.md", "status"),
        ("operations.md", "node-status"),
        ("admin-http.md", "node-status"),
        ("admin-http.md", "cluster"),
        ("drills.md", "drill"),
    ],
)
def test_the_docs_of_each_output_link_its_schema(doc: str, name: str) -> None:
    assert f"](schemas/{name}{SUFFIX})" in (SCHEMAS.parent / doc).read_text()


@pytest.mark.parametrize("part", SHARED)
def test_status_and_cluster_describe_their_shared_parts_alike(part: str) -> None:
    assert load("status")["$defs"][part] == load("cluster")["$defs"][part]


def test_closing_a_schema_refuses_an_undocumented_key_but_not_a_map_entry() -> None:
    pause = {"pause_id": 1, "paused_at": "2026-12-02T03:41:19+00:00", "paused_by": "ops"}
    pause["reason"] = "restore"
    assert output_schemas.problems("status", pause, "claims_pause") == []
    assert output_schemas.problems("status", {**pause, "extra": 1}, "claims_pause") == [
        "$: Additional properties are not allowed ('extra' was unexpected)"
    ]
    kinds = {"57P01": 3, "AL001": 1}
    assert output_schemas.problems("drill", kinds, "scenario/properties/claim_error_kinds") == []


@pytest.mark.parametrize(
    "value",
    ["2026-12-02 03:41:19+00:00", "2026-12-02T03:41:19", "03:41:19", 1764646879.0],
)
def test_a_timestamp_is_rfc_3339_with_its_offset(value: object) -> None:
    assert output_schemas.problems("status", value, "timestamp")
    assert output_schemas.problems("status", "2026-12-02T03:41:19.84+01:00", "timestamp") == []
