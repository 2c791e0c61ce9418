"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

Defaults follow the OpenAI API (temperature and top_p 1.0, no streaming unless asked). Usage
reports speculative decoding as OpenAI does for Predicted Outputs:
``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``.
Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from modelhub.errors import InputError, ModelhubError
from modelhub.library.views import ModelView
from modelhub.replies.reply import ReplyParser, ReplyPart
from modelhub.runtime.planning import keep_alive_seconds
from modelhub.server import logprobs, schemas
from modelhub.server.embedding import embed_texts, input_texts, normalise
from modelhub.server.errors import error_body
from modelhub.server.generation import chained, collect, fitted_prompt, run_on_runner
from modelhub.server.images import RequestImages, can_see, mark, openai_images, prepare
from modelhub.server.jsonbody import JSONResponse, sse
from modelhub.server.lookup import find_model
from modelhub.server.prompts import chat_prompt, generate_prompt
from modelhub.server.reply_options import (
    Think,
    reply_parser,
    request_grammar,
    thinking,
    tool_plan,
)
from modelhub.server.requests import THINK_LEVELS, field, read_model_request
from modelhub.server.state import ServerState, get_state
from modelhub.server.truncation import ChatFit

router = APIRouter()

Event = dict[str, Any]


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
            elif part.get("type") != "image_url":  # images: see _chat_messages
                raise InputError(
                    f"{where}: content part type {part.get('type')!r} is not supported"
                )
        return "".join(texts)
    raise InputError(f"{where}: content must be a string or an array of parts")


def _options(data: dict[str, Any]) -> dict[str, Any]:
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


def _format(data: dict[str, Any]) -> Any:
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


def _usage(result: dict[str, Any]) -> dict[str, Any]:
    prompt = int(result.get("prompt_tokens") or result.get("prompt_eval_count") or 0)
    completion = int(result.get("eval_count") or 0)
    proposed = int(result.get("draft_count") or 0)
    accepted = int(result.get("draft_accepted_count") or 0)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": proposed - accepted,
        },
    }
    return usage


def _timings(result: dict[str, Any]) -> dict[str, Any]:
    """llama-server's ``timings`` object (milliseconds), with its draft counters."""
    prompt_ns = int(result.get("prompt_eval_duration_ns") or 0)
    eval_ns = int(result.get("eval_duration_ns") or 0)
    predicted = int(result.get("eval_count") or 0)
    return {
        "prompt_n": int(result.get("prompt_eval_count") or 0),
        "prompt_ms": prompt_ns / 1e6,
        "predicted_n": predicted,
        "predicted_ms": eval_ns / 1e6,
        "predicted_per_second": predicted / (eval_ns / 1e9) if eval_ns > 0 else 0.0,
        "draft_n": int(result.get("draft_count") or 0),
        "draft_n_accepted": int(result.get("draft_accepted_count") or 0),
    }


def _finish(result: dict[str, Any], called: bool = False) -> str:
    if called:
        return "tool_calls"
    return "length" if result.get("done_reason") == "length" else "stop"


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


