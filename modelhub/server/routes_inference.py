"""Ollama-compatible inference routes: generate, chat, embed, embeddings, ps."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelhub.errors import BadRequest, ModelhubError, NotFound
from modelhub.library.views import ModelView
from modelhub.runtime.planning import keep_alive_seconds, plan
from modelhub.server.generation import (
    final_stats,
    now_rfc3339,
    respond,
    run_on_runner,
)
from modelhub.server.requests import field, model_field, read_json
from modelhub.server.state import ServerState, get_state
from modelhub.store import parse_name
from modelhub.templates.prompt import build_chat_prompt, build_generate_prompt

router = APIRouter()


async def load_view(state: ServerState, raw: str, *, quote: str = "'") -> ModelView:
    raw = raw.strip()
    if raw.lower().endswith(":cloud"):
        raise BadRequest("cloud models are not supported by modelhub")
    if raw.lower().endswith(":local"):
        raw = raw[: -len(":local")]
    try:
        name = parse_name(raw)
    except ModelhubError as exc:
        raise BadRequest("invalid model name") from exc
    try:
        return await asyncio.to_thread(state.views.get, name)
    except NotFound:
        if quote == '"':
            raise NotFound(f'model "{raw}" not found, try pulling it first') from None
        raise NotFound(f"model '{raw}' not found") from None


def _format(data: dict[str, Any]) -> Any:
    fmt = data.get("format")
    if fmt in (None, ""):
        return None
    if fmt == "json" or isinstance(fmt, dict):
        return fmt
    raise BadRequest(f'invalid format: {fmt!r}; expected "json" or a valid JSON Schema object')


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    raw = data.get("messages") or []
    if not isinstance(raw, list):
        raise BadRequest('field "messages" must be an array')
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("content", ""), str):
            raise BadRequest(f"messages[{i}] must be an object with a string content")
        role = str(m.get("role", "")).lower()
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{i}]: role must be system, user, assistant or tool")
        out.append({**m, "role": role, "content": m.get("content") or ""})
    return out


def _special(state: ServerState, view: ModelView) -> tuple[str, str]:
    if view.model_layer is None:
        return "", ""
    return state.views.special_tokens(view.model_layer.digest)


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


async def _unload_reply(state: ServerState, view: ModelView, raw: str, chat: bool) -> Response:
    if view.model_layer is not None:
        await state.scheduler.unload(view.model_layer.digest)
    return JSONResponse({**reply_body(raw, chat=chat), "done": True, "done_reason": "unload"})


async def _load_reply(
    state: ServerState,
    view: ModelView,
    raw: str,
    chat: bool,
    options: dict[str, Any],
    keep_alive: float | None,
) -> Response:
    p = plan(view, options, num_threads=state.settings.num_threads)
    async with state.scheduler.use(p.spec, keep_alive):
        pass
    return JSONResponse({**reply_body(raw, chat=chat), "done": True, "done_reason": "load"})


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    data = await read_json(request)
    raw = model_field(data)
    if not raw:
        raise NotFound("model '' not found")
    prompt = field(data, "prompt", str, "")
    options = field(data, "options", dict, {})
    keep_alive = keep_alive_seconds(data.get("keep_alive"))
    stream = field(data, "stream", bool, True)
    raw_mode = field(data, "raw", bool, False)
    system = field(data, "system", str, "")
    template = field(data, "template", str, "")
    suffix = field(data, "suffix", str, "")
    context = field(data, "context", list, [])
    if raw_mode and (template or system or context):
        raise BadRequest("raw mode does not support template, system, or context")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise BadRequest('field "context" must be an array of token ids')
    fmt = _format(data)
    view = await load_view(state, raw)
    if not prompt and keep_alive == 0:
        return await _unload_reply(state, view, raw, chat=False)
    if not prompt and not suffix:
        return await _load_reply(state, view, raw, False, options, keep_alive)
    prediction = data.get("prediction") if isinstance(data.get("prediction"), str) else None
    p = plan(view, options, num_threads=state.settings.num_threads, prediction=bool(prediction))
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
        "format": fmt,
        "prediction": prediction,
    }
    shaper = NativeShaper(
        raw,
        chat=False,
        started=started,
        with_context=not raw_mode,
        record=lambda r: state.metrics.record(view.name.display, r),
    )
    events = run_on_runner(state, p, keep_alive, msg, started)
    return await respond(events, request, stream=stream, chunk=shaper.chunk, final=shaper.final)


def _done_reason(result: dict[str, Any]) -> str:
    reason = str(result.get("done_reason") or "stop")
    return "stop" if reason == "cancel" else reason


def _jinja(view: ModelView) -> str | None:
    return view.info.chat_template if view.info else None


def chat_prompt(
    state: ServerState,
    view: ModelView,
    messages: list[dict[str, Any]],
    tools: list[Any] | None = None,
) -> str:
    """Model MESSAGEs + request messages (+ the model's SYSTEM unless one is given), rendered."""
    history = list(view.messages) + messages
    if view.system and (not messages or messages[0]["role"] != "system"):
        history = [{"role": "system", "content": view.system}, *history]
    bos, eos = _special(state, view)
    return build_chat_prompt(
        go_template=view.template,
        jinja_template=None if view.template else _jinja(view),
        messages=history,
        tools=tools or None,
        bos_token=bos,
        eos_token=eos,
        tokenizer_adds_bos=_adds_bos(view),
    )


def generate_prompt(
    state: ServerState,
    view: ModelView,
    prompt: str,
    *,
    system: str = "",
    template: str = "",
    suffix: str = "",
    with_history: bool = True,
) -> str:
    bos, eos = _special(state, view)
    go = template or view.template
    return build_generate_prompt(
        go_template=go,
        jinja_template=None if go else _jinja(view),
        prompt=prompt,
        system=system or view.system,
        history=view.messages if with_history else [],
        suffix=suffix or None,
        bos_token=bos,
        eos_token=eos,
        tokenizer_adds_bos=_adds_bos(view),
    )


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    data = await read_json(request)
    raw = model_field(data)
    if not raw:
        raise BadRequest("model is required")
    messages = _messages(data)
    options = field(data, "options", dict, {})
    keep_alive = keep_alive_seconds(data.get("keep_alive"))
    stream = field(data, "stream", bool, True)
    tools = field(data, "tools", list, [])
    fmt = _format(data)
    view = await load_view(state, raw)
    if not messages and keep_alive == 0:
        return await _unload_reply(state, view, raw, chat=True)
    if not messages:
        return await _load_reply(state, view, raw, True, options, keep_alive)
    p = plan(view, options, num_threads=state.settings.num_threads)
    text = chat_prompt(state, view, messages, tools)
    msg = {"op": "generate", "prompt": text, "options": p.options, "format": fmt}
    shaper = NativeShaper(
        raw,
        chat=True,
        started=started,
        with_context=False,
        record=lambda r: state.metrics.record(view.name.display, r),
    )
    events = run_on_runner(state, p, keep_alive, msg, started)
    return await respond(events, request, stream=stream, chunk=shaper.chunk, final=shaper.final)


async def embed_texts(
    state: ServerState,
    view: ModelView,
    texts: list[str],
    options: dict[str, Any],
    keep_alive: float | None,
    started: int,
) -> tuple[list[list[float]], int, int]:
    p = plan(view, options, num_threads=state.settings.num_threads, embedding=True)
    load_ns = 0
    vectors: list[list[float]] = []
    count = 0
    async for ev in run_on_runner(state, p, keep_alive, {"op": "embed", "texts": texts}, started):
        if ev.get("event") == "ready":
            load_ns = int(ev["load_duration"])
        elif ev.get("event") == "embeddings":
            vectors = ev["embeddings"]
            count = int(ev.get("prompt_eval_count") or 0)
    return vectors, count, load_ns


def _normalise(vec: list[float], dims: int) -> list[float]:
    if 0 < dims < len(vec):
        vec = vec[:dims]
    if not all(math.isfinite(v) for v in vec):
        raise ModelhubError("the model produced a non-finite embedding value")
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


@router.post("/api/embed")
async def embed(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    data = await read_json(request)
    raw = model_field(data)
    if not raw:
        raise NotFound("model '' not found")
    inp = data.get("input")
    if inp is None or inp == "":
        texts: list[str] = []
    elif isinstance(inp, str):
        texts = [inp]
    elif isinstance(inp, list) and all(isinstance(x, str) for x in inp):
        texts = list(inp)
    else:
        raise BadRequest("invalid input type")
    dims = field(data, "dimensions", int, 0)
    options = field(data, "options", dict, {})
    keep_alive = keep_alive_seconds(data.get("keep_alive"))
    view = await load_view(state, raw, quote='"')
    if not texts:
        await _load_reply(state, view, raw, False, options, keep_alive)
        return JSONResponse({"model": raw, "embeddings": []})
    vectors, count, load_ns = await embed_texts(state, view, texts, options, keep_alive, started)
    return JSONResponse(
        {
            "model": raw,
            "embeddings": [_normalise(v, dims) for v in vectors],
            "total_duration": time.monotonic_ns() - started,
            "load_duration": load_ns,
            "prompt_eval_count": count,
        }
    )


@router.post("/api/embeddings")
async def embeddings_legacy(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    data = await read_json(request)
    raw = model_field(data)
    if not raw:
        raise BadRequest("model is required")
    prompt = field(data, "prompt", str, "")
    options = field(data, "options", dict, {})
    keep_alive = keep_alive_seconds(data.get("keep_alive"))
    view = await load_view(state, raw, quote='"')
    if not prompt:
        await _load_reply(state, view, raw, False, options, keep_alive)
        return JSONResponse({"embedding": []})
    vectors, _, _ = await embed_texts(state, view, [prompt], options, keep_alive, started)
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
        }
        if config.get("draft_kind", "none") != "none":
            entry["draft"] = {
                "kind": config["draft_kind"],
                "draft_num_predict": config.get("draft_num_predict"),
            }
        models.append(entry)
    return JSONResponse({"models": models})


def _adds_bos(view: ModelView) -> bool:
    return not (view.info is not None and view.info.add_bos is False)
