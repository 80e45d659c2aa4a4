"""A JSON Schema validator for the subset server/openapi.json uses, and lookups into it.

jsonschema is not a dependency of this project; the description uses only ``$ref`` (local),
``type`` (one or a list), ``const``, ``enum``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``anyOf``, ``minimum``, ``maximum``, ``minLength``,
``maxLength`` and ``pattern``. A keyword outside that set is an error here, so the
description cannot silently use something this validator would ignore.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

OPENAPI = Path(__file__).resolve().parents[2] / "server" / "ops" / "openapi.json"
ANNOTATIONS = frozenset({"description", "title", "default", "contentMediaType", "examples"})
CHECKED = frozenset(
    {
        "$ref",
        "type",
        "const",
        "enum",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
    }
)
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}


def load_openapi() -> dict[str, Any]:
    return json.loads(OPENAPI.read_text())


def resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follow ``$ref`` (``#/...`` only) until a node without one."""
    while "$ref" in node:
        target: Any = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _is_type(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name in ("number", "integer"):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def errors(
    document: dict[str, Any], schema: dict[str, Any], value: Any, at: str = "$"
) -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``"<path>: <what>"`` lines (empty: valid)."""
    schema = resolve(document, schema)
    unknown = set(schema) - CHECKED - ANNOTATIONS
    if unknown:
        return [f"{at}: schema uses unsupported keywords {sorted(unknown)}"]
    found: list[str] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, name) for name in names):
            return [f"{at}: {value!r:.80} is not {' or '.join(names)}"]
    if "const" in schema and value != schema["const"]:
        found.append(f"{at}: {value!r:.80} != {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{at}: {value!r:.80} not in {schema['enum']}")
    if "anyOf" in schema and all(errors(document, s, value, at) for s in schema["anyOf"]):
        found.append(f"{at}: {value!r:.80} matches none of anyOf")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{at}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{at}: {value} > {schema['maximum']}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            found.append(f"{at}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            found.append(f"{at}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            found.append(f"{at}: {value!r:.80} does not match {schema['pattern']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                found.append(f"{at}: missing {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                found += errors(document, properties[name], item, f"{at}.{name}")
            elif extra is False:
                found.append(f"{at}: unexpected property {name!r}")
            elif isinstance(extra, dict):
                found += errors(document, extra, item, f"{at}.{name}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += errors(document, schema["items"], item, f"{at}[{index}]")
    return found


def response_schema(
    document: dict[str, Any], path: str, method: str, status: int, content_type: str
) -> dict[str, Any]:
    """The schema the description gives a response; KeyError when it describes none."""
    operation = document["paths"][path][method.lower()]
    response = resolve(document, operation["responses"][str(status)])
    return response["content"][content_type]["schema"]
