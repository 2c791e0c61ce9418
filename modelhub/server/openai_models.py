"""The request bodies of OpenAI's routes (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``) as pydantic models, on the rules of ``server/request_models.py``: the route
parses its body once (``read_request``), the OpenAPI document's bodies are generated from them.

As OpenAI-compatible servers do, unknown fields are ignored (and ``null`` is absent). A field
comes out as what it means, checked with this API's messages: ``messages`` in the template's
form (text parts joined, ``image_url`` and ``input_audio`` parts as the message's ``images``,
assistant ``tool_calls`` and reasoning kept, a ``tool`` result named after its call),
``stop`` as a list, ``response_format`` as Ollama's ``format`` (None, ``"json"`` or a schema),
``prediction`` as its text, ``reasoning_effort`` (and Ollama's ``think``) as a think value.

:class:`ChatFields` is what the chat path takes (``completion_request.chat_setup``): the
/v1/responses and /v1/messages routes and transcriptions translate their requests to it.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.json_schema import SkipJsonSchema

from modelhub.errors import InputError
from modelhub.server.embedding import input_texts
from modelhub.server.images import MEDIA_PART_TYPES, openai_images
from modelhub.server.logprobs import requested as logprobs_requested
from modelhub.server.request_models import (
    STR_OR_STRS_SCHEMA,
    Body,
    Grammar,
    KeepAlive,
    Logprobs,
    NamedBody,
    TopLogprobs,
    parse_body,
)
from modelhub.server.requests import THINK_LEVELS

Think = bool | str | None
_OBJ: dict[str, Any] = {"type": "object"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_PART = {
    **_OBJ,
    "properties": {"type": {"type": "string", "enum": ["text", "image_url", "input_audio"]}},
    "required": ["type"],
}
_ROLES = ["system", "developer", "user", "assistant", "tool"]
MESSAGES_SCHEMA = {  # OpenAI's messages, as openai_messages reads them
    "type": "array",
    "minItems": 1,
    "items": {
        **_OBJ,
        "properties": {
            "role": {"type": "string", "enum": _ROLES},
            "content": {"oneOf": [_STR, {"type": "array", "items": _PART}, {"type": "null"}]},
            "tool_calls": {"type": "array", "items": _OBJ},
            "tool_call_id": _STR,
            "name": _STR,
            "reasoning_content": _STR,
        },
        "required": ["role"],
    },
}


# ----- messages and content ------------------------------------------------------------------
def openai_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI messages -> the template's: assistant ``tool_calls`` and reasoning
    (``reasoning_content`` or ``reasoning``) kept, a ``tool`` result named after the call its
    ``tool_call_id`` answers."""
    if not isinstance(raw, list) or not raw:
        raise InputError("messages must be a non-empty array")
    messages = []
    names: dict[str, str] = {}  # tool call id -> function name
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InputError(f"messages[{i}] must be an object")
        role = str(m.get("role", "")).lower()
        role = "system" if role == "developer" else role
        if role not in ("system", "user", "assistant", "tool"):
            raise InputError(f"messages[{i}].role {m.get('role')!r} is not supported")
        message: dict[str, Any] = {
            "role": role,
            "content": content_text(m.get("content"), f"messages[{i}]"),
        }
        if images := openai_images(m.get("content"), f"messages[{i}]"):
            message["images"] = images
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
                raise InputError(f"messages[{i}].tool_calls must be an array of objects")
            message["tool_calls"] = calls
            for call in calls:
                function = call.get("function")
                if isinstance(function, dict) and call.get("id"):
                    names[str(call["id"])] = str(function.get("name") or "")
        for key in ("reasoning_content", "reasoning"):  # either name, as clients send it back
            if isinstance(m.get(key), str):
                message["thinking"] = m[key]
                break
        if role == "tool":
            call_id = str(m.get("tool_call_id") or "")
            message["tool_call_id"] = call_id
            message["tool_name"] = str(m.get("name") or names.get(call_id, ""))
        messages.append(message)
    return messages


def content_text(content: Any, where: str) -> str:
    """A message's text: a string, or its ``text`` parts joined (media parts are read by
    ``images.openai_images``)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise InputError(f"{where}: content parts must be objects")
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") not in MEDIA_PART_TYPES:
                raise InputError(
                    f"{where}: content part type {part.get('type')!r} is not supported"
                )
        return "".join(texts)
    raise InputError(f"{where}: content must be a string or an array of parts")


# ----- fields with messages of their own -----------------------------------------------------
def _positive(name: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{name} must be a positive integer")
        return value

    return BeforeValidator(check)


def _stop(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise InputError("stop must be a string or an array of strings")


def _response_format(rf: Any) -> str | dict[str, Any] | None:
    """``response_format`` as Ollama's ``format``: None, "json" or a JSON schema."""
    if not isinstance(rf, dict):
        raise InputError("response_format must be an object")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InputError("response_format.json_schema.schema must be a JSON schema object")
        return schema
    raise InputError(f"response_format type {kind!r} is not supported")


def _prediction(pred: Any) -> str:
    if not isinstance(pred, dict) or pred.get("type") != "content":
        raise InputError('prediction must be {"type": "content", "content": ...}')
    return content_text(pred.get("content"), "prediction")


def _think(think: Any) -> Think:
    if isinstance(think, bool) or (isinstance(think, str) and think in THINK_LEVELS):
        return think
    raise InputError('think must be true, false, "low", "medium", "high" or "max"')


_EFFORTS: dict[Any, Think] = {
    "none": False,
    "minimal": "low",
    **{level: level for level in THINK_LEVELS},
    "xhigh": "max",
    "ultra": "max",
}


