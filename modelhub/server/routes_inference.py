"""Ollama-compatible inference routes: generate, chat, embed, embeddings, ps."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelhub.engine.grammar import format_grammar
from modelhub.errors import InputError
from modelhub.library.views import ModelView
from modelhub.runtime.planning import plan
from modelhub.server import schemas
from modelhub.server.embedding import embed_texts, input_texts, normalise
from modelhub.server.generation import (
    final_stats,
    now_rfc3339,
    respond,
    run_on_runner,
)
from modelhub.server.lookup import find_model
from modelhub.server.prompts import chat_prompt, generate_prompt
from modelhub.server.requests import ModelRequest, check_media, field, read_model_request
from modelhub.server.state import ServerState, get_state

router = APIRouter()


def _format(data: dict[str, Any]) -> Any:
    fmt = data.get("format")
    if fmt in (None, ""):
        return None
    if fmt == "json" or isinstance(fmt, dict):
        return fmt
    raise InputError(f'invalid format: {fmt!r}; expected "json" or a valid JSON Schema object')


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    raw = data.get("messages") or []
    if not isinstance(raw, list):
        raise InputError('field "messages" must be an array')
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("content", ""), str):
            raise InputError(f"messages[{i}] must be an object with a string content")
        role = str(m.get("role", "")).lower()
        if role not in ("system", "user", "assistant", "tool"):
            raise InputError(f"messages[{i}]: role must be system, user, assistant or tool")
        check_media({"images": m.get("images")}, f"messages[{i}].")
        out.append({**m, "role": role, "content": m.get("content") or ""})
    return out


def reply_body(raw: str, *, chat: bool, text: str = "") -> dict[str, Any]:
    """The common head of native replies: generate's ``response`` or chat's ``message``."""
    body: dict[str, Any] = {"model": raw, "created_at": now_rfc3339()}
    if chat:
        body["message"] = {"role": "assistant", "content": text}
    else:
        body["response"] = text
    return body


class NativeShaper:
    """Runner events -> Ollama's streamed objects and final object (generate or chat)."""

    def __init__(
        self,
        raw: str,
        *,
        chat: bool,
        started: int,
        with_context: bool,
        record: Callable[[dict[str, Any]], None],
    ) -> None:
        self.raw, self.chat, self.started = raw, chat, started
        self.with_context, self.record = with_context, record
        self.load_ns = 0

    def chunk(self, ev: dict[str, Any]) -> dict[str, Any] | None:
        if ev.get("event") == "ready":
            self.load_ns = int(ev["load_duration"])
        if ev.get("event") != "token":
            return None
        out = reply_body(self.raw, chat=self.chat, text=str(ev.get("text", "")))
        out["done"] = False
        if ev.get("drafted"):
            out["drafted"] = True
        return out

    def final(self, ev: dict[str, Any]) -> dict[str, Any]:
        result = ev["result"]
        out = reply_body(self.raw, chat=self.chat)
        out.update(done=True, done_reason=_done_reason(result))
        if self.with_context:
            out["context"] = result.get("context", [])
        out.update(final_stats(result, self.started, self.load_ns))
        self.record(result)
        return out


async def _load_only(
    state: ServerState, view: ModelView, req: ModelRequest, chat: bool
) -> Response:
    """A request with nothing to generate: load the model (or unload it with keep_alive 0)."""
    if req.keep_alive == 0:
        if view.model_layer is not None:
            await state.scheduler.unload(view.model_layer.digest)
        reason = "unload"
    else:
        p = plan(view, req.options, num_threads=state.settings.num_threads)
        async with state.scheduler.use(p.spec, req.keep_alive):
            pass
        reason = "load"
    body = reply_body(req.model, chat=chat)
    return JSONResponse({**body, "done": True, "done_reason": reason})


