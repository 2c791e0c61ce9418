"""OpenAI's completion routes: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Each parses its body once into its ``server/openai_models.py`` model and runs through
``server/completion_request.py`` (a chat body rendered by ``chat_setup``, a text prompt by the
model's generate template) and answer as OpenAI does, whole or as SSE
chunks. Defaults follow the OpenAI API (temperature and top_p 1.0, no streaming unless asked).
Usage reports speculative decoding as OpenAI does for Predicted Outputs:
``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``, and
llama-server's ``timings`` carry the draft counters. Errors use OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from modelhub.engine import protocol as proto
from modelhub.errors import ModelhubError
from modelhub.library.views import ModelView
from modelhub.replies.reply import ReplyPart
from modelhub.server import logprobs
from modelhub.server.completion_request import (
    Setup,
    chat_setup,
    completion_events,
    ollama_options,
)
from modelhub.server.errors import error_body
from modelhub.server.generation import (
    Event,
    Finished,
    chained,
    collect,
    fitted_prompt,
    gathered,
)
from modelhub.server.jsonbody import JSONResponse, sse
from modelhub.server.lookup import find_model
from modelhub.server.openai_models import ChatCompletionBody, CompletionBody, SamplingBody
from modelhub.server.prompts import generate_prompt
from modelhub.server.reply_options import request_grammar
from modelhub.server.request_models import openapi_body, read_request
from modelhub.server.state import ServerState, get_state
from modelhub.server.truncation import ChatFit

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionBody))
async def chat_completions(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    body = await read_request(request, ChatCompletionBody)
    view = await find_model(state, body.model)
    setup = chat_setup(state, view, body)
    c = _Completion(True, body.model, body.stream, _usage_wanted(body), setup)
    if body.debug_render_only and setup.fit is not None:
        return await _rendered_only(state, view, body, c, setup.fit)
    return await _answer(request, state, view, body, c, started)


@router.post("/v1/completions", openapi_extra=openapi_body(CompletionBody))
async def completions(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    body = await read_request(request, CompletionBody)
    view = await find_model(state, body.model)
    text = generate_prompt(state, view, body.prompt, suffix=body.suffix)
    grammar = request_grammar(
        {"grammar": body.grammar}, body.response_format, format_field="response_format"
    )
    setup = Setup(text, grammar, None, None, body.logprobs)
    c = _Completion(False, body.model, body.stream, _usage_wanted(body), setup)
    return await _answer(request, state, view, body, c, started)


def _usage_wanted(body: SamplingBody) -> bool:
    return bool(body.stream_options.include_usage)


async def _answer(
    request: Request,
    state: ServerState,
    view: ModelView,
    body: SamplingBody,
    c: _Completion,
    started: int,
) -> Response:
    events = completion_events(state, body, c.setup, view, started)
    # Up to the first token (or everything, unstreamed): errors keep their status.
    head = await collect(events, request, first_token_only=c.stream)

    if not c.stream:
        return await _unstreamed(c, chained(head, events))
    return StreamingResponse(_streamed(c, chained(head, events)), media_type="text/event-stream")


async def _rendered_only(
    state: ServerState, view: ModelView, body: ChatCompletionBody, c: _Completion, fit: ChatFit
) -> Response:
    """Ollama's ``_debug_render_only`` (as its /v1 answers it): an empty completion whose
    ``_debug_info.rendered_template`` is the prompt the model would be given, after
    truncation; nothing is generated (the model is loaded: its tokenizer counts)."""
    p = state.plan(view, ollama_options(body))
    text = await fitted_prompt(state, p, body.keep_alive, fit)
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": ""},
        "finish_reason": "stop",
        "logprobs": None,
    }
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    body_out = c.envelope(False, choices=[choice], usage=usage)
    return JSONResponse({**body_out, "_debug_info": {"rendered_template": text}})


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
    raws: list[dict[str, Any]] = []

    async def noting_logprobs() -> AsyncIterator[Event]:
        async for ev in events:
            if isinstance(ev, proto.Token) and ev.logprob is not None:
                raws.append(ev.logprob)
            yield ev

    done = await gathered(noting_logprobs(), c, whole.add)
    text = whole.content
    choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(done, bool(whole.calls))}
    if c.chat:
        choice["message"] = {"role": "assistant", **_message(whole, delta=False)}
    else:
        choice["text"] = text
    choice["logprobs"] = _logprobs(c, raws, 0)
    body = c.envelope(False, choices=[choice], usage=_usage(done), timings=_timings(done))
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
            if isinstance(ev, proto.Token):
                if ev.logprob is not None:
                    raws.append(ev.logprob)
                part = c.parse(ev.text)
                if not part:
                    continue  # nothing to show yet (a marker or stop may be starting)
                called = called or bool(part.calls)
                yield _sse(_chunk(c, part, None, first, raws, offset))
                offset += sum(len(r["token"]) for r in raws)
                raws, first = [], False
            elif isinstance(ev, Finished):
                part = c.finish()
                if part or raws:
                    called = called or bool(part.calls)
                    yield _sse(_chunk(c, part, None, first, raws, offset))
                    first = False
                last = _chunk(c, None, _finish(ev, called), first)
                yield _sse({**last, "timings": _timings(ev)})
                if c.include_usage:
                    yield _sse(c.envelope(True, choices=[], usage=_usage(ev)))
    except ModelhubError as exc:
        yield _sse(error_body(exc, "openai"))
    yield b"data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> bytes:
    return sse(obj)


def _usage(done: Finished) -> dict[str, Any]:
    prompt, completion = done.prompt_length, done.result.eval_count
    proposed, accepted = done.result.draft_count, done.result.draft_accepted_count
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


def _timings(done: Finished) -> dict[str, Any]:
    """llama-server's ``timings`` object (milliseconds), with its draft counters."""
    result = done.result
    prompt_ns, eval_ns = result.prompt_eval_duration_ns, result.eval_duration_ns
    predicted = result.eval_count
    return {
        "prompt_n": result.prompt_eval_count,
        "prompt_ms": prompt_ns / 1e6,
        "predicted_n": predicted,
        "predicted_ms": eval_ns / 1e6,
        "predicted_per_second": predicted / (eval_ns / 1e9) if eval_ns > 0 else 0.0,
        "draft_n": result.draft_count,
        "draft_n_accepted": result.draft_accepted_count,
    }


def _finish(done: Finished, called: bool = False) -> str:
    if called:
        return "tool_calls"
    return "length" if done.result.done_reason == "length" else "stop"
