"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

Defaults follow the OpenAI API (temperature and top_p 1.0, no streaming unless asked). Usage
reports speculative decoding as OpenAI does for Predicted Outputs:
``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``.
Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import secrets
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from modelhub.engine.grammar import format_grammar
from modelhub.errors import InputError, ModelhubError
from modelhub.runtime.planning import keep_alive_seconds, plan
from modelhub.server import schemas
from modelhub.server.embedding import embed_texts, input_texts, normalise
from modelhub.server.errors import error_body
from modelhub.server.generation import collect, run_on_runner
from modelhub.server.lookup import find_model
from modelhub.server.prompts import chat_prompt, generate_prompt
from modelhub.server.requests import field, read_model_request
from modelhub.server.state import ServerState, get_state

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
            else:
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


def _finish(result: dict[str, Any]) -> str:
    return "length" if result.get("done_reason") == "length" else "stop"


async def _events(
    state: ServerState, request_data: dict[str, Any], prompt_text: str, view: Any, started: int
) -> AsyncIterator[Event]:
    predicted = _prediction(request_data)
    p = plan(
        view,
        _options(request_data),
        num_threads=state.settings.num_threads,
        prediction=bool(predicted),
    )
    msg = {
        "op": "generate",
        "prompt": prompt_text,
        "options": p.options,
        "grammar": format_grammar(_format(request_data)),
        "prediction": predicted,
    }
    keep_alive = keep_alive_seconds(request_data.get("keep_alive"))
    prompt_tokens = 0
    async for ev in run_on_runner(state, p, keep_alive, msg, started):
        if ev.get("event") == "prompt":
            prompt_tokens = int(ev.get("prompt_tokens") or 0)
        if ev.get("event") == "done":
            ev["result"]["prompt_tokens"] = prompt_tokens
            state.metrics.record(view.name.display, ev["result"])
        yield ev


@dataclass(frozen=True)
class _Completion:
    """One read and rendered /v1 completion request: what every reply object repeats."""

    chat: bool
    model: str
    prompt: str  # the rendered text the model is given
    stream: bool
    include_usage: bool
    ident: str = dataclasses.field(default_factory=lambda: secrets.token_hex(6))
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

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
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InputError("messages must be a non-empty array")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InputError(f"messages[{i}] must be an object")
        role = str(m.get("role", "")).lower()
        role = "system" if role == "developer" else role
        if role not in ("system", "user", "assistant", "tool"):
            raise InputError(f"messages[{i}].role {m.get('role')!r} is not supported")
        messages.append(
            {"role": role, "content": _content_text(m.get("content"), f"messages[{i}]")}
        )
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
        tools = field(data, "tools", list, []) or None
        text = chat_prompt(state, view, _chat_messages(data), tools)
    else:
        suffix = field(data, "suffix", str, "")
        text = generate_prompt(state, view, _completion_prompt(data), suffix=suffix)
    usage_wanted = bool(field(data, "stream_options", dict, {}).get("include_usage"))
    c = _Completion(chat, req.model, text, req.stream, usage_wanted)
    events = _events(state, data, text, view, started)
    # Up to the first token (or everything, unstreamed): errors keep their status.
    head = await collect(events, request, first_token_only=c.stream)

    async def all_events() -> AsyncIterator[Event]:
        for ev in head:
            yield ev
        async for ev in events:
            yield ev

    if not c.stream:
        return await _unstreamed(c, all_events())
    return StreamingResponse(_streamed(c, all_events()), media_type="text/event-stream")


async def _unstreamed(c: _Completion, events: AsyncIterator[Event]) -> Response:
    parts: list[str] = []
    result: dict[str, Any] = {}
    async for ev in events:
        if ev.get("event") == "token":
            parts.append(str(ev.get("text", "")))
        elif ev.get("event") == "done":
            result = ev["result"]
    text = "".join(parts)
    choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(result)}
    if c.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
        choice["logprobs"] = None
    return JSONResponse(c.envelope(False, choices=[choice], usage=_usage(result)))


def _chunk(c: _Completion, text: str | None, finish: str | None, first: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if c.chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return c.envelope(True, choices=[choice])


async def _streamed(c: _Completion, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    first = True
    try:
        async for ev in events:
            if ev.get("event") == "token":
                yield _sse(_chunk(c, str(ev.get("text", "")), None, first))
                first = False
            elif ev.get("event") == "done":
                result = ev["result"]
                yield _sse(_chunk(c, None, _finish(result), first))
                if c.include_usage:
                    yield _sse(c.envelope(True, choices=[], usage=_usage(result)))
    except ModelhubError as exc:
        yield _sse(error_body(exc, "openai"))
    yield b"data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


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
