"""The one place where errors become HTTP answers, for both API families.

Routes raise ``modelhub.errors`` classes and never build an error body. Here an error's kind
gives the status (``ErrorKind.status``) and the body: Ollama's ``{"error": "..."}`` on
``/api/*`` (and everywhere else), OpenAI's ``{"error": {"message", "type", "param", "code"}}``
on ``/v1/*``; in a stream that has started, the same body is the last NDJSON line or SSE event.
Anything that is not a ``ModelhubError`` is a bug: it is logged with its traceback and answered
as an internal error.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from modelhub.errors import ErrorKind, ModelhubError, ResponseNotFoundError
from modelhub.server.jsonbody import JSONResponse

log = logging.getLogger("modelhub.server")

Api = Literal["ollama", "openai"]


def api_of(path: str) -> Api:
    """Which family a request path belongs to."""
    return "openai" if path == "/v1" or path.startswith("/v1/") else "ollama"


def as_error(exc: BaseException) -> ModelhubError:
    """``exc`` as one of ours; an unexpected exception is logged and becomes internal."""
    if isinstance(exc, ModelhubError):
        return exc
    log.error("internal error", exc_info=exc)
    return ModelhubError(f"internal error: {type(exc).__name__}: {exc}")


def error_body(exc: BaseException, api: Api) -> dict[str, Any]:
    error = as_error(exc)
    if api == "ollama":
        return {"error": error.message}
    stored = error if isinstance(error, ResponseNotFoundError) else None  # a param, no code
    return {
        "error": {
            "message": error.message,
            "type": "invalid_request_error" if error.status < 500 else "api_error",
            "param": stored.param if stored is not None else None,
            "code": None if stored is not None else _OPENAI_CODES.get(error.kind),
        }
    }


def error_response(exc: BaseException, api: Api) -> JSONResponse:
    error = as_error(exc)
    return JSONResponse(error_body(error, api), status_code=error.status)


_OPENAI_CODES = {
    ErrorKind.NOT_FOUND: "model_not_found",
    ErrorKind.BUSY: "server_busy",
    ErrorKind.CANCELLED: "request_cancelled",
}
