"""OpenAI's Responses API (``POST /v1/responses``), served as a chat completion.

The request (``input`` as text or items, ``instructions``, function ``tools``, ``tool_choice``,
``text.format``, ``reasoning.effort``, ``max_output_tokens``) is translated into the
chat-completions request it means and runs through the same path (templates, thinking, tool
calls, grammars, truncation); the reply comes back as Responses output items: ``reasoning``,
``message`` and ``function_call``, streamed as the typed events the SDKs read. Nothing is
stored: ``previous_response_id`` is refused, and a conversation goes back whole in ``input``
(function calls and their ``function_call_output`` included).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from modelhub.errors import InputError, ModelhubError
from modelhub.replies.reply import ReplyPart
from modelhub.replies.tool_calls import ToolCall
from modelhub.server.errors import error_body
from modelhub.server.generation import chained, collect
from modelhub.server.jsonbody import JSONResponse, sse
from modelhub.server.lookup import find_model
from modelhub.server.requests import read_model_request
from modelhub.server.routes_openai import chat_setup, completion_events
from modelhub.server.state import get_state

router = APIRouter()
Event = dict[str, Any]


# ---- the request, as a chat completion ----------------------------------------------------------
def chat_request(data: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Responses request stands for."""
    if data.get("previous_response_id"):
        raise InputError(
            "previous_response_id is not supported: modelhub stores no responses; "
            "send the whole conversation in input"
        )
    out: dict[str, Any] = {"messages": _messages(data)}
    for key in ("temperature", "top_p", "seed", "stop", "keep_alive", "options"):
        if data.get(key) is not None:
            out[key] = data[key]
    if data.get("max_output_tokens") is not None:
        out["max_tokens"] = data["max_output_tokens"]
    if data.get("tools"):
        out["tools"] = [_tool(t, i) for i, t in enumerate(_list(data["tools"], "tools"))]
    if data.get("tool_choice") is not None:  # every API reads every shape (reply_options)
        out["tool_choice"] = data["tool_choice"]
    reasoning = data.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        out["reasoning_effort"] = reasoning["effort"]
    fmt = (data.get("text") or {}).get("format") if isinstance(data.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"schema": fmt.get("schema")},
        }
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise InputError('text.format must be {"type": "text"}, "json_object" or "json_schema"')
    return out


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(f"{name} must be an array")
    return value


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = data.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InputError("instructions must be a string")
        messages.append({"role": "system", "content": instructions})
    raw = data.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif raw is None:
        raise InputError("input is required: a string or an array of input items")
    else:
        for i, item in enumerate(_list(raw, "input")):
            _add_item(messages, item, f"input[{i}]")
    if not any(m["role"] != "system" for m in messages):
        raise InputError("input has no message to answer")
    return messages


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise InputError(f"{where} must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InputError(f"{where}.role must be user, assistant, system or developer")
        messages.append({"role": role, "content": _text(item.get("content"), where)})
    elif kind == "function_call":
        call = {
            "id": str(item.get("call_id") or item.get("id") or ""),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)  # parallel calls: one assistant turn
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else json.dumps(output)
        messages.append(
            {"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text}
        )
    elif kind == "reasoning":
        return  # earlier reasoning is not shown to the model again
    else:
        raise InputError(f"{where}: input items of type {kind!r} are not supported")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in _list(content, f"{where}.content"):
        if not isinstance(part, dict) or part.get("type") not in (
            "input_text",
            "output_text",
            "text",
        ):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InputError(
                f"{where}: content parts of type {kind!r} are not supported (text only)"
            )
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _tool(tool: Any, index: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise InputError(f"tools[{index}]: only function tools are supported, not {kind!r}")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


# ---- the reply, as output items -----------------------------------------------------------------
@dataclass
class _Reply:
    """One response being built: its ids, output items and the stream's sequence numbers."""

    model: str
    request: dict[str, Any]
    ident: str = field(default_factory=lambda: "resp_" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
    output: list[dict[str, Any]] = field(default_factory=list)
    sequence: int = 0
    open_kind: str | None = None  # the item being streamed: "reasoning" or "message"

    def event(self, kind: str, **body: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **body}
        self.sequence += 1
        return f"event: {kind}\n".encode() + sse(payload)

    def response(self, status: str, result: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.ident,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": self.output,
            "instructions": self.request.get("instructions"),
            "tools": self.request.get("tools") or [],
            "tool_choice": self.request.get("tool_choice") or "auto",
            "parallel_tool_calls": True,
            "temperature": self.request.get("temperature", 1.0),
            "top_p": self.request.get("top_p", 1.0),
            "max_output_tokens": self.request.get("max_output_tokens"),
            "previous_response_id": None,
            "store": False,
            "text": self.request.get("text") or {"format": {"type": "text"}},
            "error": None,
            "incomplete_details": None,
            "metadata": {},
            "usage": None,
        }
        if result is not None:
            prompt = int(result.get("prompt_tokens") or result.get("prompt_eval_count") or 0)
            generated = int(result.get("eval_count") or 0)
            body["usage"] = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": generated,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + generated,
            }
            if result.get("done_reason") == "length":
                body["status"] = "incomplete"
                body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body


def _reasoning_item(text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": "rs_" + secrets.token_hex(12),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    )
    return {
        "type": "message",
        "id": "msg_" + secrets.token_hex(12),
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + secrets.token_hex(12),
        "call_id": call.id,
        "name": call.name,
        "arguments": json.dumps(call.arguments, ensure_ascii=False),
        "status": "completed",
    }


def _whole(reply: _Reply, part: ReplyPart) -> None:
    """The output items of a finished, unstreamed reply."""
    if part.thinking:
        reply.output.append(_reasoning_item(part.thinking))
    if part.content or not part.calls:
        reply.output.append(_message_item(part.content))
    reply.output.extend(_call_item(c) for c in part.calls)


class _Streamer:
    """Reply parts -> the Responses stream's events, items opened and closed as they come."""

    def __init__(self, reply: _Reply) -> None:
        self.reply = reply
        self.text = ""

    def part(self, part: ReplyPart) -> list[bytes]:
        out: list[bytes] = []
        if part.thinking:
            out += self._open("reasoning")
            out.append(self._delta("response.reasoning_text.delta", part.thinking))
        if part.content:
            out += self._open("message")
            out.append(self._delta("response.output_text.delta", part.content))
        for call in part.calls:
            out += self._close()
            item = _call_item(call)
            index = len(self.reply.output)
            self.reply.output.append(item)
            added = {**item, "arguments": "", "status": "in_progress"}
            out.append(
                self.reply.event("response.output_item.added", output_index=index, item=added)
            )
            ids = {"item_id": item["id"], "output_index": index}
            out.append(
                self.reply.event(
                    "response.function_call_arguments.delta", **ids, delta=item["arguments"]
                )
            )
            out.append(
                self.reply.event(
                    "response.function_call_arguments.done", **ids, arguments=item["arguments"]
                )
            )
            out.append(self.reply.event("response.output_item.done", output_index=index, item=item))
        return out

    def _open(self, kind: str) -> list[bytes]:
        if self.reply.open_kind == kind:
            return []
        out = self._close()
        item = _reasoning_item("") if kind == "reasoning" else _message_item("", "in_progress")
        if kind == "reasoning":
            item = {**item, "content": [], "status": "in_progress"}
        index = len(self.reply.output)
        self.reply.output.append(item)
        self.reply.open_kind, self.text = kind, ""
        out.append(self.reply.event("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                self.reply.event(
                    "response.content_part.added", **self._ids(), content_index=0, part=part
                )
            )
        return out

    def _ids(self) -> dict[str, Any]:
        index = len(self.reply.output) - 1
        return {"item_id": self.reply.output[index]["id"], "output_index": index}

    def _delta(self, kind: str, text: str) -> bytes:
        self.text += text
        return self.reply.event(kind, **self._ids(), content_index=0, delta=text)

    def _close(self) -> list[bytes]:
        kind, self.reply.open_kind = self.reply.open_kind, None
        if kind is None:
            return []
        index = len(self.reply.output) - 1
        ids = self._ids()
        if kind == "reasoning":
            done = _reasoning_item(self.text) | {"id": ids["item_id"]}
            out = [
                self.reply.event(
                    "response.reasoning_text.done", **ids, content_index=0, text=self.text
                )
            ]
        else:
            done = _message_item(self.text) | {"id": ids["item_id"]}
            part = done["content"][0]
            out = [
                self.reply.event(
                    "response.output_text.done", **ids, content_index=0, text=self.text
                ),
                self.reply.event("response.content_part.done", **ids, content_index=0, part=part),
            ]
        self.reply.output[index] = done
        out.append(self.reply.event("response.output_item.done", output_index=index, item=done))
        return out

    def finish(self, result: dict[str, Any]) -> list[bytes]:
        out = self._close()
        if not self.reply.output:  # an empty answer is still a message
            out += self._open("message") + self._close()
        response = self.reply.response("completed", result)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return [*out, self.reply.event(kind, response=response)]


@router.post("/v1/responses")
async def responses(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_model_request(request, stream_default=False, alias=False)
    chat = chat_request(req.data)
    view = await find_model(state, req.model)
    setup = chat_setup(state, view, chat)
    events = completion_events(state, chat, setup, view, started)
    head = await collect(events, request, first_token_only=req.stream)

    reply = _Reply(req.model, req.data)
    if not req.stream:
        whole, result = ReplyPart(), {}
        async for ev in chained(head, events):
            if ev.get("event") == "token":
                whole.add(setup.parse(str(ev.get("text", ""))))
            elif ev.get("event") == "done":
                result = ev["result"]
        whole.add(setup.finish())
        _whole(reply, whole)
        return JSONResponse(reply.response("completed", result))
    return StreamingResponse(
        _streamed(reply, setup, chained(head, events)), media_type="text/event-stream"
    )


async def _streamed(
    reply: _Reply, setup: Any, events: AsyncIterator[Event]
) -> AsyncIterator[bytes]:
    streamer = _Streamer(reply)
    yield reply.event("response.created", response=reply.response("in_progress"))
    yield reply.event("response.in_progress", response=reply.response("in_progress"))
    try:
        async for ev in events:
            if ev.get("event") == "token":
                for chunk in streamer.part(setup.parse(str(ev.get("text", "")))):
                    yield chunk
            elif ev.get("event") == "done":
                for chunk in streamer.part(setup.finish()):
                    yield chunk
                for chunk in streamer.finish(ev["result"]):
                    yield chunk
    except ModelhubError as exc:
        yield reply.event("error", **error_body(exc, "openai")["error"])
