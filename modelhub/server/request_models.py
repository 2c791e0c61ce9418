"""Request bodies as pydantic models: what a route parses its body into, once, and what the
OpenAPI document's request bodies are generated from (:func:`openapi_body`).

Parsing keeps Ollama's rules and this API's messages (``docs/api.md``, Conventions): unknown
fields are ignored and ``null`` counts as absent; the model a route names is read first, as
every route reads it (``requests.model_field``: ``model is required``, a padded name refused);
a value of the wrong JSON type is ``400 field "x" must be of type string, got integer``, the one
translation of pydantic's errors (:func:`parse_body`). A field with a message of its own
(``think``, ``images``, ``format``, ``context``, ``messages``, ``keep_alive``, ...) checks it
in a validator that raises that :class:`~modelhub.errors.InputError` itself (pydantic lets an
exception that is not a ``ValueError`` through), so the class and the words are this API's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from fastapi import Request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from modelhub.errors import InputError
from modelhub.runtime.planning import keep_alive_seconds
from modelhub.server.embedding import input_texts
from modelhub.server.requests import (
    THINK_LEVELS,
    check_images,
    check_think,
    json_type,
    model_field,
    name_field,
    read_json,
)

B = TypeVar("B", bound="Body")

# ----- shared JSON schemas (for fields whose Python type is not what the wire carries) -------
_STR = {"type": "string"}
_STRS = {"type": "array", "items": _STR}
_OBJ = {"type": "object"}
_MESSAGE = {
    "type": "object",
    "properties": {
        "role": _STR,
        "content": _STR,
        "images": _STRS,
        "thinking": _STR,
        "tool_calls": {"type": "array", "items": _OBJ},
        "tool_name": _STR,
    },
    "required": ["role", "content"],
}
MESSAGES_SCHEMA = {"type": "array", "items": _MESSAGE}
STR_OR_STRS_SCHEMA = {"oneOf": [_STR, _STRS]}

# ----- the one translation of pydantic's errors ----------------------------------------------
_EXPECTED = {
    "string_type": "string",
    "bool_type": "boolean",
    "int_type": "integer",
    "float_type": "number",
    "dict_type": "object",
    "list_type": "array",
    "model_type": "object",  # a nested model's value
}


def _error_message(error: Any) -> str:
    loc = [str(part) for part in error["loc"]]
    name = loc[0] + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:])
    expected = _EXPECTED.get(error["type"])
    value = error["input"]
    if expected == "number" and isinstance(value, int) and not isinstance(value, bool):
        return f'field "{name}" is out of range for a number, got {value}'
    if expected is None:
        return f'field "{name}": {error["msg"]}'
    return f'field "{name}" must be of type {expected}, got {json_type(value)}'


def parse_body(cls: type[B], data: dict[str, Any]) -> B:
    """``data`` (a JSON object) as ``cls``; InputError (400) naming the first bad field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise InputError(_error_message(exc.errors()[0])) from None


async def read_request(request: Request, cls: type[B]) -> B:
    """The request's JSON body (``requests.read_json``'s rules) parsed into ``cls``."""
    return parse_body(cls, await read_json(request))


