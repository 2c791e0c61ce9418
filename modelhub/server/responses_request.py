"""A ``/v1/responses`` request as the chat completion it stands for, and its input as items.

``input`` (text or items) becomes items with ids (what ``input_items`` lists and a stored
response keeps); the conversation a request continues (``previous_response_id``) comes first;
the items become chat messages: ``message`` items (``input_image`` and ``input_audio`` parts as
the chat's ``image_url`` and ``input_audio`` parts, which ``server.images`` turns into the
message's ``images``),
``function_call`` items as an assistant turn's ``tool_calls`` (parallel calls in one turn),
``function_call_output`` as ``tool`` messages, and ``reasoning`` items as the ``thinking`` of
the assistant turn that follows them (the template decides whether to show it again).
``instructions``, ``tools`` and the sampling fields belong to the request alone: a continued
conversation does not inherit them, as OpenAI's API.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema

from modelhub.errors import InputError
from modelhub.server.audio import openai_audio
from modelhub.server.images import image_url_data
from modelhub.server.openai_models import ChatFields, OpenAIBody, chat_fields

_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}
TRUNCATION = ("disabled", "auto")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


# ---- the body -----------------------------------------------------------------------------
def _refused(name: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if value:
            raise InputError(
                f"{name} is not supported: use previous_response_id, or send the "
                "whole conversation in input"
            )
        return value

    return BeforeValidator(check)


def _checked(check: Callable[[Any], bool], message: str) -> BeforeValidator:
    def validate(value: Any) -> Any:
        if not check(value):
            raise InputError(message)
        return value

    return BeforeValidator(validate)


def _text_format(text: Any) -> Any:
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if not isinstance(text, dict) or (fmt is not None and kind not in _FORMATS):
        raise InputError('text.format must be {"type": "text"}, "json_object" or "json_schema"')
    return text


_FORMATS = ("text", "json_object", "json_schema")
_OBJ: dict[str, Any] = {"type": "object"}
_STR = {"type": "string"}
_INPUT = {"oneOf": [{"type": "string"}, {"type": "array", "items": _OBJ}]}


class ResponsesBody(OpenAIBody):
    """A ``/v1/responses`` body: ``input`` read into items with ids as it is parsed, the other
    fields checked and kept as sent (the response echoes them), plus the extensions of
    /v1/chat/completions (``keep_alive``, ``options``, ``draft``, ``draft_num_predict``,
    ``top_k``). :meth:`chat` is the chat request it stands for."""

    input: Annotated[
        list[dict[str, Any]], BeforeValidator(lambda v: _input_items(v)), WithJsonSchema(_INPUT)
    ]
    instructions: Annotated[
        str | None, _checked(lambda v: isinstance(v, str), "instructions must be a string")
    ] = None
    previous_response_id: Annotated[
        str | None,
        _checked(
            lambda v: isinstance(v, str) and bool(v),
            "previous_response_id must be a response id (resp_...)",
        ),
    ] = None
    store: Annotated[
        bool, _checked(lambda v: isinstance(v, bool), "store must be true or false")
    ] = True
    truncation: Annotated[
        Literal["disabled", "auto"],
        _checked(
            lambda v: v in TRUNCATION, 'truncation must be "disabled" (the default) or "auto"'
        ),
    ] = "disabled"
    tools: Annotated[list[dict[str, Any]], BeforeValidator(lambda v: _tools(v))] = Field(
        default_factory=list
    )  # as sent (the response echoes them); :func:`_tool` makes them the chat's
    tool_choice: Annotated[Any, WithJsonSchema({"oneOf": [{"type": "string"}, _OBJ]})] = None
    reasoning: dict[str, Any] | None = None
    text: Annotated[dict[str, Any] | None, BeforeValidator(_text_format)] = None
    max_output_tokens: Annotated[
        int | None,
        _checked(
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
            "max_output_tokens must be a positive integer",
        ),
        WithJsonSchema({"type": "integer", "minimum": 1}),
    ] = None
    temperature: Annotated[Any, WithJsonSchema({"type": "number"})] = None
    top_p: Annotated[Any, WithJsonSchema({"type": "number"})] = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    background: Annotated[Any, _refused("background"), WithJsonSchema({"type": "boolean"})] = None
    conversation: Annotated[Any, _refused("conversation"), WithJsonSchema(_OBJ)] = None
    # passed to the chat request as they are (checked there, as on /v1/chat/completions)
    seed: Annotated[Any, WithJsonSchema({"type": "integer"})] = None
    stop: Annotated[Any, WithJsonSchema({"oneOf": [{"type": "string"}, {"type": "array"}]})] = None
    keep_alive: Annotated[
        Any, WithJsonSchema({"oneOf": [{"type": "string"}, {"type": "number"}]})
    ] = None
    options: Annotated[Any, WithJsonSchema(_OBJ)] = None
    draft: Annotated[Any, WithJsonSchema({"type": "string"})] = None
    draft_num_predict: Annotated[Any, WithJsonSchema({"type": "integer"})] = None
    top_k: Annotated[Any, WithJsonSchema({"type": "integer"})] = None

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {**super().prepare(data), "input": data.get("input")}

    def chat(self, context: list[dict[str, Any]] | None = None) -> ChatFields:
        """The chat-completions request: this body's input after the ``context`` it
        continues (a stored conversation's items)."""
        return chat_fields(chat_request(self, context))


def _input_items(raw: Any) -> list[dict[str, Any]]:
    """``input`` as items, each with an ``id`` (kept when the client gave one) and message
    content as parts."""
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    elif raw is None:
        raise InputError("input is required: a string or an array of input items")
    items = []
    for i, item in enumerate(_list(raw, "input")):
        if not isinstance(item, dict):
            raise InputError(f"input[{i}] must be an object")
        kind = str(item.get("type", "message"))
        out = {"type": kind, **item}
        if kind == "message":
            out["content"] = _parts(item.get("content"), item.get("role"), f"input[{i}]")
            out.setdefault("status", "completed")
        if not isinstance(out.get("id"), str) or not out["id"]:
            out["id"] = new_id(_PREFIX.get(kind, "item_"))
        items.append(out)
    return items


def _parts(content: Any, role: Any, where: str) -> Any:
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        part: dict[str, Any] = {"type": kind, "text": content}
        if kind == "output_text":
            part["annotations"] = []
        return [part]
    return content  # checked when it becomes a message


# ---- items -> the chat request -------------------------------------------------------------
def chat_request(
    body: ResponsesBody, context: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The chat-completions request of a Responses body (before it is parsed as one)."""
    out: dict[str, Any] = {"messages": _messages(body.instructions, body.input, context or [])}
    # The last five are extensions, as on /v1/chat/completions.
    for key in _PASSED:
        out[key] = getattr(body, key)
    out["max_tokens"] = body.max_output_tokens
    out["tools"] = [_tool(t, i) for i, t in enumerate(body.tools)] or None
    out["tool_choice"] = body.tool_choice  # every API reads every shape (reply_options)
    if body.reasoning is not None:
        out["reasoning_effort"] = body.reasoning.get("effort")
    out["truncate"] = body.truncation == "auto"  # OpenAI's default: refuse what does not fit
    fmt = body.text.get("format") if body.text is not None else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {"schema": fmt.get("schema")}
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    return {k: v for k, v in out.items() if v is not None}


_PASSED = (
    "temperature",
    "top_p",
    "seed",
    "stop",
    "keep_alive",
    "options",
    "draft",
    "draft_num_predict",
    "top_k",
)


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(f"{name} must be an array")
    return value


def _messages(
    instructions: str | None, items: list[dict[str, Any]], context: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    thinking: list[str] = []  # reasoning waiting for the assistant turn it belongs to
    for i, item in enumerate(context):
        _add_item(messages, item, f"previous_response_id: item {i}", thinking)
    for i, item in enumerate(items):
        _add_item(messages, item, f"input[{i}]", thinking)
    if not any(m["role"] != "system" for m in messages):
        raise InputError("input has no message to answer")
    return messages


def _add_item(
    messages: list[dict[str, Any]], item: dict[str, Any], where: str, thinking: list[str]
) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InputError(f"{where}.role must be user, assistant, system or developer")
        message = {"role": role, "content": _content(item.get("content"), where)}
        if role == "assistant" and thinking:
            message["reasoning_content"] = "".join(thinking)
            thinking.clear()
        messages.append(message)
    elif kind == "function_call":
        call = {
            "id": str(item.get("call_id") or item.get("id") or ""),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and not thinking:
            last.setdefault("tool_calls", []).append(call)  # the turn's text, or parallel calls
        else:
            turn: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            if thinking:
                turn["reasoning_content"] = "".join(thinking)
                thinking.clear()
            messages.append(turn)
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else json.dumps(output)
        messages.append(
            {"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text}
        )
    elif kind == "reasoning":
        thinking.append(_reasoning_text(item))
    else:
        raise InputError(f"{where}: input items of type {kind!r} are not supported")


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``reasoning_text`` content, else its summary."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(
                str(p.get("text", ""))
                for p in parts
                if isinstance(p, dict) and p.get("type") == kind
            )
            if text:
                return text
    return ""


def _content(content: Any, where: str) -> Any:
    """A message item's content as chat-completions content: its text, or, with
    ``input_image`` or ``input_audio`` parts, text and then ``image_url`` and ``input_audio``
    parts in their order (``server.images`` reads those into the message's ``images``, as on
    /v1/chat/completions)."""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    for j, part in enumerate(_list(content, f"{where}.content")):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind in ("input_text", "output_text", "text"):
            texts.append(str(part.get("text", "")))
        elif kind == "input_image":
            images.append(_image(part, f"{where}.content[{j}]"))
        elif kind == "input_audio":
            images.append(_audio(part, f"{where}.content[{j}]"))
        else:
            raise InputError(
                f"{where}: content parts of type {kind!r} are not supported "
                "(input_text, input_image and input_audio)"
            )
    if not images:
        return "".join(texts)
    return [{"type": "text", "text": "".join(texts)}, *images]


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``input_image`` part as a chat ``image_url`` part: a data: URL (checked here, so
    that errors name the input item); a ``file_id`` is refused (there is no Files API)."""
    if part.get("file_id") is not None and part.get("image_url") is None:
        raise InputError(
            f"{where}: input_image with a file_id is not supported (this server has no Files "
            'API); send the image inline: {"type": "input_image", "image_url": '
            '"data:image/png;base64,..."}'
        )
    data = image_url_data(part.get("image_url"), where)
    return {"type": "image_url", "image_url": {"url": f"data:;base64,{data}"}}


def _audio(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``input_audio`` part (``{"input_audio": {"data", "format"}}``, as the chat's; the
    older flat ``{"data", "format"}`` too) as a chat ``input_audio`` part, checked here so
    that errors name the input item."""
    body = part.get("input_audio")
    if body is None and "data" in part:
        body = {"data": part.get("data"), "format": part.get("format")}
    chat = {"type": "input_audio", "input_audio": body}
    data = openai_audio(chat, where)
    fmt = body.get("format") if isinstance(body, dict) else None
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def _tools(tools: Any) -> list[dict[str, Any]]:
    for index, tool in enumerate(_list(tools, "tools")):
        _tool(tool, index)
    return list(tools)


def _tool(tool: Any, index: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise InputError(f"tools[{index}]: only function tools are supported, not {kind!r}")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}
