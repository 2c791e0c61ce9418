"""Reading JSON request bodies the same way on every route, Ollama's and OpenAI's.

An empty body is ``400 missing request body``; malformed JSON or a field of the wrong type is a
400 that says which field and what was expected. Unknown fields are ignored. A route that names
a model reads it with :func:`model_field`: a missing model is ``400 model is required``
everywhere, a name with spaces around it is refused (never trimmed into another model's name).
The Ollama routes and /v1/chat/completions, /v1/completions and /v1/embeddings parse their
bodies into the models of ``server/request_models.py`` and ``server/openai_models.py`` (which
use these checks); /v1/responses and /v1/messages read theirs with :func:`read_model_request`
and :func:`field`.

Text is decided here, once, as Go's decoder (and so Ollama) decides it: bytes that are not
UTF-8 and ``\\u`` escapes of lone UTF-16 surrogates become U+FFFD, so no string past this point
fails to encode; NUL (``\\u0000``) is an ordinary character. ``NaN``, ``Infinity`` and numbers
beyond a double's range are not JSON and are refused.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from fastapi import Request

from modelhub.errors import InputError, InvalidNameError
from modelhub.runtime.planning import keep_alive_seconds

MAX_BODY = 64 * 1024 * 1024
T = TypeVar("T")


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The body, refused as soon as it is known to exceed ``limit`` (from its declared length,
    or while it arrives): a huge body never sits in memory."""
    too_large = f"request body too large: the limit is {limit} bytes"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise InputError(f"{too_large}, this one declares {declared}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InputError(too_large)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request) -> dict[str, Any]:
    body = await read_body(request)
    if not body.strip():
        raise InputError("missing request body")
    text = body.decode(json.detect_encoding(body), errors="replace")
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise InputError("invalid JSON in request body: nested too deeply") from None
    except ValueError as exc:
        raise InputError(f"invalid JSON in request body: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(text):
        return _without_lone_surrogates(data)
    return cast(dict[str, Any], data)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"the number {literal} is out of range")
    return value


def _without_lone_surrogates(data: dict[str, Any]) -> dict[str, Any]:
    """Every string (keys too) with its lone surrogates replaced by U+FFFD. ``json.loads`` has
    already joined valid pairs, so any surrogate left is lone. Iterative: a body may nest as
    deep as the parser allows."""

    def clean(text: str) -> str:
        return _LONE_SURROGATE.sub("\ufffd", text)

    root: dict[str, Any] = {}
    work: list[tuple[Any, Any]] = [(data, root)]
    while work:
        source, target = work.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, value in items:
            if isinstance(value, str):
                value = clean(value)
            elif isinstance(value, dict | list):
                copy: Any = {} if isinstance(value, dict) else [None] * len(value)
                work.append((value, copy))
                value = copy
            target[clean(key) if isinstance(key, str) else key] = value
    return root


def field(data: dict[str, Any], name: str, kind: type[T], default: T) -> T:
    """``data[name]`` checked against ``kind`` (null counts as absent)."""
    value = data.get(name)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return cast(T, float(value))
        except OverflowError:
            raise InputError(f'field "{name}" is out of range for a number, got {value}') from None
    if not ok:
        raise InputError(
            f'field "{name}" must be of type {_type_name(kind)}, got {json_type(value)}'
        )
    return cast(T, value)


def name_field(data: dict[str, Any], key: str) -> str:
    """A model name in a field other than ``model`` (copy's source and destination)."""
    raw = field(data, key, str, "")
    if not raw:
        raise InputError(f"{key} is required")
    if raw != raw.strip():
        raise InvalidNameError(f"invalid model name {raw!r}: remove the spaces around it")
    return raw


def model_field(data: dict[str, Any], *, alias: bool = True) -> str:
    """``model`` (with Ollama's deprecated alias ``name``): required, and not padded."""
    raw = field(data, "model", str, "") or (field(data, "name", str, "") if alias else "")
    if not raw:
        raise InputError("model is required")
    if raw != raw.strip():
        raise InvalidNameError(f"invalid model name {raw!r}: remove the spaces around it")
    return raw


@dataclass(frozen=True)
class ModelRequest:
    """A body that names a model, with the fields every such route reads alike."""

    data: dict[str, Any]
    model: str  # as the client wrote it (replies echo it)
    options: dict[str, Any]
    keep_alive: float | None
    stream: bool


async def read_model_request(
    request: Request, *, stream_default: bool = True, alias: bool = True
) -> ModelRequest:
    data = await read_json(request)
    return ModelRequest(
        data=data,
        model=model_field(data, alias=alias),
        options=field(data, "options", dict, {}),
        keep_alive=keep_alive_seconds(data.get("keep_alive")),
        stream=field(data, "stream", bool, stream_default),
    )


def check_images(images: Any, where: str = "") -> None:
    """``images`` (under ``where``) as Ollama accepts them, refused (never ignored) otherwise:
    absent, or an array of base64 strings (decoded and checked by ``server.images``)."""
    if images not in (None, []):
        if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
            raise InputError(f'field "{where}images" must be an array of base64 strings')
        for index, image in enumerate(images):
            try:
                base64.b64decode(image, validate=True)
            except (binascii.Error, ValueError):
                raise InputError(f"{where}images[{index}]: invalid base64 data") from None


def check_think(think: Any) -> None:
    """``think``: absent, a boolean or a level (``"low"``, ``"medium"``, ``"high"``, ``"max"``),
    refused otherwise."""
    if think is not None and not isinstance(think, bool) and think not in THINK_LEVELS:
        shown = json.dumps(think, ensure_ascii=False)
        raise InputError(
            f'invalid think value: {shown} (must be "high", "medium", "low", "max", true, or false)'
        )


THINK_LEVELS = ("low", "medium", "high", "max")  # Ollama's; "max" is Ollama's since 2026


def _type_name(kind: type) -> str:
    return {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        dict: "object",
        list: "array",
    }.get(kind, kind.__name__)


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, as the error messages name it."""
    if isinstance(value, bool):
        return "boolean"
    return _type_name(type(value))
