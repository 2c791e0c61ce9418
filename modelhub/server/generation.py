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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from modelhub.engine import protocol as proto
from modelhub.errors import ModelhubError, RequestCancelledError, RunnerProtocolError
from modelhub.replies.reply import ReplyPart
from modelhub.runtime.planning import Plan
from modelhub.runtime.scheduler import Loaded
from modelhub.server.errors import error_response, stream_error_body
from modelhub.server.jsonbody import JSONResponse, line
from modelhub.server.prompts import check_prompt_fits
from modelhub.server.state import ServerState
from modelhub.server.truncation import ChatFit, Count


@dataclass(frozen=True)
class Ready:
    """The request holds its model (loaded in ``load_duration`` ns) and its sequence."""

    load_duration: int


@dataclass(frozen=True)
class Finished:
    """The request's result; its prompt's length in tokens (``prompt_eval_count`` counts only
    those not already cached); and why the model answers without its draft models if it does
    (memory was short: ``LoadSpec.note``)."""

    result: proto.DoneResult
    prompt_tokens: int = 0
    note: str = ""

    @property
    def prompt_length(self) -> int:
        """The prompt's tokens, cached or not (what OpenAI's and Anthropic's usage count)."""
        return self.prompt_tokens or self.result.prompt_eval_count


# What a request on a runner yields to the routes, in order: Ready; then Prompt, Token...,
# Finished for a generation; Vectors..., Embeddings for an embedding.
Event = Ready | proto.Prompt | proto.Token | Finished | proto.Vectors | proto.Embeddings


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
    """Yield the request's events (``Event``), ``Ready`` first; an error the runner sends is
    raised as its class. With ``fit``, the prompt is what it makes on the runner
    (``msg.prompt`` is replaced)."""
    if isinstance(msg, proto.Generate):
        n_ctx = plan.spec.config.n_ctx
        text = fit.shortest() if fit is not None else msg.prompt
        await asyncio.to_thread(check_prompt_fits, state, plan.spec.model_blob, text, n_ctx)
    # An embedding takes no sequence: it runs beside generations (see runtime.scheduler).
    sequence = not isinstance(msg, proto.Embed)
    async with state.scheduler.use(plan.spec, keep_alive, sequence=sequence) as loaded:
        yield Ready(time.monotonic_ns() - started_ns)
        if fit is not None and isinstance(msg, proto.Generate):
            count = runner_counter(loaded, fit.count_fields())
            msg = msg.model_copy(update={"prompt": await fit(count, context_size(loaded))})
        prompt_tokens = 0
        async for event in loaded.process.request(msg):
            proto.raise_if_error(event)  # the class the runner raised
            if isinstance(event, proto.Token):
                loaded.drafting.add_token(event.drafted)
            elif isinstance(event, proto.Prompt):
                prompt_tokens = event.prompt_tokens
            if isinstance(event, proto.Done):
                loaded.drafting.add_result(event.result)
                yield Finished(event.result, prompt_tokens, loaded.spec.note)
            elif isinstance(event, proto.Prompt | proto.Token | proto.Vectors | proto.Embeddings):
                yield event
            else:
                raise RunnerProtocolError(
                    f"runner protocol: a {event.event!r} event answered {msg.op!r}"
                )


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
            if isinstance(event, proto.Counts):
                counts = event.counts
        if counts is None or len(counts) != len(texts):
            raise ModelhubError("the model runner answered no token counts")
        return counts

    return count


def context_size(loaded: Loaded) -> int:
    """The context the runner has (llama.cpp may round it; the trained length caps it)."""
    return loaded.info.n_ctx or loaded.spec.config.n_ctx


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
            if first_token_only and isinstance(event, proto.Token | Finished):
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
) -> Finished:
    """An unstreamed answer: each token's reply part, then the reader's last one, handed to
    ``take`` in order; returns the request's end."""
    done: Finished | None = None
    async for ev in events:
        if isinstance(ev, proto.Token):
            take(reader.parse(ev.text))
        elif isinstance(ev, Finished):
            done = ev
    take(reader.finish())
    if done is None:
        raise ModelhubError("generation ended without a result")
    return done


async def respond(
    events: AsyncIterator[Event],
    request: Request,
    *,
    stream: bool,
    chunk: Shape,
    final: Callable[[Finished], dict[str, Any] | None],
    on_done: Callable[[Finished], None] | None = None,
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
        if isinstance(event, Finished):
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
                if isinstance(event, Finished):
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


def final_stats(done: Finished, started_ns: int, load_ns: int) -> dict[str, Any]:
    """Ollama's counters (nanoseconds, zero values omitted) plus the draft statistics (all of
    them once anything was drafted)."""
    result = done.result
    stats = {
        "total_duration": time.monotonic_ns() - started_ns,
        "load_duration": load_ns,
        "prompt_eval_count": result.prompt_eval_count,
        "prompt_eval_duration": result.prompt_eval_duration_ns,
        "eval_count": result.eval_count,
        "eval_duration": result.eval_duration_ns,
    }
    out = {**{k: v for k, v in stats.items() if v}, **draft_stats(result)}
    if done.note:
        out["draft_note"] = done.note
    return out


def draft_stats(result: proto.DoneResult) -> dict[str, Any]:
    """What drafting did for a request (nothing when nothing was drafted): guesses checked and
    kept, per draft position, the drafter that guessed most, and the speed-up against the
    controller's estimate of plain decoding for the same tokens."""
    if result.draft_count <= 0:
        return {}
    out: dict[str, Any] = {
        "draft_count": result.draft_count,
        "draft_accepted_count": result.draft_accepted_count,
        "draft_count_by_position": list(result.draft_count_by_position),
        "draft_accepted_by_position": list(result.draft_accepted_by_position),
    }
    if result.drafter_name:
        out["drafter"] = result.drafter_name
    plain, spent = result.plain_estimate_ns, result.eval_duration_ns
    if plain > 0 and spent > 0:
        out["draft_speedup"] = round(plain / spent, 2)
    return out
