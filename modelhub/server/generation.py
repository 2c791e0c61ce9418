"""Running one request on a runner and shaping its events into responses.

Errors before the first byte are JSON errors with their status; after that, the stream ends
with an ``{"error": ...}`` line. A client that disconnects cancels the request in the runner
(the runner stops at its next decode step).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from modelhub.engine import protocol as proto
from modelhub.errors import ModelhubError, RequestCancelledError
from modelhub.replies.reply import ReplyPart
from modelhub.runtime.planning import Plan
from modelhub.runtime.scheduler import Loaded
from modelhub.server.errors import error_response, stream_error_body
from modelhub.server.jsonbody import JSONResponse, line
from modelhub.server.prompts import check_prompt_fits
from modelhub.server.state import ServerState
from modelhub.server.truncation import ChatFit, Count

Event = dict[str, Any]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def run_on_runner(
    state: ServerState,
    plan: Plan,
    keep_alive: float | None,
    msg: proto.Generate | proto.Embed,
    started_ns: int,
    fit: ChatFit | None = None,
) -> AsyncIterator[Event]:
    """Yield runner events; the first one is ``{"event": "ready", "load_duration": ns}``.
    With ``fit``, the prompt is what it makes on the runner (``msg.prompt`` is replaced)."""
    if isinstance(msg, proto.Generate):
        n_ctx = plan.spec.config.n_ctx
        text = fit.shortest() if fit is not None else msg.prompt
        await asyncio.to_thread(check_prompt_fits, state, plan.spec.model_blob, text, n_ctx)
    # An embedding takes no sequence: it runs beside generations (see runtime.scheduler).
    sequence = not isinstance(msg, proto.Embed)
    async with state.scheduler.use(plan.spec, keep_alive, sequence=sequence) as loaded:
        yield {"event": "ready", "load_duration": time.monotonic_ns() - started_ns}
        if fit is not None and isinstance(msg, proto.Generate):
            count = runner_counter(loaded, fit.count_fields())
            msg = msg.model_copy(update={"prompt": await fit(count, context_size(loaded))})
        async for event in loaded.process.request(msg):
            proto.raise_if_error(event)  # the class the runner raised
            kind_of = event.get("event")
            if kind_of == "token":
                loaded.drafting.add_token(bool(event.get("drafted")))
            elif kind_of == "done":
                loaded.drafting.add_result(event.get("result") or {})
                if loaded.spec.note:  # loaded without its draft models: say so
                    event = {**event, "result": {**event["result"], "note": loaded.spec.note}}
            yield event


async def fitted_prompt(
    state: ServerState, plan: Plan, keep_alive: float | None, fit: ChatFit
) -> str:
    """The prompt ``fit`` makes on the plan's runner, without generating (Ollama's
    ``_debug_render_only``)."""
    async with state.scheduler.use(plan.spec, keep_alive) as loaded:
        return await fit(runner_counter(loaded, fit.count_fields()), context_size(loaded))


def runner_counter(loaded: Loaded, extra: dict[str, Any] | None = None) -> Count:
    """Token counts from the runner's own tokenizer (``op: count``); ``extra``: the request's
    image fields (``RequestImages.count_fields``), so that images count as their positions."""

    async def count(texts: list[str], add_special: bool) -> list[int]:
        msg = proto.Count(texts=texts, add_special=add_special, **(extra or {}))
        counts: list[int] | None = None
        async for event in loaded.process.request(msg):  # ends after its final event
            proto.raise_if_error(event)
            if event.get("event") == "counts":
                counts = [int(n) for n in event["counts"]]
        if counts is None or len(counts) != len(texts):
            raise ModelhubError("the model runner answered no token counts")
        return counts

    return count


def context_size(loaded: Loaded) -> int:
    """The context the runner has (llama.cpp may round it; the trained length caps it)."""
    return int(loaded.info.get("n_ctx") or loaded.spec.config.n_ctx)


def ndjson(obj: dict[str, Any]) -> bytes:
    return line(obj)


Shape = Callable[[Event], dict[str, Any] | None]


async def collect(
    events: AsyncIterator[Event], request: Request, *, first_token_only: bool
) -> list[Event]:
    """Read events (up to the first token, or all) while watching for a client hang-up.

    Before a response has started nothing else notices a disconnect, so a client that gives up
    while queued, loading or evaluating its prompt would otherwise keep the runner busy.
    """
    got: list[Event] = []

    async def read() -> None:
        async for event in events:
            got.append(event)
            if first_token_only and event.get("event") in ("token", "done"):
                return

    task = asyncio.create_task(read())
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.1)
        if done:
            task.result()  # re-raises a ModelhubError from the runner
            return got
        if await request.is_disconnected():
            task.cancel()  # unwinds the runner request: it sends "cancel" to the runner
            with contextlib.suppress(asyncio.CancelledError, ModelhubError):
                await task
            raise RequestCancelledError("request canceled")


async def chained(head: list[Event], rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """The events ``collect`` read first, then the rest of the stream."""
    for event in head:
        yield event
    async for event in rest:
        yield event


class ReplyReader(Protocol):
    """What reads a reply's text into parts as it comes (``completion_request.Setup``)."""

    def parse(self, text: str) -> ReplyPart: ...

    def finish(self) -> ReplyPart: ...