@router.post("/api/generate", openapi_extra=schemas.GENERATE)
async def generate(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_model_request(request)
    data = req.data
    check_media(data)
    prompt = field(data, "prompt", str, "")
    raw_mode = field(data, "raw", bool, False)
    system = field(data, "system", str, "")
    template = field(data, "template", str, "")
    suffix = field(data, "suffix", str, "")
    context = field(data, "context", list, [])
    if raw_mode and (template or system or context):
        raise InputError("raw mode does not support template, system, or context")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise InputError('field "context" must be an array of token ids')
    fmt = _format(data)
    view = await find_model(state, req.model)
    if not prompt and (req.keep_alive == 0 or not suffix):
        return await _load_only(state, view, req, chat=False)
    prediction = data.get("prediction") if isinstance(data.get("prediction"), str) else None
    p = plan(view, req.options, num_threads=state.settings.num_threads, prediction=bool(prediction))
    if raw_mode:
        text = prompt
    else:
        text = generate_prompt(
            state,
            view,
            prompt,
            system=system,
            template=template,
            suffix=suffix,
            with_history=not context,
        )
    msg = {
        "op": "generate",
        "prompt": text,
        "context": context or None,
        "options": p.options,
        "grammar": format_grammar(fmt),
        "prediction": prediction,
    }
    shaper = NativeShaper(
        req.model,
        chat=False,
        started=started,
        with_context=not raw_mode,
        record=lambda r: state.metrics.record(view.name.display, r),
    )
    events = run_on_runner(state, p, req.keep_alive, msg, started)
    return await respond(events, request, stream=req.stream, chunk=shaper.chunk, final=shaper.final)


def _done_reason(result: dict[str, Any]) -> str:
    reason = str(result.get("done_reason") or "stop")
    return "stop" if reason == "cancel" else reason


@router.post("/api/chat", openapi_extra=schemas.CHAT)
async def chat(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_model_request(request)
    check_media(req.data)
    messages = _messages(req.data)
    tools = field(req.data, "tools", list, [])
    fmt = _format(req.data)
    view = await find_model(state, req.model)
    if not messages:
        return await _load_only(state, view, req, chat=True)
    p = plan(view, req.options, num_threads=state.settings.num_threads)
    text = chat_prompt(state, view, messages, tools)
    msg = {"op": "generate", "prompt": text, "options": p.options, "grammar": format_grammar(fmt)}
    shaper = NativeShaper(
        req.model,
        chat=True,
        started=started,
        with_context=False,
        record=lambda r: state.metrics.record(view.name.display, r),
    )
    events = run_on_runner(state, p, req.keep_alive, msg, started)
    return await respond(events, request, stream=req.stream, chunk=shaper.chunk, final=shaper.final)


@router.post("/api/embed", openapi_extra=schemas.EMBED)
async def embed(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_model_request(request)
    texts = input_texts(req.data.get("input"), allow_empty=True)
    dims = field(req.data, "dimensions", int, 0)
    view = await find_model(state, req.model)
    if not texts:
        await _load_only(state, view, req, chat=False)
        return JSONResponse({"model": req.model, "embeddings": []})
    vectors, count, load_ns = await embed_texts(
        state, view, texts, req.options, req.keep_alive, started
    )
    return JSONResponse(
        {
            "model": req.model,
            "embeddings": [normalise(v, dims) for v in vectors],
            "total_duration": time.monotonic_ns() - started,
            "load_duration": load_ns,
            "prompt_eval_count": count,
        }
    )


@router.post("/api/embeddings", openapi_extra=schemas.EMBEDDINGS)
async def embeddings_legacy(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_model_request(request)
    prompt = field(req.data, "prompt", str, "")
    view = await find_model(state, req.model)
    if not prompt:
        await _load_only(state, view, req, chat=False)
        return JSONResponse({"embedding": []})
    vectors, _, _ = await embed_texts(state, view, [prompt], req.options, req.keep_alive, started)
    return JSONResponse({"embedding": vectors[0] if vectors else []})


@router.get("/api/ps")
async def ps(request: Request) -> Response:
    state = get_state(request)
    models = []
    for loaded in state.scheduler.snapshot():
        spec = loaded.spec
        details = {**spec.details, "parent_model": ""}
        config = dict(spec.config)
        expires = loaded.expires_at
        if math.isinf(expires):
            expires = time.time() + (
                loaded.keep_alive if math.isfinite(loaded.keep_alive) else 292 * 365 * 86400
            )
        entry: dict[str, Any] = {
            "name": spec.name,
            "model": spec.name,
            "size": int(loaded.info.get("rss") or 0),
            "digest": spec.digest,
            "details": details,
            "expires_at": datetime.fromtimestamp(expires).astimezone().isoformat(),
            "size_vram": 0,
            "context_length": int(loaded.info.get("n_ctx") or config["n_ctx"]),
            "repack": bool(loaded.info.get("repack", True)),
            "num_parallel": loaded.n_parallel,
            "kv_cache_type": str(loaded.info.get("kv_cache_type") or "auto"),
            "running": loaded.running,
            "queued": loaded.queued,
        }
        if config.get("draft_kind", "none") != "none":
            entry["draft"] = {
                "kind": config["draft_kind"],
                "draft_num_predict": config.get("draft_num_predict"),
            }
        models.append(entry)
    return JSONResponse({"models": models})