def openapi_body(cls: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose body is ``cls``: its JSON schema, inlined."""
    schema = cls.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            # a null default is "absent", not a value of the field's type
            return {k: inline(v) for k, v in node.items() if not (k == "default" and v is None)}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    content = {"application/json": {"schema": inline(schema)}}
    return {"requestBody": {"required": True, "content": content}}


# ----- fields with messages of their own -----------------------------------------------------
def _checked(check: Callable[[Any], None]) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        check(value)
        return value

    return validate


def _format(value: Any) -> Any:
    if value == "":
        return None
    if value == "json" or isinstance(value, dict):
        return value
    raise InputError(f'invalid format: {value!r}; expected "json" or a valid JSON Schema object')


def _token_ids(value: Any) -> Any:
    if isinstance(value, list) and not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise InputError('field "context" must be an array of token ids')
    return value


def _typed(kind: type, message: str) -> BeforeValidator:
    """The value must be a ``kind`` (a bool is no number), else ``message``."""

    def check(value: Any) -> None:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise InputError(message)

    return BeforeValidator(_checked(check))


def _digest_map(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(item, str):
                raise InputError(
                    f'field "{info.field_name}": value for {key!r} must be a string digest'
                )
    return value


def _license(value: Any) -> Any:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return value
    raise InputError('field "license" must be a string or an array of strings')


def _create_messages(value: Any) -> Any:
    if not isinstance(value, list):
        raise InputError('field "messages" must be an array of {"role","content"} objects')
    return value


def _chat_messages(value: Any) -> list[dict[str, Any]]:
    raw = value or []
    if not isinstance(raw, list):
        raise InputError('field "messages" must be an array')
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("content", ""), str):
            raise InputError(f"messages[{i}] must be an object with a string content")
        role = str(m.get("role", "")).lower()
        if role not in ("system", "user", "assistant", "tool"):
            raise InputError(f"messages[{i}]: role must be system, user, assistant or tool")
        check_images(m.get("images"), f"messages[{i}].")
        out.append({**m, "role": role, "content": m.get("content") or ""})
    return out


KeepAlive = Annotated[
    float | None,
    BeforeValidator(keep_alive_seconds),
    WithJsonSchema({"oneOf": [_STR, {"type": "number"}]}),
]
Think = Annotated[
    bool | Literal["low", "medium", "high", "max"] | None,
    BeforeValidator(_checked(check_think)),
    WithJsonSchema(
        {"oneOf": [{"type": "boolean"}, {"type": "string", "enum": list(THINK_LEVELS)}]}
    ),
]
Images = Annotated[list[str], BeforeValidator(_checked(lambda v: check_images(v, "")))]
Format = Annotated[
    str | dict[str, Any] | None,
    BeforeValidator(_format),
    WithJsonSchema({"oneOf": [{"type": "string", "enum": ["", "json"]}, _OBJ]}),
]
TokenIds = Annotated[list[int], BeforeValidator(_token_ids)]
DigestMap = Annotated[
    dict[str, str],
    BeforeValidator(_digest_map),
    WithJsonSchema({"type": "object", "additionalProperties": _STR}),
]
Grammar = Annotated[
    str | None, _typed(str, 'field "grammar" must be a GBNF string'), WithJsonSchema(_STR)
]
Logprobs = Annotated[bool, _typed(bool, 'field "logprobs" must be a boolean')]
TopLogprobs = Annotated[
    int | None,
    _typed(int, 'field "top_logprobs" must be an integer'),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 20}),
]


# ----- bodies --------------------------------------------------------------------------------
class Body(BaseModel):
    """Unknown fields ignored, ``null`` as absent, JSON types as sent (no coercion)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _prepared(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise InputError("request body must be a JSON object")
        return cls.prepare({k: v for k, v in data.items() if v is not None})

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        """What a body checks before its fields (a subclass's hook)."""
        return data


class NamedBody(Body):
    """A body that names a model: ``model`` is read first (Ollama's ``name`` is its alias)."""

    name_alias: ClassVar[bool] = True
    model: str

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "model": model_field(data, alias=cls.name_alias)}


class LoadBody(NamedBody):
    """A body that runs a model: its options, how long it stays loaded, streaming or not."""

    options: dict[str, Any] = {}
    keep_alive: KeepAlive = None
    stream: bool = True


class GenerateBody(LoadBody):
    images: Images = []
    think: Think = None
    prompt: str = ""
    raw: bool = False
    system: str = ""
    template: str = ""
    suffix: str = ""
    context: TokenIds = []
    format: Format = None
    shift: bool = True
    logprobs: Logprobs = False
    top_logprobs: TopLogprobs = None
    grammar: Grammar = None
    prediction: Annotated[  # **extension**; anything but a string is ignored, as before
        str | None,
        BeforeValidator(lambda v: v if isinstance(v, str) else None),
        WithJsonSchema(_STR),
    ] = None

    @model_validator(mode="after")
    def _raw_mode(self) -> GenerateBody:
        if self.raw and (self.template or self.system or self.context):
            raise InputError("raw mode does not support template, system, or context")
        return self


class ChatBody(LoadBody):
    images: Images = []  # accepted only to say where images go (on a message)
    think: Think = None
    messages: Annotated[
        list[dict[str, Any]], BeforeValidator(_chat_messages), WithJsonSchema(MESSAGES_SCHEMA)
    ] = []
    tools: list[Any] = []
    tool_choice: Any = None
    format: Format = None
    truncate: bool = True
    shift: bool = True
    logprobs: Logprobs = False
    top_logprobs: TopLogprobs = None
    grammar: Grammar = None
    debug_render_only: SkipJsonSchema[bool] = Field(False, alias="_debug_render_only")


class EmbedBody(LoadBody):
    input: Annotated[
        list[str],
        BeforeValidator(lambda v: input_texts(v, allow_empty=True)),
        WithJsonSchema(STR_OR_STRS_SCHEMA),
    ] = []
    dimensions: int = 0
    truncate: bool = True


class EmbeddingsBody(LoadBody):
    prompt: str = ""


class ShowBody(NamedBody):
    verbose: bool = False
    system: str = ""
    options: dict[str, Any] = {}


class DeleteBody(NamedBody):
    pass


class VerifyBody(Body):
    model: str = ""  # none: every model


class CopyBody(Body):
    source: str
    destination: str

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        source, destination = name_field(data, "source"), name_field(data, "destination")
        return {**data, "source": source, "destination": destination}


class PullBody(NamedBody):
    insecure: bool = False
    no_draft: bool = False  # **extension**
    stream: bool = True


class CreateBody(NamedBody):
    """``/api/create``; a ``modelfile`` text has become the fields it sets before this is
    parsed (``server/modelfile_body.py``)."""

    stream: bool = True
    from_: str = Field("", alias="from")
    files: DigestMap = {}
    adapters: DigestMap = {}
    draft_files: DigestMap = {}
    draft: str = ""
    template: str = ""
    system: str = ""
    parameters: dict[str, Any] = {}
    messages: Annotated[
        list[Any] | None, BeforeValidator(_create_messages), WithJsonSchema(MESSAGES_SCHEMA)
    ] = None
    license: Annotated[
        list[str], BeforeValidator(_license), WithJsonSchema(STR_OR_STRS_SCHEMA)
    ] = []
    quantize: str = ""
    quantization: SkipJsonSchema[str] = ""  # Ollama's older name of quantize
    draft_quantize: str = ""
    requires: str = ""
    renderer: str = ""
    parser: str = ""
    modelfile: str = ""