async def gathered(
    events: AsyncIterator[Event], reader: ReplyReader, take: Callable[[ReplyPart], object]
) -> dict[str, Any]:
    """An unstreamed answer: each token's reply part, then the reader's last one, handed to
    ``take`` in order; returns the ``done`` event's result (empty without one)."""
    result: dict[str, Any] = {}
    async for ev in events:
        if ev.get("event") == "token":
            take(reader.parse(str(ev.get("text", ""))))
        elif ev.get("event") == "done":
            result = ev["result"]
    take(reader.finish())
    return result


async def respond(
    events: AsyncIterator[Event],
    request: Request,
    *,
    stream: bool,
    chunk: Shape,
    final: Shape,
    on_done: Callable[[Event], None] | None = None,
) -> Response:
    """Turn runner events into NDJSON (stream) or one JSON object (stream: false).

    Events are buffered until the first token (or the end), so that every failure before
    generation starts (unknown model, load error, prompt too long) keeps its HTTP status.
    """
    try:
        head = await collect(events, request, first_token_only=stream)
    except ModelhubError as exc:
        return error_response(exc, "ollama")

    def shape(event: Event) -> dict[str, Any] | None:
        if event.get("event") == "done":
            if on_done:
                on_done(event)
            return final(event)
        return chunk(event)

    if not stream:
        parts: list[dict[str, Any]] = []
        last: dict[str, Any] | None = None
        try:
            async for event in chained(head, events):
                shaped = shape(event)
                if shaped is None:
                    continue
                if event.get("event") == "done":
                    last = shaped
                else:
                    parts.append(shaped)
        except ModelhubError as exc:
            return error_response(exc, "ollama")
        if last is None:
            return error_response(ModelhubError("generation ended without a result"), "ollama")
        return JSONResponse(merge_parts(parts, last))

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for event in chained(head, events):
                shaped = shape(event)
                if shaped is not None:
                    yield ndjson(shaped)
        except ModelhubError as exc:
            yield ndjson(stream_error_body(exc, "ollama"))

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def merge_parts(parts: list[dict[str, Any]], last: dict[str, Any]) -> dict[str, Any]:
    """stream:false: concatenate the streamed text into the final object."""
    out = dict(last)
    entries = [e for p in [*parts, last] for e in p.get("logprobs", [])]
    if entries:
        out["logprobs"] = entries
    if "response" in out:
        out["response"] = "".join(p.get("response", "") for p in parts) + out["response"]
        thinking = "".join(p.get("thinking", "") for p in [*parts, last])
        if thinking:
            out["thinking"] = thinking
    if "message" in out:
        messages = [p.get("message", {}) for p in [*parts, last]]
        merged = {**out["message"], "content": "".join(m.get("content", "") for m in messages)}
        thinking = "".join(m.get("thinking", "") for m in messages)
        calls = [c for m in messages for c in m.get("tool_calls", [])]
        if thinking:
            merged["thinking"] = thinking
        if calls:
            merged["tool_calls"] = calls
        out["message"] = merged
    return out


def final_stats(result: dict[str, Any], started_ns: int, load_ns: int) -> dict[str, Any]:
    """Ollama's counters (nanoseconds, zero values omitted) plus the draft statistics (all of
    them once anything was drafted)."""
    stats = {
        "total_duration": time.monotonic_ns() - started_ns,
        "load_duration": load_ns,
        "prompt_eval_count": result.get("prompt_eval_count", 0),
        "prompt_eval_duration": result.get("prompt_eval_duration_ns", 0),
        "eval_count": result.get("eval_count", 0),
        "eval_duration": result.get("eval_duration_ns", 0),
    }
    out = {**{k: v for k, v in stats.items() if v}, **draft_stats(result)}
    if result.get("note"):
        out["draft_note"] = result["note"]
    return out


def draft_stats(result: dict[str, Any]) -> dict[str, Any]:
    """What drafting did for a request (nothing when nothing was drafted): guesses checked and
    kept, per draft position, the drafter that guessed most, and the speed-up against the
    controller's estimate of plain decoding for the same tokens."""
    count = int(result.get("draft_count") or 0)
    if count <= 0:
        return {}
    out: dict[str, Any] = {
        "draft_count": count,
        "draft_accepted_count": int(result.get("draft_accepted_count") or 0),
        "draft_count_by_position": list(result.get("draft_count_by_position") or []),
        "draft_accepted_by_position": list(result.get("draft_accepted_by_position") or []),
    }
    if result.get("drafter_name"):
        out["drafter"] = result["drafter_name"]
    plain, spent = result.get("plain_estimate_ns") or 0, result.get("eval_duration_ns") or 0
    if plain > 0 and spent > 0:
        out["draft_speedup"] = round(plain / spent, 2)
    return out
