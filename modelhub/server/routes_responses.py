"""OpenAI's Responses API: ``POST /v1/responses``, served as a chat completion, and the stored
responses (``GET`` and ``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``).

The request becomes the chat-completions request it means (``server/responses_request.py``) and
runs through the same path (templates, thinking, tool calls, grammars, truncation); the reply
comes back as output items (``server/responses_reply.py``). With ``store`` (the default, as
OpenAI) the answer is kept on disk (``server/responses_store.py``) and a later request continues
it with ``previous_response_id``: the stored conversation (input items, outputs, tool calls and
reasoning) comes before the new input. ``MODELHUB_RESPONSES_STORE=0`` keeps nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from modelhub.engine import protocol as proto
from modelhub.errors import InputError, ModelhubError
from modelhub.replies.reply import ReplyPart
from modelhub.server.completion_request import chat_setup, completion_events
from modelhub.server.errors import error_body
from modelhub.server.generation import Event, Finished, chained, collect, gathered
from modelhub.server.jsonbody import JSONResponse
from modelhub.server.lookup import find_model
from modelhub.server.request_models import openapi_body, read_request
from modelhub.server.responses_reply import Reply, Streamer, whole_reply
from modelhub.server.responses_request import ResponsesBody
from modelhub.server.responses_store import ResponseStore, StoredResponse
from modelhub.server.state import get_state

router = APIRouter()
Save = Callable[[dict[str, Any]], Awaitable[None]]


@router.post("/v1/responses", openapi_extra=openapi_body(ResponsesBody))
async def responses(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    body = await read_request(request, ResponsesBody)
    store = state.responses
    previous = await _previous(store, body.previous_response_id)
    context = previous.conversation() if previous is not None else []
    chat = body.chat(context)
    view = await find_model(state, body.model)
    setup = chat_setup(state, view, chat)
    events = completion_events(state, chat, setup, view, started)
    head = await collect(events, request, first_token_only=body.stream)

    keep = body.store and store.enabled
    reply = Reply(body, previous=previous.ident if previous else None, stored=keep)

    async def save(response: dict[str, Any]) -> None:
        if keep:
            await asyncio.to_thread(store.put, StoredResponse(response, body.input, context))

    if not body.stream:
        whole = ReplyPart()
        result = await gathered(chained(head, events), setup, whole.add)
        whole_reply(reply, whole)
        answer = reply.response("completed", result)
        await save(answer)
        return JSONResponse(answer)
    return StreamingResponse(
        _streamed(reply, setup, chained(head, events), save), media_type="text/event-stream"
    )


async def _previous(store: ResponseStore, ident: str | None) -> StoredResponse | None:
    """The stored response ``previous_response_id`` continues (404 when there is none)."""
    if ident is None:
        return None
    if not store.enabled:
        raise InputError(
            "previous_response_id cannot be used: this daemon stores no responses "
            "(MODELHUB_RESPONSES_STORE=0); send the whole conversation in input"
        )
    return await asyncio.to_thread(store.get, ident, "previous_response_id")


async def _streamed(
    reply: Reply, setup: Any, events: AsyncIterator[Event], save: Save
) -> AsyncIterator[bytes]:
    streamer = Streamer(reply)
    yield reply.event("response.created", response=reply.response("in_progress"))
    yield reply.event("response.in_progress", response=reply.response("in_progress"))
    try:
        async for ev in events:
            if isinstance(ev, proto.Token):
                for chunk in streamer.part(setup.parse(ev.text)):
                    yield chunk
            elif isinstance(ev, Finished):
                for chunk in streamer.part(setup.finish()):
                    yield chunk
                last = streamer.finish(ev)
                if streamer.final is not None:
                    await save(streamer.final)  # stored before the client hears it is done
                for chunk in last:
                    yield chunk
    except ModelhubError as exc:
        yield reply.event("error", **error_body(exc, "openai")["error"])


# ---- stored responses ---------------------------------------------------------------------------
@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    store = get_state(request).responses
    record = await asyncio.to_thread(store.get, response_id)
    return JSONResponse(record.response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    store = get_state(request).responses
    await asyncio.to_thread(store.delete, response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(request: Request, response_id: str) -> Response:
    """The input items of a stored response's request (not those of the responses it
    continued), ``order`` ``desc`` by default as OpenAI, ``limit`` 1-100 (20), ``after`` an
    item id."""
    query = request.query_params
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InputError('order must be "asc" or "desc"')
    store = get_state(request).responses
    items = (await asyncio.to_thread(store.get, response_id)).input_items
    ordered = items if order == "asc" else items[::-1]
    start = 0
    after = query.get("after")
    if after:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise InputError(f"after: no input item {after!r} in response {response_id!r}")
        start = ids.index(after) + 1
    page = ordered[start : start + limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(ordered),
        }
    )


def _limit(raw: str | None) -> int:
    if raw is None:
        return 20
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise InputError(f"limit must be a number from 1 to 100, got {raw!r}")
    return int(raw)