async def completion_events(
    state: ServerState, request_data: dict[str, Any], setup: Setup, view: Any, started: int
) -> AsyncIterator[Event]:
    """The runner's events for a set-up request (metrics recorded at the end)."""
    prompt_text, grammar, fit, top_logprobs = setup.text, setup.grammar, setup.fit, setup.top
    predicted = _prediction(request_data)
    await prepare(setup.images, setup.image_todo, can_see(view), view.name.display)
    p = state.plan(
        view,
        _options(request_data),
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
    grammar = request_grammar(data, _format(data), tooling.grammar, format_field="response_format")
    fit = ChatFit(  # Ollama's truncate, honoured here too (default true)
        messages,
        lambda kept: chat_prompt(state, view, kept, tooling.tools, think=think),
        truncate=field(data, "truncate", bool, True),
        count_fields=images.count_fields,  # images are decoded before the fit counts
    )
    parser = reply_parser(view, text, think, tooling.tools)
    return Setup(text, grammar, parser, fit, logprobs.requested(data), images, todo)


@dataclass(frozen=True)
class _Completion:
    """One read and rendered /v1 completion request: what every reply object repeats."""

    chat: bool
    model: str
    stream: bool
    include_usage: bool
    setup: Setup  # the rendered request
    ident: str = dataclasses.field(default_factory=lambda: secrets.token_hex(6))
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def logprobs(self) -> int | None:
        """Alternatives per token; None: no log-probabilities."""
        return self.setup.top

    def parse(self, text: str) -> ReplyPart:
        return self.setup.parse(text)

    def finish(self) -> ReplyPart:
        return self.setup.finish()

    def envelope(self, chunk: bool, **rest: Any) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {
            "id": ("chatcmpl-" if self.chat else "cmpl-") + self.ident,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_modelhub",
            **rest,
        }


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


def _completion_prompt(data: dict[str, Any]) -> str:
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InputError("prompt must be a string")
    return prompt


async def _run(request: Request, chat: bool) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_model_request(request, stream_default=False, alias=False)
    data = req.data
    view = await find_model(state, req.model)
    if chat:
        setup = chat_setup(state, view, data)
    else:
        suffix = field(data, "suffix", str, "")
        text = generate_prompt(state, view, _completion_prompt(data), suffix=suffix)
        grammar = request_grammar(data, _format(data), format_field="response_format")
        setup = Setup(text, grammar, None, None, logprobs.completion_requested(data))
    usage_wanted = bool(field(data, "stream_options", dict, {}).get("include_usage"))
    c = _Completion(chat, req.model, req.stream, usage_wanted, setup)
    if setup.fit is not None and field(data, "_debug_render_only", bool, False):
        return await _rendered_only(state, view, data, c, setup.fit)
    events = completion_events(state, data, setup, view, started)
    # Up to the first token (or everything, unstreamed): errors keep their status.
    head = await collect(events, request, first_token_only=c.stream)

    if not c.stream:
        return await _unstreamed(c, chained(head, events))
    return StreamingResponse(_streamed(c, chained(head, events)), media_type="text/event-stream")


async def _rendered_only(
    state: ServerState, view: ModelView, data: dict[str, Any], c: _Completion, fit: ChatFit
) -> Response:
    """Ollama's ``_debug_render_only`` (as its /v1 answers it): an empty completion whose
    ``_debug_info.rendered_template`` is the prompt the model would be given, after
    truncation; nothing is generated (the model is loaded: its tokenizer counts)."""
    p = state.plan(view, _options(data))
    text = await fitted_prompt(state, p, keep_alive_seconds(data.get("keep_alive")), fit)
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": ""},
        "finish_reason": "stop",
        "logprobs": None,
    }
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    body = c.envelope(False, choices=[choice], usage=usage)
    return JSONResponse({**body, "_debug_info": {"rendered_template": text}})


def _message(part: ReplyPart, delta: bool) -> dict[str, Any]:
    """A chat ``message`` (or stream ``delta``) with reasoning and tool calls."""
    out: dict[str, Any] = {}
    if part.content or not delta:
        out["content"] = part.content if part.content or not part.calls else None
    if part.thinking:  # both names clients read: Ollama's (and vLLM's) and DeepSeek's
        out["reasoning"] = out["reasoning_content"] = part.thinking
    if part.calls:
        if delta:  # streamed calls carry their index (the SDKs assemble them by it)
            out["tool_calls"] = [{"index": c.index, **c.openai()} for c in part.calls]
        else:
            out["tool_calls"] = [c.openai() for c in part.calls]
    return out


async def _unstreamed(c: _Completion, events: AsyncIterator[Event]) -> Response:
    whole = ReplyPart()
    result: dict[str, Any] = {}
    raws: list[dict[str, Any]] = []
    async for ev in events:
        if ev.get("event") == "token":
            whole.add(c.parse(str(ev.get("text", ""))))
            if ev.get("logprob") is not None:
                raws.append(ev["logprob"])
        elif ev.get("event") == "done":
            result = ev["result"]
    whole.add(c.finish())
    text = whole.content
    choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(result, bool(whole.calls))}
    if c.chat:
        choice["message"] = {"role": "assistant", **_message(whole, delta=False)}
    else:
        choice["text"] = text
    choice["logprobs"] = _logprobs(c, raws, 0)
    body = c.envelope(False, choices=[choice], usage=_usage(result), timings=_timings(result))
    return JSONResponse(body)


