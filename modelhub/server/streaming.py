"""Run a blocking job in a thread and stream its progress events as NDJSON.

The job reports :class:`~modelhub.pull.base.ProgressEvent` objects (pull and create); each
becomes one line, its warning (if any) in a ``warning`` field beside the ``status``.

Ollama's rule: an error before anything was streamed is a normal JSON error with its status;
once a line went out, the status is 200 and the error is one last ``{"error": ...}`` line.
With ``stream: false`` the reply is the last object (or the error with its status).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import Response, StreamingResponse

from modelhub.pull.base import Progress, ProgressEvent
from modelhub.server.errors import as_error, error_response, stream_error_body
from modelhub.server.jsonbody import JSONResponse, line

log = logging.getLogger(__name__)

Job = Callable[[Progress], None]
_DONE = object()


async def run_streaming(job: Job, stream: bool, cancel: threading.Event | None = None) -> Response:
    """``cancel`` is set when the client goes away before the job is done."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def emit(event: ProgressEvent) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    def worker() -> None:
        try:
            job(emit)
        except BaseException as exc:  # reported to the client, never lost
            loop.call_soon_threadsafe(queue.put_nowait, as_error(exc))
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)

    threading.Thread(target=worker, daemon=True).start()

    if not stream:
        last: ProgressEvent | None = None
        while (item := await queue.get()) is not _DONE:
            if isinstance(item, BaseException):
                while await queue.get() is not _DONE:
                    pass
                return error_response(item, "ollama")
            last = item
        return JSONResponse(last.to_json() if last is not None else {})

    first = await queue.get()
    if isinstance(first, BaseException):
        return error_response(first, "ollama")

    async def lines() -> AsyncIterator[bytes]:
        item = first
        try:
            while item is not _DONE:
                if isinstance(item, BaseException):
                    yield _line(stream_error_body(item, "ollama"))
                else:
                    yield _line(item.to_json())
                item = await queue.get()
        finally:
            if item is not _DONE and cancel is not None:
                cancel.set()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _line(obj: dict[str, Any]) -> bytes:
    return line(obj)
