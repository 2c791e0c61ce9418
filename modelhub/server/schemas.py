"""JSON schemas of the request bodies, for the OpenAPI document (``/openapi.json``).

The routes read bodies themselves (``server/requests.py``: Ollama's error messages, unknown
fields ignored); these schemas describe what they accept so that clients and the fuzz test
(``tests/test_api_fuzz.py``) know the fields. They are documentation, not the validator.
"""

from __future__ import annotations

from typing import Any

_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_OBJ = {"type": "object"}
_STRS = {"type": "array", "items": _STR}
_KEEP_ALIVE = {"oneOf": [_STR, _NUM]}
_FORMAT = {"oneOf": [{"type": "string", "enum": ["", "json"]}, _OBJ]}
_THINK = {"oneOf": [_BOOL, {"type": "string", "enum": ["low", "medium", "high", "max"]}]}
_MESSAGE = {
    "type": "object",
    "properties": {"role": _STR, "content": _STR, "images": _STRS},
    "required": ["role", "content"],
}
_DIGESTS = {"type": "object", "additionalProperties": _STR}


def _body(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


GENERATE = _body(
    ["model"],
    model=_STR,
    prompt=_STR,
    suffix=_STR,
    system=_STR,
    template=_STR,
    context={"type": "array", "items": _INT},
    raw=_BOOL,
    stream=_BOOL,
    format=_FORMAT,
    options=_OBJ,
    keep_alive=_KEEP_ALIVE,
    images=_STRS,
    think=_THINK,
    shift=_BOOL,
)
CHAT = _body(
    ["model"],
    model=_STR,
    messages={"type": "array", "items": _MESSAGE},
    tools={"type": "array", "items": _OBJ},
    stream=_BOOL,
    format=_FORMAT,
    options=_OBJ,
    keep_alive=_KEEP_ALIVE,
    think=_THINK,
    truncate=_BOOL,
    shift=_BOOL,
)
EMBED = _body(
    ["model"],
    model=_STR,
    input={"oneOf": [_STR, _STRS]},
    dimensions=_INT,
    truncate=_BOOL,
    options=_OBJ,
    keep_alive=_KEEP_ALIVE,
)
EMBEDDINGS = _body(["model"], model=_STR, prompt=_STR, options=_OBJ, keep_alive=_KEEP_ALIVE)
SHOW = _body(["model"], model=_STR, verbose=_BOOL, system=_STR, options=_OBJ)
DELETE = _body(["model"], model=_STR)
VERIFY = _body([], model=_STR)  # no body (or no model): every model
COPY = _body(["source", "destination"], source=_STR, destination=_STR)
PULL = _body(["model"], model=_STR, insecure=_BOOL, no_draft=_BOOL, stream=_BOOL)
CREATE = _body(
    ["model"],
    model=_STR,
    stream=_BOOL,
    **{"from": _STR},
    files=_DIGESTS,
    adapters=_DIGESTS,
    draft_files=_DIGESTS,
    draft=_STR,
    template=_STR,
    system=_STR,
    parameters=_OBJ,
    messages={"type": "array", "items": _MESSAGE},
    license={"oneOf": [_STR, _STRS]},
    quantize=_STR,
    draft_quantize=_STR,
    modelfile=_STR,
)
_SAMPLING: dict[str, dict[str, Any]] = {
    "temperature": _NUM,
    "top_p": _NUM,
    "max_tokens": _INT,
    "max_completion_tokens": _INT,
    "stream": _BOOL,
    "stop": {"oneOf": [_STR, _STRS]},
    "seed": _INT,
    "frequency_penalty": _NUM,
    "presence_penalty": _NUM,
    "response_format": _OBJ,
    "prediction": _OBJ,
    "stream_options": _OBJ,
}
OPENAI_CHAT = _body(
    ["model", "messages"],
    model=_STR,
    messages={"type": "array", "items": _MESSAGE},
    tools={"type": "array", "items": _OBJ},
    truncate=_BOOL,
    **_SAMPLING,
)
OPENAI_COMPLETION = _body(
    ["model", "prompt"], model=_STR, prompt={"oneOf": [_STR, _STRS]}, suffix=_STR, **_SAMPLING
)
OPENAI_EMBEDDINGS = _body(
    ["model", "input"],
    model=_STR,
    input={"oneOf": [_STR, _STRS]},
    dimensions=_INT,
    encoding_format={"type": "string", "enum": ["float", "base64"]},
)
