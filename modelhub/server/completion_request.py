"""A generating /v1 request, read, rendered and run: the path every OpenAI-shaped API shares.

``chat_setup`` reads a chat-completions body (messages with text and image parts, tools,
reasoning, ``response_format``, truncation) into a ``Setup``: the rendered prompt, grammar,
reply parser and truncation; /v1/responses and /v1/messages translate their requests to it, and
/v1/completions builds its own. ``completion_events`` runs a ``Setup`` on the model's runner with
the body's sampling fields (OpenAI's names and defaults: temperature and top_p 1.0, mapped to
Ollama's options by ``ollama_options``) and ``prediction``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from modelhub.errors import InputError
from modelhub.library.views import ModelView
from modelhub.replies.reply import ReplyParser, ReplyPart
from modelhub.runtime.planning import keep_alive_seconds
from modelhub.server import logprobs
from modelhub.server.generation import run_on_runner
from modelhub.server.images import (
    MEDIA_PART_TYPES,
    RequestImages,
    can_see,
    mark,
    openai_images,
    prepare,
)
from modelhub.server.prompts import chat_prompt
from modelhub.server.reply_options import (
    Think,
    reply_parser,
    request_grammar,
    thinking,
    tool_plan,
)
from modelhub.server.requests import THINK_LEVELS, field
from modelhub.server.state import ServerState
from modelhub.server.truncation import ChatFit

Event = dict[str, Any]


@dataclass(frozen=True)
class Setup:
    """A read and rendered generation request: its prompt, grammar, reply parser, truncation
    and log-probabilities."""

    text: str
    grammar: str | None
    parser: ReplyParser | None
    fit: ChatFit | None
    top: int | None
    images: RequestImages = dataclasses.field(default_factory=RequestImages)
    image_todo: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def parse(self, text: str) -> ReplyPart:
        return self.parser.feed(text) if self.parser is not None else ReplyPart(content=text)

    def finish(self) -> ReplyPart:
        return self.parser.finish() if self.parser is not None else ReplyPart()


def chat_setup(
    state: ServerState,
    view: ModelView,
    data: dict[str, Any],
    messages: list[dict[str, Any]] | None = None,
) -> Setup:
    """A chat-completions request (also what /v1/responses and /v1/messages translate to),
    rendered; ``messages``, when given, are already in the template's form (/v1/messages)."""
    think = thinking(view, _think(data))
    tooling = tool_plan(view, field(data, "tools", list, []), data.get("tool_choice"))
    messages = _chat_messages(data) if messages is None else messages
    images = RequestImages()
    messages, todo = mark(images, messages, 0)
    text = chat_prompt(state, view, messages, tooling.tools, think=think)
    grammar = request_grammar(
        data, ollama_format(data), tooling.grammar, format_field="response_format"
    )
    fit = ChatFit(  # Ollama's truncate, honoured here too (default true)
        messages,
        lambda kept: chat_prompt(state, view, kept, tooling.tools, think=think),
        truncate=field(data, "truncate", bool, True),
        count_fields=images.count_fields,  # images are decoded before the fit counts
    )
    parser = reply_parser(view, text, think, tooling.tools)
    return Setup(text, grammar, parser, fit, logprobs.requested(data), images, todo)


async def completion_events(
    state: ServerState, request_data: dict[str, Any], setup: Setup, view: Any, started: int
) -> AsyncIterator[Event]:
    """The runner's events for a set-up request (metrics recorded at the end)."""
    prompt_text, grammar, fit, top_logprobs = setup.text, setup.grammar, setup.fit, setup.top
    predicted = _prediction(request_data)
    await prepare(setup.images, setup.image_todo, can_see(view), view.name.display)
    p = state.plan(
        view,
        ollama_options(request_data),
        prediction=bool(predicted),
    )
    options = p.options if top_logprobs is None else {**p.options, "top_logprobs": top_logprobs}
    msg = {
        "op": "generate",
        "prompt": prompt_text,
        "options": options,
        "grammar": grammar,
        "prediction": predicted,
        **setup.images.runner_fields(),
    }
    keep_alive = keep_alive_seconds(request_data.get("keep_alive"))
    prompt_tokens = 0
    async for ev in run_on_runner(state, p, keep_alive, msg, started, fit):
        if ev.get("event") == "prompt":
            prompt_tokens = int(ev.get("prompt_tokens") or 0)
        if ev.get("event") == "done":
            ev["result"]["prompt_tokens"] = prompt_tokens
            state.metrics.record(view.name.display, ev["result"])
        yield ev


def _chat_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI messages -> the template's: assistant ``tool_calls`` and reasoning
    (``reasoning_content`` or ``reasoning``) kept, a ``tool`` result named after the call its
    ``tool_call_id`` answers."""
    raw = data.get("messages")
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
            "content": _content_text(m.get("content"), f"messages[{i}]"),
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


def _content_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise InputError(f"{where}: content parts must be objects")
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") not in MEDIA_PART_TYPES:  # images, audio: _chat_messages
                raise InputError(
                    f"{where}: content part type {part.get('type')!r} is not supported"
                )
        return "".join(texts)
    raise InputError(f"{where}: content must be a string or an array of parts")


def ollama_options(data: dict[str, Any]) -> dict[str, Any]:
    """The body's sampling fields (OpenAI's names and defaults) as Ollama's ``options``."""
    opts: dict[str, Any] = {
        "temperature": field(data, "temperature", float, 1.0),
        "top_p": field(data, "top_p", float, 1.0),
        "frequency_penalty": field(data, "frequency_penalty", float, 0.0),
        "presence_penalty": field(data, "presence_penalty", float, 0.0),
    }
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InputError("max_tokens must be a positive integer")
        opts["num_predict"] = max_tokens
    if data.get("seed") is not None:
        opts["seed"] = field(data, "seed", int, 0)
    stop = data.get("stop")
    if isinstance(stop, str):
        opts["stop"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        opts["stop"] = stop
    elif stop is not None:
        raise InputError("stop must be a string or an array of strings")
    for key in ("draft", "draft_num_predict", "top_k"):  # extensions, as in ``options``
        if data.get(key) is not None:
            opts[key] = data[key]
    return opts


def ollama_format(data: dict[str, Any]) -> Any:
    """``response_format`` as Ollama's ``format``: None, "json" or a JSON schema."""
    rf = data.get("response_format")
    if rf is None:
        return None
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


def _prediction(data: dict[str, Any]) -> str | None:
    pred = data.get("prediction")
    if pred is None:
        return None
    if not isinstance(pred, dict) or pred.get("type") != "content":
        raise InputError('prediction must be {"type": "content", "content": ...}')
    return _content_text(pred.get("content"), "prediction")


def _think(data: dict[str, Any]) -> Think:
    """``reasoning_effort`` (OpenAI's; "none" turns reasoning off) or ``think`` (Ollama's)."""
    effort = data.get("reasoning_effort")
    if effort is None:
        think = data.get("think")
        if think is None or isinstance(think, bool) or think in THINK_LEVELS:
            return think
        raise InputError('think must be true, false, "low", "medium", "high" or "max"')
    if effort in _EFFORTS:  # OpenAI's scale clamped to Ollama's levels, as Ollama's /v1
        return _EFFORTS[effort]
    raise InputError(
        'reasoning_effort must be "none", "minimal", "low", "medium", "high", "xhigh", '
        '"ultra" or "max"'
    )


_EFFORTS: dict[Any, Think] = {
    "none": False,
    "minimal": "low",
    **{level: level for level in THINK_LEVELS},
    "xhigh": "max",
    "ultra": "max",
}
