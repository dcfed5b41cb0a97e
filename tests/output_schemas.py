"""The JSON Schemas of the machine outputs (docs/schemas/), as the tests apply them to real output.

The published schemas are open (``additionalProperties: true``: a later version may add keys,
docs/schemas/README.md). The tests apply them *closed*: every object that lists its
properties gets ``additionalProperties: false``, so a key the program prints but the schema
does not document fails here, while consumers stay free to ignore new keys. Maps (objects
whose ``additionalProperties`` is a schema) are left as they are.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "schemas"
SUFFIX = ".schema.json"
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def names() -> list[str]:
    """Every schema's name (``status`` for ``docs/schemas/status.schema.json``)."""
    return sorted(path.name.removesuffix(SUFFIX) for path in SCHEMAS.glob(f"*{SUFFIX}"))


def load(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / f"{name}{SUFFIX}").read_text())
    return schema


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` in which every object schema with properties allows no other key."""
    result = copy.deepcopy(schema)
    _close(result)
    return result


def _close(node: Any) -> None:
    if not isinstance(node, dict):
        return
    is_record = node.get("type") == "object" and "properties" in node
    if is_record and node.get("additionalProperties", True) is True:
        node["additionalProperties"] = False
    for key, value in node.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            for sub in value.values():
                _close(sub)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            for sub in value:
                _close(sub)
        elif key in _SUBSCHEMAS:
            _close(value)


@functools.cache
def validator(name: str, definition: str | None = None) -> Draft202012Validator:
    """The closed schema ``name`` (or its ``$defs/<definition>`` alone), format checks on."""
    schema = closed(load(name))
    if definition is not None:
        schema = {"$schema": schema["$schema"], "$defs": schema["$defs"]}
        schema["$ref"] = f"#/$defs/{definition}"
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def problems(name: str, document: Any, definition: str | None = None) -> list[str]:
    """Every way ``document`` (after a JSON round trip) breaks the schema: ``path: message``."""
    data = json.loads(json.dumps(document))
    found = validator(name, definition).iter_errors(data)
    return sorted(_describe(error) for error in found)


def _describe(error: ValidationError) -> str:
    """``path: message``; for a value that fits none of its choices (a nullable object), the
    deepest error of a choice rather than the whole value."""
    while error.context:
        error = max(error.context, key=lambda e: len(e.absolute_path))
    return f"{error.json_path}: {error.message}"


def assert_valid(name: str, document: Any, definition: str | None = None) -> None:
    """``document`` matches docs/schemas/<name>.schema.json (closed); else every problem named."""
    found = problems(name, document, definition)
    assert not found, f"{name}{SUFFIX}:\n" + "\n".join(found)


def assert_required_keys_matter(name: str, document: dict[str, Any]) -> None:
    """A break the schema must catch: ``document`` without any one of its required keys."""
    for key in load(name)["required"]:
        broken = {k: v for k, v in document.items() if k != key}
        assert problems(name, broken), f"{name}{SUFFIX} accepts the output without {key!r}"
