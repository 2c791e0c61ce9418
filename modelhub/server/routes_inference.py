"""Ollama-compatible inference routes: generate, chat, embed, embeddings, ps."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from modelhub.config import MAX_DURATION_SECONDS
from modelhub.engine import protocol as proto
from modelhub.errors import InputError
from modelhub.library.views import ModelView
from modelhub.replies.reply import ReplyParser, ReplyPart
from modelhub.runtime.planning import Plan
from modelhub.server import logprobs
from modelhub.server.drafting_view import ps_draft
from modelhub.server.embedding import embed_texts, normalise
from modelhub.server.generation import (
    Event,
    Finished,
    Ready,
    final_stats,
    fitted_prompt,
    now_rfc3339,
    respond,
    run_on_runner,
)
from modelhub.server.images import RequestImages, can_see, mark, mark_prompt, prepare
from modelhub.server.jsonbody import JSONResponse
from modelhub.server.lookup import find_model
from modelhub.server.offloop import off_loop
from modelhub.server.prompts import chat_prompt, generate_prompt
from modelhub.server.reply_options import reply_parser, request_grammar, thinking, tool_plan
from modelhub.server.request_models import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    LoadBody,
    openapi_body,
    read_request,
)
from modelhub.server.state import ServerState, get_state
from modelhub.server.truncation import ChatFit

router = APIRouter()


def reply_body(
    raw: str, *, chat: bool, text: str = "", part: ReplyPart | None = None
) -> dict[str, Any]:
    """The common head of native replies: generate's ``response`` or chat's ``message``
    (with the reasoning and tool calls of ``part``, when the reply is parsed)."""
    body: dict[str, Any] = {"model": raw, "created_at": now_rfc3339()}
    if part is not None:
        text = part.content
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if part is not None and part.thinking:
            message["thinking"] = part.thinking
        if part is not None and part.calls:
            message["tool_calls"] = [call.ollama() for call in part.calls]
        body["message"] = message
    else:
        body["response"] = text
        if part is not None and part.thinking:
            body["thinking"] = part.thinking
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
        record: Callable[[proto.DoneResult], None],
        parser: ReplyParser | None = None,
    ) -> None:
        self.raw, self.chat, self.started = raw, chat, started
        self.with_context, self.record = with_context, record
        self.parser = parser
        self.load_ns = 0
        self._logprobs: list[dict[str, Any]] = []  # of tokens whose text is still held back

    def chunk(self, ev: Event) -> dict[str, Any] | None:
        if isinstance(ev, Ready):
            self.load_ns = ev.load_duration
        if not isinstance(ev, proto.Token):
            return None
        if ev.logprob is not None:
            self._logprobs.append(logprobs.entry(ev.logprob))
        text = ev.text
        if self.parser is None:
            if not text:
                return None
            out = reply_body(self.raw, chat=self.chat, text=text)
        else:
            part = self.parser.feed(text)
            if not part:
                return None  # held back (a marker may be starting)
            out = reply_body(self.raw, chat=self.chat, part=part)
        out["done"] = False
        if ev.drafted:
            out["drafted"] = True
        self._attach_logprobs(out)
        return out

    def _attach_logprobs(self, out: dict[str, Any]) -> None:
        if self._logprobs:
            out["logprobs"], self._logprobs = self._logprobs, []

    def final(self, ev: Finished) -> dict[str, Any]:
        result = ev.result
        part = self.parser.finish() if self.parser is not None else None
        out = reply_body(self.raw, chat=self.chat, part=part)
        self._attach_logprobs(out)
        out.update(done=True, done_reason=_done_reason(result))
        if self.with_context:
            out["context"] = list(result.context)
        out.update(final_stats(ev, self.started, self.load_ns))
        self.record(result)
        return out


async def _load_only(state: ServerState, view: ModelView, req: LoadBody, chat: bool) -> Response:
    """A request with nothing to generate: load the model (or unload it with keep_alive 0)."""
    if req.keep_alive == 0:
        if view.model_layer is not None:
            await state.scheduler.unload(view.model_layer.digest)
        reason = "unload"
    else:
        p = state.plan(
            view,
            req.options,
        )
        async with state.scheduler.use(p.spec, req.keep_alive):
            pass
        reason = "load"
    body = reply_body(req.model, chat=chat)
    return JSONResponse({**body, "done": True, "done_reason": reason})


@router.post("/api/generate", openapi_extra=openapi_body(GenerateBody))
async def generate(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_request(request, GenerateBody)
    view = await find_model(state, req.model)
    if not req.prompt and (req.keep_alive == 0 or not req.suffix):
        return await _load_only(state, view, req, chat=False)
    images = RequestImages()
    prompt, todo = mark_prompt(images, req.prompt, req.images)
    await prepare(images, todo, can_see(view), req.model)
    think = None if req.raw else thinking(view, req.think)
    p = state.plan(
        view,
        req.options,
        prediction=bool(req.prediction),
    )
    p.options["shift"] = req.shift
    if req.raw:
        text = prompt
    else:
        render = functools.partial(
            generate_prompt,
            state,
            view,
            prompt,
            system=req.system,
            template=req.template,
            suffix=req.suffix,
            with_history=not req.context,
            think=think,
        )
        # the request's own template: seconds to parse when large, so off the loop
        text = await off_loop(render) if req.template else render()
    msg = proto.Generate(
        prompt=text,
        context=req.context or None,
        options=proto.runner_options(_with_logprobs(p.options, req)),
        grammar=request_grammar({"grammar": req.grammar}, req.format),
        prediction=req.prediction,
        **images.runner_fields(),
    )
    shaper = NativeShaper(
        req.model,
        chat=False,
        started=started,
        with_context=not req.raw,
        record=lambda r: state.metrics.record(view.name.display, r),
        parser=reply_parser(view, text, think, None),
    )
    events = run_on_runner(state, p, req.keep_alive, msg, started)
    return await respond(events, request, stream=req.stream, chunk=shaper.chunk, final=shaper.final)


def _with_logprobs(options: dict[str, Any], req: GenerateBody | ChatBody) -> dict[str, Any]:
    """The runner options plus ``top_logprobs`` when the request asks for log-probabilities."""
    top = logprobs.requested({"logprobs": req.logprobs, "top_logprobs": req.top_logprobs})
    return options if top is None else {**options, "top_logprobs": top}


def _done_reason(result: proto.DoneResult) -> str:
    return "stop" if result.done_reason == "cancel" else result.done_reason


@router.post("/api/chat", openapi_extra=openapi_body(ChatBody))
async def chat(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_request(request, ChatBody)
    view = await find_model(state, req.model)
    if not req.messages:
        return await _load_only(state, view, req, chat=True)
    if req.images:
        raise InputError('images: in /api/chat, images go on a message ("messages[i].images")')
    images = RequestImages()
    messages, todo = mark(images, req.messages, 0)
    await prepare(images, todo, can_see(view), req.model)
    p = state.plan(
        view,
        req.options,
    )
    p.options["shift"] = req.shift
    think = thinking(view, req.think)
    tooling = tool_plan(view, req.tools, req.tool_choice)
    text = chat_prompt(state, view, messages, tooling.tools, think=think)
    fit = ChatFit(
        messages,
        lambda kept: chat_prompt(state, view, kept, tooling.tools, think=think),
        truncate=req.truncate,
        num_keep=int(p.options.get("num_keep", 4)),
        count_fields=images.count_fields,
    )
    if req.debug_render_only:
        return await _rendered_only(state, p, req, fit)
    grammar = request_grammar({"grammar": req.grammar}, req.format, tooling.grammar)
    options = _with_logprobs(p.options, req)
    msg = proto.Generate(
        prompt=text,
        options=proto.runner_options(options),
        grammar=grammar,
        **images.runner_fields(),
    )
    shaper = NativeShaper(
        req.model,
        chat=True,
        started=started,
        with_context=False,
        record=lambda r: state.metrics.record(view.name.display, r),
        parser=reply_parser(view, text, think, tooling.tools),
    )
    events = run_on_runner(state, p, req.keep_alive, msg, started, fit)
    return await respond(events, request, stream=req.stream, chunk=shaper.chunk, final=shaper.final)


async def _rendered_only(state: ServerState, p: Plan, req: ChatBody, fit: ChatFit) -> Response:
    """Ollama's ``_debug_render_only``: the prompt the model would be given, after
    truncation, and nothing generated (the model is loaded: its tokenizer counts)."""
    text = await fitted_prompt(state, p, req.keep_alive, fit)
    body = reply_body(req.model, chat=True)
    return JSONResponse({**body, "done": True, "debug_info": {"rendered_template": text}})


@router.post("/api/embed", openapi_extra=openapi_body(EmbedBody))
async def embed(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_request(request, EmbedBody)
    texts, dims = req.input, req.dimensions
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


@router.post("/api/embeddings", openapi_extra=openapi_body(EmbeddingsBody))
async def embeddings_legacy(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    req = await read_request(request, EmbeddingsBody)
    prompt = req.prompt
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
        now = time.time()
        expires = loaded.expires_at  # inf while in use: now + keep_alive
        if math.isinf(expires):
            expires = now + loaded.keep_alive
        # Forever (and anything a clock cannot hold) shows as the farthest deadline there is.
        expires = min(expires, now + MAX_DURATION_SECONDS)
        info = loaded.info
        on_devices = info.placement.size_device
        # With layers on devices, what llama.cpp allocated for the target here and there (the
        # runner's RSS would count mapped pages of offloaded weights and miss the devices).
        size = info.placement.size if on_devices else info.rss
        entry: dict[str, Any] = {
            "name": spec.name,
            "model": spec.name,
            "size": size,
            "digest": spec.digest,
            "details": details,
            "expires_at": datetime.fromtimestamp(expires).astimezone().isoformat(),
            "size_vram": on_devices,
            "context_length": info.n_ctx or config["n_ctx"],
            "repack": info.repack,
            "num_parallel": loaded.n_parallel,
            "kv_cache_type": info.kv_cache_type or "auto",
            "devices": list(info.devices),
            "layers_offloaded": info.placement.layers_offloaded,
            "running": loaded.running,
            "queued": loaded.queued,
        }
        if info.default_drafters or config.get("draft_kind", "none") != "none":
            entry["draft"] = ps_draft(loaded, config, entry["kv_cache_type"])
        if spec.note:  # loaded without its draft models (memory)
            entry["draft_note"] = spec.note
        models.append(entry)
    return JSONResponse({"models": models})
