"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

Defaults follow the OpenAI API (temperature and top_p 1.0, no streaming unless asked). Usage
reports speculative decoding as OpenAI does for Predicted Outputs:
``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``.
Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from modelhub.errors import BadRequest, ModelhubError, NotFound
from modelhub.runtime.planning import keep_alive_seconds, plan
from modelhub.server.generation import collect, run_on_runner
from modelhub.server.requests import field, read_json
from modelhub.server.routes_inference import (
    _normalise,
    chat_prompt,
    embed_texts,
    generate_prompt,
    load_view,
)
from modelhub.server.state import ServerState, get_state

router = APIRouter()

Event = dict[str, Any]


def openai_error(exc: ModelhubError) -> JSONResponse:
    kind = "invalid_request_error" if exc.status < 500 else "api_error"
    code = "model_not_found" if exc.status == 404 else None
    return JSONResponse(
        {"error": {"message": exc.message, "type": kind, "param": None, "code": code}},
        status_code=exc.status,
    )


def _content_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise BadRequest(f"{where}: content parts must be objects")
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            else:
                raise BadRequest(
                    f"{where}: content part type {part.get('type')!r} is not supported"
                )
        return "".join(texts)
    raise BadRequest(f"{where}: content must be a string or an array of parts")


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
            raise BadRequest("max_tokens must be a positive integer")
        opts["num_predict"] = max_tokens
    if data.get("seed") is not None:
        opts["seed"] = field(data, "seed", int, 0)
    stop = data.get("stop")
    if isinstance(stop, str):
        opts["stop"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        opts["stop"] = stop
    elif stop is not None:
        raise BadRequest("stop must be a string or an array of strings")
    return opts


def _format(data: dict[str, Any]) -> Any:
    rf = data.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise BadRequest("response_format must be an object")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be a JSON schema object")
        return schema
    raise BadRequest(f"response_format type {kind!r} is not supported")


def _prediction(data: dict[str, Any]) -> str | None:
    pred = data.get("prediction")
    if pred is None:
        return None
    if not isinstance(pred, dict) or pred.get("type") != "content":
        raise BadRequest('prediction must be {"type": "content", "content": ...}')
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
        "format": _format(request_data),
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


async def _run(request: Request, chat: bool) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    try:
        data = await read_json(request)
        model = field(data, "model", str, "").strip()
        if not model:
            raise BadRequest("model is required")
        view = await load_view(state, model)
        if chat:
            raw_messages = data.get("messages")
            if not isinstance(raw_messages, list) or not raw_messages:
                raise BadRequest("messages must be a non-empty array")
            messages = []
            for i, m in enumerate(raw_messages):
                if not isinstance(m, dict):
                    raise BadRequest(f"messages[{i}] must be an object")
                role = str(m.get("role", "")).lower()
                role = "system" if role == "developer" else role
                if role not in ("system", "user", "assistant", "tool"):
                    raise BadRequest(f"messages[{i}].role {m.get('role')!r} is not supported")
                messages.append(
                    {"role": role, "content": _content_text(m.get("content"), f"messages[{i}]")}
                )
            text = chat_prompt(state, view, messages, field(data, "tools", list, []) or None)
        else:
            prompt = data.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str):
                raise BadRequest("prompt must be a string")
            text = generate_prompt(state, view, prompt, suffix=field(data, "suffix", str, ""))
        stream = field(data, "stream", bool, False)
        include_usage = bool((data.get("stream_options") or {}).get("include_usage"))
        events = _events(state, data, text, view, started)
        # Up to the first token (or everything, unstreamed): errors keep their status.
        head = await collect(events, request, first_token_only=stream)
    except ModelhubError as exc:
        return openai_error(exc)

    ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(6)
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"

    async def all_events() -> AsyncIterator[Event]:
        for ev in head:
            yield ev
        async for ev in events:
            yield ev

    if not stream:
        parts: list[str] = []
        result: dict[str, Any] = {}
        try:
            async for ev in all_events():
                if ev.get("event") == "token":
                    parts.append(str(ev.get("text", "")))
                elif ev.get("event") == "done":
                    result = ev["result"]
        except ModelhubError as exc:
            return openai_error(exc)
        text_out = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(result)}
        if chat:
            choice["message"] = {"role": "assistant", "content": text_out}
        else:
            choice["text"] = text_out
            choice["logprobs"] = None
        return JSONResponse(
            {
                "id": ident,
                "object": obj,
                "created": created,
                "model": model,
                "system_fingerprint": "fp_modelhub",
                "choices": [choice],
                "usage": _usage(result),
            }
        )

    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta_text: str | None, finish: str | None, first: bool) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if delta_text is not None:
                delta["content"] = delta_text
            c["delta"] = delta
        else:
            c["text"] = delta_text or ""
        return {
            "id": ident,
            "object": chunk_obj,
            "created": created,
            "model": model,
            "system_fingerprint": "fp_modelhub",
            "choices": [c],
        }

    async def sse() -> AsyncIterator[bytes]:
        first = True
        try:
            async for ev in all_events():
                if ev.get("event") == "token":
                    yield _sse(chunk(str(ev.get("text", "")), None, first))
                    first = False
                elif ev.get("event") == "done":
                    result = ev["result"]
                    yield _sse(chunk(None, _finish(result), first))
                    if include_usage:
                        usage = {
                            "id": ident,
                            "object": chunk_obj,
                            "created": created,
                            "model": model,
                            "system_fingerprint": "fp_modelhub",
                            "choices": [],
                            "usage": _usage(result),
                        }
                        yield _sse(usage)
        except ModelhubError as exc:
            yield _sse(
                {
                    "error": {
                        "message": exc.message,
                        "type": "api_error",
                        "param": None,
                        "code": None,
                    }
                }
            )
        yield b"data: [DONE]\n\n"

    return StreamingResponse(sse(), media_type="text/event-stream")


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _run(request, chat=True)


@router.post("/v1/completions")
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
    state = get_state(request)
    try:
        view = await load_view(state, model)
    except ModelhubError as exc:
        if isinstance(exc, NotFound):
            exc = NotFound(f"The model '{model}' does not exist")
        return openai_error(exc)
    return JSONResponse(_model_entry(view.name.display, view.stored.modified))


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    try:
        data = await read_json(request)
        model = field(data, "model", str, "").strip()
        if not model:
            raise BadRequest("model is required")
        inp = data.get("input")
        if isinstance(inp, str):
            texts = [inp]
        elif isinstance(inp, list) and inp and all(isinstance(x, str) for x in inp):
            texts = list(inp)
        else:
            raise BadRequest("input must be a non-empty string or array of strings")
        dims = field(data, "dimensions", int, 0)
        view = await load_view(state, model, quote='"')
        vectors, count, _ = await embed_texts(state, view, texts, {}, None, started)
    except ModelhubError as exc:
        return openai_error(exc)
    if data.get("encoding_format") == "base64":
        import base64
        import struct

        items: list[Any] = [
            base64.b64encode(struct.pack(f"<{len(v)}f", *_normalise(v, dims))).decode()
            for v in vectors
        ]
    else:
        items = [_normalise(v, dims) for v in vectors]
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(items)
            ],
            "model": model,
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }
    )
