"""Log-probabilities as both API families ask for and return them.

The runner sends each token's ``{"token", "logprob", "bytes", "top"}`` (the engine computes it
from the target's distribution, see ``Sampler.log_distribution``); chat-style replies (Ollama's
``logprobs`` and OpenAI chat's ``logprobs.content``) carry
``{"token", "logprob", "bytes", "top_logprobs": [...]}`` per token, and OpenAI's legacy
completions the parallel arrays ``tokens`` / ``token_logprobs`` / ``top_logprobs`` /
``text_offset``.

A token the sampling options leave (next to) no chance has a log-probability of minus infinity,
which JSON cannot carry: it is written as ``-9999.0``, as OpenAI writes it.
"""

from __future__ import annotations

import math
from typing import Any

from modelhub.errors import InputError

MAX_TOP = 20
IMPOSSIBLE = -9999.0  # what a log-probability of minus infinity is written as


def requested(data: dict[str, Any]) -> int | None:
    """``logprobs`` (true) and ``top_logprobs`` (0..20) -> how many alternatives, or None."""
    wanted = data.get("logprobs")
    top = data.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise InputError('field "logprobs" must be a boolean')
    if top is not None and (not isinstance(top, int) or isinstance(top, bool)):
        raise InputError('field "top_logprobs" must be an integer')
    if top is not None and not 0 <= top <= MAX_TOP:
        raise InputError(f"top_logprobs must be between 0 and {MAX_TOP}, got {top}")
    if not wanted:
        if top:
            raise InputError("top_logprobs needs logprobs: true")
        return None
    return top or 0


def completion_requested(data: dict[str, Any]) -> int | None:
    """OpenAI's legacy completions: ``logprobs`` is the number of alternatives (0..5)."""
    n = data.get("logprobs")
    if n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 5:
        raise InputError("logprobs must be an integer between 0 and 5 on /v1/completions")
    return n


def value(logprob: Any) -> float:
    """A log-probability as JSON can carry it (minus infinity, or NaN, as :data:`IMPOSSIBLE`)."""
    number = float(logprob)
    return number if math.isfinite(number) else IMPOSSIBLE


def _token(raw: dict[str, Any]) -> dict[str, Any]:
    return {"token": raw["token"], "logprob": value(raw["logprob"]), "bytes": raw["bytes"]}


def entry(raw: dict[str, Any]) -> dict[str, Any]:
    """One token's entry, chat style."""
    return {**_token(raw), "top_logprobs": [_token(t) for t in raw.get("top", [])]}


def completion_block(raws: list[dict[str, Any]], start_offset: int = 0) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object for these tokens."""
    offsets, at = [], start_offset
    for raw in raws:
        offsets.append(at)
        at += len(raw["token"])
    return {
        "tokens": [r["token"] for r in raws],
        "token_logprobs": [value(r["logprob"]) for r in raws],
        "top_logprobs": [{t["token"]: value(t["logprob"]) for t in r.get("top", [])} for r in raws],
        "text_offset": offsets,
    }
