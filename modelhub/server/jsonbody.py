"""The one JSON encoding of response bodies: whole answers, NDJSON lines and SSE events.

Every body is valid JSON (RFC 8259) in UTF-8, whatever reaches it: a float JSON cannot carry
(NaN, an infinity) is written as ``null`` and logged as the bug it is, and a lone surrogate
(request text is cleaned of them when read, but a file name read from disk may hold one) as
U+FFFD. Python's ``json`` would otherwise write the non-standard ``NaN`` into a stream, or fail
the whole answer with a 500.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

from fastapi.responses import JSONResponse as _StarletteJSONResponse

log = logging.getLogger("modelhub.server")

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(obj: Any) -> bytes:
    """``obj`` as compact JSON in UTF-8 (no trailing newline)."""
    try:
        text = _dumps(obj)
    except ValueError:
        log.warning("a response held a number JSON cannot carry; it is written as null")
        text = _dumps(_finite(obj))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def line(obj: Any) -> bytes:
    """One NDJSON line."""
    return encode(obj) + b"\n"


def sse(obj: Any) -> bytes:
    """One server-sent ``data:`` event."""
    return b"data: " + encode(obj) + b"\n\n"


class JSONResponse(_StarletteJSONResponse):
    """FastAPI's JSONResponse, encoded by :func:`encode`."""

    def render(self, content: Any) -> bytes:
        return encode(content)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: _finite(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(value) for value in obj]
    return obj
