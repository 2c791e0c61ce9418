"""How Go's text/template sees Python data: truth, printing, comparison and field lookup.

Template data is plain Python: str, int, float, bool, None, lists and mappings (JSON-shaped, as
the API receives it). The rules, and where they differ from Go, are:

- Truth is Go's: false, 0, nil and empty strings, lists and maps are false.
- A field ``.Name`` on a mapping looks up the key ``Name``, then its JSON spelling (``ToolCalls``
  -> ``tool_calls``, ``ToolCallID`` -> ``tool_call_id``), so Ollama's Go struct field names work on
  the JSON-shaped messages and tools. A missing key, or any field of nil, is nil (Go's
  ``missingkey=zero``; Go would fail on a field of nil, we don't, because JSON omits empty keys
  that a Go struct would hold as zero values).
- Printing nil gives "" (Go prints ``<no value>``). Maps print as JSON, as Ollama's template
  types do (tool arguments, properties, tools); lists print Go-style ``[a b]`` unless they hold
  maps, then as JSON (Ollama's ``.Tools``). Floats print in Go's shortest ``%v`` form.
- ``json`` is compact JSON that keeps non-ASCII and does not HTML-escape ``<>&`` (Go's
  json.Marshal would write ``\\u003c``); the chat templates models are trained with do not.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_FIELD_ALIASES = {"Defs": "$defs", "AnyOf": "anyOf"}


class TemplateValueError(Exception):
    """A value-level failure; the executor adds the position."""


def is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def json_key(go_name: str) -> str:
    """The JSON key a Go struct field is serialised as: ``ToolCallID`` -> ``tool_call_id``."""
    return _FIELD_ALIASES.get(go_name) or _CAMEL_BOUNDARY.sub("_", go_name).lower()


def field(value: Any, name: str) -> Any:
    if value is None:
        return None
    if isinstance(value, Mapping):
        if name in value:
            return value[name]
        return value.get(json_key(name))
    raise TemplateValueError(f"can't evaluate field {name} in type {type_name(value)}")


def truth(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str | bytes | Mapping) or is_list(value):
        return len(value) > 0
    return True


def type_name(value: Any) -> str:
    """Go's name for the type of a value, for messages like ``%!d(string=hi)``."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "map[string]interface {}"
    if is_list(value):
        return "[]interface {}"
    return type(value).__name__


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def format_float(value: float) -> str:
    """Go's ``%v`` for a float64: shortest digits, exponent form below 1e-4 or from 1e6."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    exp = len(text) + exponent - 1
    minus = "-" if sign else ""
    if exp < -4 or exp >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{minus}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{minus}0.{'0' * (-exp - 1)}{text}"
    if len(text) <= exp + 1:
        return minus + text + "0" * (exp + 1 - len(text))
    return f"{minus}{text[: exp + 1]}.{text[exp + 1 :]}"


def to_text(value: Any) -> str:
    """What ``{{ value }}`` prints (Go's ``%v`` with the differences in the module docstring)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, Mapping):
        return to_json(value)
    if is_list(value):
        if any(isinstance(item, Mapping) for item in value):
            return to_json(value)
        return "[" + " ".join(to_text(item) for item in value) + "]"
    return str(value)


def _basic_kind(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    raise TemplateValueError(f"non-comparable type {type_name(value)}")


def equal(a: Any, b: Any) -> bool:
    ka, kb = _basic_kind(a), _basic_kind(b)
    if "nil" in (ka, kb):
        return ka == kb
    if ka != kb:
        raise TemplateValueError(
            f"incompatible types for comparison: {type_name(a)} and {type_name(b)}"
        )
    return bool(a == b)


def less(a: Any, b: Any) -> bool:
    ka, kb = _basic_kind(a), _basic_kind(b)
    if ka != kb or ka not in ("number", "string"):
        raise TemplateValueError(
            f"incompatible types for comparison: {type_name(a)} and {type_name(b)}"
        )
    return bool(a < b)
