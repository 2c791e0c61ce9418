"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A request is read into the chat request it means (``anthropic_request``) and runs through the
chat path every API shares (``completion_request.chat_setup`` and ``completion_events``:
templates, thinking, tool calls and forced-call grammars, truncation, drafting). The reply comes
back as content blocks (``thinking``, ``text``, ``tool_use``) with Anthropic's ``stop_reason``
and ``usage`` (plus ``draft_count`` / ``draft_accepted_count``), or streamed as Anthropic's
events: ``message_start``, ``ping``, then per block ``content_block_start``,
``content_block_delta`` (``thinking_delta`` then ``signature_delta``, ``text_delta``,
``input_json_delta``) and ``content_block_stop``, then ``message_delta`` and ``message_stop``.
Errors have Anthropic's shape (``server/errors.py``); ``anthropic-version``, ``anthropic-beta``,
``x-api-key`` and ``Authorization`` are accepted and ignored.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from modelhub.engine import protocol as proto
from modelhub.errors import ModelhubError
from modelhub.replies.reply import ReplyPart
from modelhub.server.anthropic_request import CountTokensBody, MessagesBody
from modelhub.server.completion_request import Setup, chat_setup, completion_events
from modelhub.server.errors import error_body
from modelhub.server.generation import Event, Finished, chained, collect, gathered, runner_counter
from modelhub.server.jsonbody import JSONResponse, sse
from modelhub.server.lookup import find_model
from modelhub.server.request_models import openapi_body, read_request
from modelhub.server.state import get_state

router = APIRouter()


def _event(kind: str, **body: Any) -> bytes:
    return f"event: {kind}\n".encode() + sse({"type": kind, **body})


def _signature(thinking: str) -> str:
    """An opaque signature for a thinking block (clients send it back; it is not checked)."""
    return "modelhub-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


class _Blocks:
    """Reply parts -> content blocks, and the stream events that build them in order."""

    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []
        self.open: str | None = None  # the block being streamed: "thinking" or "text"
        self.called = False

    def part(self, part: ReplyPart) -> list[bytes]:
        out: list[bytes] = []
        for kind, text in (("thinking", part.thinking), ("text", part.content)):
            if text:
                out += self._open(kind)
                index = len(self.content) - 1
                self.content[index][kind] += text
                delta = {"type": f"{kind}_delta", kind: text}
                out.append(_event("content_block_delta", index=index, delta=delta))
        for call in part.calls:
            out += self.close()
            self.called = True
            index = len(self.content)
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            self.content.append({**block, "input": call.arguments})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(call.arguments)}
            out += [
                _event("content_block_start", index=index, content_block=block),
                _event("content_block_delta", index=index, delta=delta),
                _event("content_block_stop", index=index),
            ]
        return out

    def _open(self, kind: str) -> list[bytes]:
        if self.open == kind:
            return []
        out = self.close()
        block = {"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {})
        self.content.append(dict(block))
        self.open = kind
        start = _event("content_block_start", index=len(self.content) - 1, content_block=block)
        return [*out, start]

    def close(self) -> list[bytes]:
        kind, self.open = self.open, None
        if kind is None:
            return []
        index = len(self.content) - 1
        out = []
        if kind == "thinking":
            block = self.content[index]
            block["signature"] = _signature(block["thinking"])
            delta = {"type": "signature_delta", "signature": block["signature"]}
            out.append(_event("content_block_delta", index=index, delta=delta))
        return [*out, _event("content_block_stop", index=index)]


@dataclass
class _Reply:
    """One message being answered: what its envelope repeats."""

    model: str
    stops: list[str]
    ident: str = field(default_factory=lambda: "msg_" + secrets.token_hex(12))

    def message(self, content: list[Any], **rest: Any) -> dict[str, Any]:
        return {
            "id": self.ident,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            **rest,
        }

    def stop(self, result: proto.DoneResult, called: bool) -> dict[str, Any]:
        """``stop_reason`` and ``stop_sequence`` (one of the request's, when it ended it)."""
        hit = result.stop_sequence
        if called:
            reason = "tool_use"
        elif result.done_reason == "length":
            reason = "max_tokens"
        elif isinstance(hit, str) and hit in self.stops:
            return {"stop_reason": "stop_sequence", "stop_sequence": hit}
        else:
            reason = "end_turn"
        return {"stop_reason": reason, "stop_sequence": None}


def usage(done: Finished) -> dict[str, Any]:
    """Anthropic's usage: input tokens evaluated now, those read from the prompt cache (the
    prefix kept from an earlier request), output tokens, and the draft counters."""
    result = done.result
    total, evaluated = done.prompt_tokens, result.prompt_eval_count
    cached = max(total - evaluated, 0)
    return {
        "input_tokens": total - cached if total else evaluated,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": result.eval_count,
        "draft_count": result.draft_count,
        "draft_accepted_count": result.draft_accepted_count,
    }


@router.post("/v1/messages", openapi_extra=openapi_body(MessagesBody))
async def messages(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    body = await read_request(request, MessagesBody)
    chat = body.chat()
    view = await find_model(state, body.model)
    setup = chat_setup(state, view, chat, body.chat_messages())
    events = completion_events(state, chat, setup, view, started)
    head = await collect(events, request, first_token_only=body.stream)
    reply = _Reply(body.model, body.stop_sequences)
    if body.stream:
        prompt = next((e.prompt_tokens for e in head if isinstance(e, proto.Prompt)), 0)
        stream = _streamed(reply, setup, chained(head, events), prompt)
        return StreamingResponse(stream, media_type="text/event-stream")
    blocks = _Blocks()
    done = await gathered(chained(head, events), setup, blocks.part)
    blocks.close()
    stop = reply.stop(done.result, blocks.called)
    return JSONResponse(reply.message(blocks.content, **stop, usage=usage(done)))


async def _streamed(
    reply: _Reply, setup: Setup, events: AsyncIterator[Event], prompt_tokens: int
) -> AsyncIterator[bytes]:
    blocks = _Blocks()
    start = {"input_tokens": prompt_tokens, "output_tokens": 0}
    yield _event(
        "message_start",
        message=reply.message([], stop_reason=None, stop_sequence=None, usage=start),
    )
    yield _event("ping")
    try:
        async for ev in events:
            if isinstance(ev, proto.Token):
                for chunk in blocks.part(setup.parse(ev.text)):
                    yield chunk
            elif isinstance(ev, Finished):
                for chunk in [*blocks.part(setup.finish()), *blocks.close()]:
                    yield chunk
                delta = reply.stop(ev.result, blocks.called)
                yield _event("message_delta", delta=delta, usage=usage(ev))
                yield _event("message_stop")
    except ModelhubError as exc:
        yield _event("error", error=error_body(exc, "anthropic")["error"])


@router.post("/v1/messages/count_tokens", openapi_extra=openapi_body(CountTokensBody))
async def count_tokens(request: Request) -> Response:
    """The prompt's length in the model's own tokens (the model is loaded to count them)."""
    state = get_state(request)
    body = await read_request(request, CountTokensBody)
    view = await find_model(state, body.model)
    setup = chat_setup(state, view, body.chat(), body.chat_messages())
    spec = state.plan(view, None).spec
    async with state.scheduler.use(spec, body.keep_alive, sequence=False) as loaded:
        counts = await runner_counter(loaded)([setup.text], True)
    return JSONResponse({"input_tokens": counts[0]})
