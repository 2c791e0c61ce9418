"""The one place where errors become HTTP answers, for both API families.

Routes raise ``modelhub.errors`` classes and never build an error body. Here an error's kind
gives the status (``ErrorKind.status``) and the body: Ollama's ``{"error": "..."}`` on
``/api/*`` (and everywhere else), OpenAI's ``{"error": {"message", "type", "param", "code"}}``
on ``/v1/*``, Anthropic's ``{"type": "error", "error": {"type", "message"}}`` on
``/v1/messages*`` (a busy daemon is its 529 ``overloaded_error``); in a stream that has
started, the same body is the last NDJSON line or SSE event.
The error's class and kind travel beside its body, so that a client can raise the same class
(``modelhub.client``, ``errors.rebuilt_error``): as the headers ``X-Modelhub-Error-Class`` and
``X-Modelhub-Error-Kind`` of an error answer, and as ``error_class`` and ``error_kind`` in the
last line of an Ollama stream (an answer whose status was already 200).
Anything that is not a ``ModelhubError`` is a bug: it is logged with its traceback and answered
as an internal error.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from modelhub.errors import ErrorKind, ModelhubError, ResponseNotFoundError, error_name
from modelhub.server.jsonbody import JSONResponse

log = logging.getLogger("modelhub.server")

Api = Literal["ollama", "openai", "anthropic"]


def api_of(path: str) -> Api:
    """Which family a request path belongs to."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
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
    if api == "anthropic":
        kind = _ANTHROPIC_TYPES.get(error.kind)
        kind = kind or ("invalid_request_error" if error.status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}
    stored = error if isinstance(error, ResponseNotFoundError) else None  # a param, no code
    return {
        "error": {
            "message": error.message,
            "type": "invalid_request_error" if error.status < 500 else "api_error",
            "param": stored.param if stored is not None else None,
            "code": None if stored is not None else _OPENAI_CODES.get(error.kind),
        }
    }


def stream_error_body(exc: BaseException, api: Api) -> dict[str, Any]:
    """The last line of a stream that failed: ``error_body``, and on Ollama's routes the
    error's class and kind (the stream's status said 200)."""
    error = as_error(exc)
    body = error_body(error, api)
    if api == "ollama":
        body.update(error_class=error_name(error), error_kind=error.kind.label)
    return body


def error_response(exc: BaseException, api: Api) -> JSONResponse:
    error = as_error(exc)
    headers = {CLASS_HEADER: error_name(error), KIND_HEADER: error.kind.label}
    return JSONResponse(error_body(error, api), status_code=status_of(error, api), headers=headers)


CLASS_HEADER, KIND_HEADER = "X-Modelhub-Error-Class", "X-Modelhub-Error-Kind"


def status_of(error: ModelhubError, api: Api) -> int:
    """The HTTP status of ``error`` in ``api``'s family."""
    if api == "anthropic" and error.kind is ErrorKind.BUSY:
        return 529  # Anthropic's "overloaded" (its SDKs retry it)
    return error.status


_OPENAI_CODES = {
    ErrorKind.NOT_FOUND: "model_not_found",
    ErrorKind.BUSY: "server_busy",
    ErrorKind.CANCELLED: "request_cancelled",
}
_ANTHROPIC_TYPES = {
    ErrorKind.UNAUTHORIZED: "authentication_error",
    ErrorKind.FORBIDDEN: "permission_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.BUSY: "overloaded_error",
}
