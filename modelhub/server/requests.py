"""Reading JSON request bodies with Ollama's error behaviour.

An empty body is ``400 missing request body``; malformed JSON or a field of the wrong type is a
400 that says which field and what was expected. Unknown fields are ignored.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar, cast

from fastapi import Request

from modelhub.errors import BadRequest

MAX_BODY = 64 * 1024 * 1024
T = TypeVar("T")


async def read_json(request: Request) -> dict[str, Any]:
    body = await request.body()
    if not body.strip():
        raise BadRequest("missing request body")
    if len(body) > MAX_BODY:
        raise BadRequest("request body too large")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid JSON in request body: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data


def field(data: dict[str, Any], name: str, kind: type[T], default: T) -> T:
    """``data[name]`` checked against ``kind`` (null counts as absent)."""
    value = data.get(name)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return cast(T, float(value))
    if not ok:
        raise BadRequest(
            f'field "{name}" must be of type {_type_name(kind)}, got {_json_type(value)}'
        )
    return cast(T, value)


def str_map(data: dict[str, Any], name: str) -> dict[str, str]:
    value = field(data, name, dict, {})
    for key, item in value.items():
        if not isinstance(item, str):
            raise BadRequest(f'field "{name}": value for {key!r} must be a string digest')
    return dict(value)


def model_field(data: dict[str, Any]) -> str:
    """``model`` with the deprecated ``name`` alias."""
    return (field(data, "model", str, "") or field(data, "name", str, "")).strip()


def _type_name(kind: type) -> str:
    return {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        dict: "object",
        list: "array",
    }.get(kind, kind.__name__)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return _type_name(type(value))