def _effort(effort: Any) -> Think:
    """OpenAI's scale clamped to Ollama's levels, as Ollama's /v1 ("none": reasoning off)."""
    if isinstance(effort, str) and effort in _EFFORTS:
        return _EFFORTS[effort]
    raise InputError(
        'reasoning_effort must be "none", "minimal", "low", "medium", "high", "xhigh", '
        '"ultra" or "max"'
    )


def _completion_logprobs(n: Any) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 5:
        raise InputError("logprobs must be an integer between 0 and 5 on /v1/completions")
    return n


def _completion_prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InputError("prompt must be a string")
    return prompt


def _encoding(value: Any) -> str:
    if value not in ("float", "base64"):
        raise InputError('encoding_format must be "float" or "base64"')
    return str(value)


def _schema(schema: dict[str, Any]) -> WithJsonSchema:
    return WithJsonSchema(schema)


MaxTokens = Annotated[int | None, _positive("max_tokens"), _schema({**_INT, "minimum": 1})]
Stop = Annotated[list[str] | None, BeforeValidator(_stop), _schema(STR_OR_STRS_SCHEMA)]
ResponseFormat = Annotated[
    str | dict[str, Any] | None,
    BeforeValidator(_response_format),
    _schema(
        {
            **_OBJ,
            "properties": {
                "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                "json_schema": _OBJ,
            },
            "required": ["type"],
        }
    ),
]
Prediction = Annotated[
    str | None,
    BeforeValidator(_prediction),
    _schema({**_OBJ, "properties": {"type": {"const": "content"}, "content": {}}}),
]
ThinkField = Annotated[
    Think,
    BeforeValidator(_think),
    _schema({"oneOf": [{"type": "boolean"}, {"type": "string", "enum": list(THINK_LEVELS)}]}),
]
Effort = Annotated[
    Think, BeforeValidator(_effort), _schema({"type": "string", "enum": list(_EFFORTS)})
]
Messages = Annotated[
    list[dict[str, Any]], BeforeValidator(openai_messages), _schema(MESSAGES_SCHEMA)
]
Extension = Annotated[Any, _schema(_INT)]  # an ``options`` value, checked where options are


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    include_usage: bool | None = None


# ----- bodies --------------------------------------------------------------------------------
class OpenAIBody(NamedBody):
    """OpenAI's routes take no ``name`` alias for ``model``."""

    name_alias: ClassVar[bool] = False


class SamplingBody(Body):
    """What every generating /v1 request has: OpenAI's sampling fields (OpenAI's defaults),
    the reply's form and this API's extensions (``keep_alive``, ``grammar``, and ``draft``,
    ``draft_num_predict``, ``top_k`` as in ``options``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: MaxTokens = None
    max_completion_tokens: Annotated[
        int | None, _positive("max_completion_tokens"), _schema({**_INT, "minimum": 1})
    ] = None
    stream: bool = False
    stream_options: StreamOptions = StreamOptions()
    stop: Stop = None
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    response_format: ResponseFormat = None
    prediction: Prediction = None
    grammar: Grammar = None
    keep_alive: KeepAlive = None
    draft: Annotated[Any, _schema({"type": "string"})] = None
    draft_num_predict: Extension = None
    top_k: Extension = None


class ChatFields(SamplingBody):
    """A chat request as the chat path reads it; ``messages`` may be given beside it (in the
    template's form already, as /v1/messages does)."""

    messages: Messages | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Annotated[Any, _schema({"oneOf": [{"type": "string"}, _OBJ]})] = None
    reasoning_effort: Effort = None
    think: ThinkField = None  # Ollama's, as on /api/chat
    logprobs: Logprobs = False
    top_logprobs: TopLogprobs = None
    truncate: bool = True  # **extension**, as on /api/chat

    @model_validator(mode="after")
    def _alternatives_checked(self) -> ChatFields:
        self.alternatives()
        return self

    def alternatives(self) -> int | None:
        """Log-probability alternatives per token (0..20); None: no log-probabilities."""
        return logprobs_requested({"logprobs": self.logprobs, "top_logprobs": self.top_logprobs})

    @property
    def thinking(self) -> Think:
        """``reasoning_effort`` (OpenAI's) when given, else ``think`` (Ollama's)."""
        return self.think if self.reasoning_effort is None else self.reasoning_effort


class ChatCompletionBody(ChatFields, OpenAIBody):
    messages: Messages
    debug_render_only: SkipJsonSchema[bool] = Field(False, alias="_debug_render_only")

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {**super().prepare(data), "messages": data.get("messages")}


class CompletionBody(SamplingBody, OpenAIBody):
    prompt: Annotated[str, BeforeValidator(_completion_prompt), _schema(STR_OR_STRS_SCHEMA)]
    suffix: str = ""
    logprobs: Annotated[
        int | None,
        BeforeValidator(_completion_logprobs),
        _schema({**_INT, "minimum": 0, "maximum": 5}),
    ] = None

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {**super().prepare(data), "prompt": data.get("prompt")}


class EmbeddingsRequestBody(OpenAIBody):
    input: Annotated[
        list[str],
        BeforeValidator(lambda v: input_texts(v, allow_empty=False)),
        _schema(STR_OR_STRS_SCHEMA),
    ]
    dimensions: int = 0
    encoding_format: Annotated[Literal["float", "base64"], BeforeValidator(_encoding)] = "float"

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {**super().prepare(data), "input": data.get("input")}


def chat_fields(data: dict[str, Any]) -> ChatFields:
    """A translated request (/v1/responses, /v1/messages, transcriptions) as the chat path's
    fields, parsed as a /v1/chat/completions body would be."""
    return parse_body(ChatFields, data)
