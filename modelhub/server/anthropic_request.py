"""An Anthropic Messages request (``POST /v1/messages``) as the chat request it means.

The body is parsed once into :class:`MessagesBody` (which also gives the OpenAPI document its
schema) and becomes two things the chat path already takes (``completion_request.chat_setup``): the
request's options in Chat Completions' names (``max_tokens``, ``stop``, ``temperature``,
``top_p``, ``top_k``, ``tools``, ``tool_choice``, ``think``, ``response_format``) and the
messages in the template's own form (``role``, ``content``, ``images``, ``thinking``,
``tool_calls``, ``tool_call_id``, ``tool_name``). Content blocks map as follows:

- ``text`` -> the message's text; ``image`` (base64 source) -> the message's ``images``, as
  Ollama's ``images`` (decoded and checked by ``server.images``, refused by a model without
  a vision projector, as on /api/chat);
- ``tool_use`` (assistant) -> a tool call; ``tool_result`` (user) -> a ``tool`` message named
  after the call it answers, placed before the user's other words;
- ``thinking`` (assistant) -> the turn's reasoning; ``redacted_thinking`` is dropped.

Anything else (documents, server tools, URL or file image sources) is a 400 that names it.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from modelhub.errors import InputError
from modelhub.server.openai_models import ChatFields, OpenAIBody, chat_fields
from modelhub.server.request_models import KeepAlive

_OBJ: dict[str, Any] = {"type": "object"}
_STR = {"type": "string"}
_BLOCKS = {"type": "array", "items": _OBJ}


def _max_tokens(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError("max_tokens: must be a positive integer")
    return value


def _top_k(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError("top_k: must be a non-negative integer")
    return value


def _stops(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InputError("stop_sequences: must be an array of strings")
    return value


def _object(name: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if not isinstance(value, dict):
            raise InputError(f"{name}: must be an object")
        return value

    return BeforeValidator(check)


class MessagesBody(OpenAIBody):
    """A ``/v1/messages`` body: Anthropic's fields, each read into the chat path's terms as it
    is parsed (``messages`` and ``system`` into the template's messages, ``tools`` and
    ``tool_choice`` into Chat Completions' shapes), plus this API's extensions
    (``keep_alive``, ``draft``, ``draft_num_predict``)."""

    counting: ClassVar[bool] = False  # count_tokens needs no max_tokens

    max_tokens: Annotated[
        int | None, BeforeValidator(_max_tokens), WithJsonSchema({"type": "integer", "minimum": 1})
    ] = None
    messages: Annotated[
        list[dict[str, Any]],
        BeforeValidator(lambda v: _messages(v)),
        WithJsonSchema({"type": "array", "items": {**_OBJ, "required": ["role", "content"]}}),
    ]
    system: Annotated[
        list[dict[str, Any]],
        BeforeValidator(lambda v: _system(v)),
        WithJsonSchema({"oneOf": [_STR, _BLOCKS]}),
    ] = Field(default_factory=list)
    stop_sequences: Annotated[list[str], BeforeValidator(_stops)] = Field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_k: Annotated[int | None, BeforeValidator(_top_k)] = None
    tools: Annotated[
        list[dict[str, Any]], BeforeValidator(lambda v: _tools(v)), WithJsonSchema(_BLOCKS)
    ] = Field(default_factory=list)
    tool_choice: Annotated[
        Any, BeforeValidator(lambda v: _tool_choice(v)), WithJsonSchema(_OBJ)
    ] = None
    thinking: Annotated[dict[str, Any] | None, _object("thinking")] = None
    output_config: Annotated[dict[str, Any] | None, _object("output_config")] = None
    # accepted (``user_id``), not used
    metadata: Annotated[dict[str, Any], _object("metadata")] = Field(default_factory=dict)
    stream: bool = False
    keep_alive: KeepAlive = None
    draft: Annotated[Any, WithJsonSchema(_STR)] = None
    draft_num_predict: Annotated[Any, WithJsonSchema({"type": "integer"})] = None

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {**super().prepare(data), "messages": data.get("messages")}

    @model_validator(mode="after")
    def _complete(self) -> MessagesBody:
        if self.max_tokens is None and not self.counting:
            raise InputError("max_tokens: Field required")
        _think(self.thinking, self.max_tokens)
        _output_schema(self.output_config)
        return self

    def chat(self) -> ChatFields:
        """The request's options in Chat Completions' names, parsed as such."""
        extensions = ("temperature", "top_p", "top_k", "keep_alive", "draft", "draft_num_predict")
        out: dict[str, Any] = {k: getattr(self, k) for k in extensions}
        out |= {"max_tokens": self.max_tokens, "stop": self.stop_sequences or None}
        out |= {"tools": self.tools, "tool_choice": self.tool_choice}
        out["think"] = _think(self.thinking, self.max_tokens)
        schema = _output_schema(self.output_config)
        if schema is not None:
            out["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        return chat_fields({k: v for k, v in out.items() if v is not None})

    def chat_messages(self) -> list[dict[str, Any]]:
        """The template's messages, system first."""
        return self.system + self.messages


class CountTokensBody(MessagesBody):
    """A ``/v1/messages/count_tokens`` body: a Messages body without ``max_tokens``."""

    counting: ClassVar[bool] = True


def _think(thinking: dict[str, Any] | None, max_tokens: int | None) -> bool | None:
    """``thinking``: enabled -> reasoning on, disabled -> off, adaptive or absent -> the
    model's default (a model whose template reasons does)."""
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return None
    if kind != "enabled":
        raise InputError('thinking.type: must be "enabled", "disabled" or "adaptive"')
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise InputError("thinking.budget_tokens: must be a positive integer")
    if max_tokens is not None and budget >= max_tokens:
        raise InputError("thinking.budget_tokens: must be less than max_tokens")
    return True


def _output_schema(config: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = config.get("format") if config is not None else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise InputError('output_config.format: must be {"type": "json_schema", "schema": ...}')
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise InputError("output_config.format.schema: must be a JSON schema object")
    return schema


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Custom tools (a name and an ``input_schema``) as Chat Completions' functions."""
    if not isinstance(tools, list):
        raise InputError("tools: must be an array of tools")
    return [_tool(t, i) for i, t in enumerate(tools)]


def _tool_choice(choice: Any) -> Any:
    """Anthropic's ``tool_choice`` in Chat Completions' shape: ``any`` is ``required``,
    ``tool`` a named function."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str) and choice["name"]:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InputError(
        'tool_choice: must be {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
        '{"type": "tool", "name": ...}'
    )


def _tool(tool: Any, index: int) -> dict[str, Any]:
    where = f"tools.{index}"
    if not isinstance(tool, dict):
        raise InputError(f"{where}: must be an object")
    if tool.get("type") not in (None, "custom"):
        raise InputError(
            f"{where}: tool type {tool['type']!r} is not supported (only custom tools, "
            "with a name and an input_schema)"
        )
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}.name: Field required")
    if not isinstance(schema, dict):
        raise InputError(f"{where}.input_schema: must be a JSON schema object")
    function: dict[str, Any] = {"name": name, "parameters": schema}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        text = system
    elif isinstance(system, list):
        text = "\n".join(_text_block(b, f"system.{i}") for i, b in enumerate(system))
    else:
        raise InputError("system: must be a string or an array of text blocks")
    return [{"role": "system", "content": text}] if text else []


def _text_block(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise InputError(f"{where}: must be a text block")
    text = block.get("text")
    if not isinstance(text, str):
        raise InputError(f"{where}.text: must be a string")
    return text


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise InputError("messages: must be a non-empty array")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results that answer it
    for i, message in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise InputError(f"{where}: must be an object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise InputError(f'{where}.role: must be "user" or "assistant"')
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out.extend(_blocks(role, content, where, names))
        else:
            raise InputError(f"{where}.content: must be a string or an array of blocks")
    return out


def _blocks(
    role: str, blocks: list[Any], where: str, names: dict[str, str]
) -> list[dict[str, Any]]:
    """One Anthropic message's blocks -> its tool results (as ``tool`` messages), then the
    message itself (unless it holds nothing else)."""
    message: dict[str, Any] = {"role": role, "content": ""}
    results: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
        if kind not in allowed:
            raise InputError(f"{at}: {role} content blocks of type {kind!r} are not supported")
        assert isinstance(block, dict)
        if kind == "text":
            message["content"] += _text_block(block, at)
        elif kind == "image":
            message.setdefault("images", []).append(_image(block, at))
        elif kind == "thinking":
            message["thinking"] = message.get("thinking", "") + str(block.get("thinking") or "")
        elif kind == "tool_use":
            message.setdefault("tool_calls", []).append(_call(block, at, names))
        elif kind == "tool_result":
            results.append(_result(block, at, names))
    keep = message["content"] or message.get("images") or message.get("tool_calls")
    keep = keep or (role == "assistant" and message.get("thinking"))
    return results + ([message] if keep or not results else [])


_USER_BLOCKS = ("text", "image", "tool_result")
_ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")


def _image(block: dict[str, Any], where: str) -> str:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind != "base64" or not isinstance(source, dict):
        raise InputError(
            f"{where}.source: image sources of type {kind!r} are not supported; send the "
            'image inline ({"type": "base64", "media_type": ..., "data": ...})'
        )
    data = source.get("data")
    if not isinstance(data, str):
        raise InputError(f"{where}.source.data: must be a base64 string")
    return data


def _call(block: dict[str, Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    ident, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(ident, str) or not isinstance(name, str) or not name:
        raise InputError(f"{where}: a tool_use block needs an id and a name")
    if not isinstance(arguments, dict):
        raise InputError(f"{where}.input: must be an object")
    names[ident] = name
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}


def _result(block: dict[str, Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    ident = block.get("tool_use_id")
    if not isinstance(ident, str):
        raise InputError(f"{where}.tool_use_id: Field required")
    content = block.get("content")
    message: dict[str, Any] = {"role": "tool", "tool_call_id": ident}
    message["tool_name"] = names.get(ident, "")
    if content is None or isinstance(content, str):
        message["content"] = content or ""
        return message
    if not isinstance(content, list):
        raise InputError(f"{where}.content: must be a string or an array of blocks")
    texts = []
    for k, part in enumerate(content):
        at = f"{where}.content.{k}"
        if isinstance(part, dict) and part.get("type") == "image":
            message.setdefault("images", []).append(_image(part, at))
        else:
            texts.append(_text_block(part, at))
    message["content"] = "\n".join(texts)
    return message