def _logprobs(c: _Completion, raws: list[dict[str, Any]], offset: int) -> dict[str, Any] | None:
    """A choice's ``logprobs``: chat's ``content`` list, or the legacy arrays (text offsets
    counted from ``offset``)."""
    if c.logprobs is None:
        return None
    if c.chat:
        return {"content": [logprobs.entry(r) for r in raws], "refusal": None}
    return logprobs.completion_block(raws, offset)


def _chunk(
    c: _Completion,
    part: ReplyPart | None,
    finish: str | None,
    first: bool,
    raws: list[dict[str, Any]] | None = None,
    offset: int = 0,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if raws:
        choice["logprobs"] = _logprobs(c, raws, offset)
    if c.chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if part is not None:
            delta.update(_message(part, delta=True))
        choice["delta"] = delta
    else:
        choice["text"] = part.content if part is not None else ""
    return c.envelope(True, choices=[choice])


async def _streamed(c: _Completion, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    first = True
    called = False
    raws: list[dict[str, Any]] = []  # log-probabilities of tokens whose text is held back
    offset = 0  # legacy completions: where the next token's text starts
    try:
        async for ev in events:
            if ev.get("event") == "token":
                if ev.get("logprob") is not None:
                    raws.append(ev["logprob"])
                part = c.parse(str(ev.get("text", "")))
                if not part:
                    continue  # nothing to show yet (a marker or stop may be starting)
                called = called or bool(part.calls)
                yield _sse(_chunk(c, part, None, first, raws, offset))
                offset += sum(len(r["token"]) for r in raws)
                raws, first = [], False
            elif ev.get("event") == "done":
                result = ev["result"]
                part = c.finish()
                if part or raws:
                    called = called or bool(part.calls)
                    yield _sse(_chunk(c, part, None, first, raws, offset))
                    first = False
                last = _chunk(c, None, _finish(result, called), first)
                yield _sse({**last, "timings": _timings(result)})
                if c.include_usage:
                    yield _sse(c.envelope(True, choices=[], usage=_usage(result)))
    except ModelhubError as exc:
        yield _sse(error_body(exc, "openai"))
    yield b"data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> bytes:
    return sse(obj)


@router.post("/v1/chat/completions", openapi_extra=schemas.OPENAI_CHAT)
async def chat_completions(request: Request) -> Response:
    return await _run(request, chat=True)


@router.post("/v1/completions", openapi_extra=schemas.OPENAI_COMPLETION)
async def completions(request: Request) -> Response:
    return await _run(request, chat=False)


def _model_entry(name: str, modified: float) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(modified), "owned_by": "library"}


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    state = get_state(request)
    data = [_model_entry(m.name.display, m.modified) for m in state.store.list_models()]
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/models/{model:path}")
async def get_model(request: Request, model: str) -> Response:
    view = await find_model(get_state(request), model)
    return JSONResponse(_model_entry(view.name.display, view.stored.modified))


@router.post("/v1/embeddings", openapi_extra=schemas.OPENAI_EMBEDDINGS)
async def embeddings(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_model_request(request, stream_default=False, alias=False)
    texts = input_texts(req.data.get("input"), allow_empty=False)
    dims = field(req.data, "dimensions", int, 0)
    view = await find_model(state, req.model)
    vectors, count, _ = await embed_texts(state, view, texts, {}, None, started)
    if req.data.get("encoding_format") == "base64":
        items: list[Any] = [
            base64.b64encode(struct.pack(f"<{len(v)}f", *normalise(v, dims))).decode()
            for v in vectors
        ]
    else:
        items = [normalise(v, dims) for v in vectors]
    data = [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(items)]
    usage = {"prompt_tokens": count, "total_tokens": count}
    return JSONResponse({"object": "list", "data": data, "model": req.model, "usage": usage})
