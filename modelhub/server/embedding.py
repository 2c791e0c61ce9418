"""Embeddings for both API families: run the texts on the model's runner, normalise."""

from __future__ import annotations

import math
from typing import Any

from modelhub.engine import protocol as proto
from modelhub.errors import InputError, ModelhubError
from modelhub.library.views import ModelView
from modelhub.server.generation import Ready, run_on_runner
from modelhub.server.state import ServerState


def input_texts(value: Any, *, allow_empty: bool) -> list[str]:
    """``input``: a string or an array of strings (empty only where a route allows it)."""
    if value is None or value == "" or value == []:
        if allow_empty:
            return []
    elif isinstance(value, str):
        return [value]
    elif isinstance(value, list) and all(isinstance(x, str) for x in value):
        return list(value)
    raise InputError("input must be a non-empty string or array of strings")


async def embed_texts(
    state: ServerState,
    view: ModelView,
    texts: list[str],
    options: dict[str, Any],
    keep_alive: float | None,
    started: int,
) -> tuple[list[list[float]], int, int]:
    """(vectors, prompt tokens, load nanoseconds)."""
    # The plan of a generation with these options: one loaded runner serves both.
    p = state.plan(
        view,
        options,
    )
    load_ns = 0
    vectors: list[list[float]] = []
    count = 0
    async for ev in run_on_runner(state, p, keep_alive, proto.Embed(texts=texts), started):
        if isinstance(ev, Ready):
            load_ns = ev.load_duration
        elif isinstance(ev, proto.Vectors | proto.Embeddings):  # pieces, then the last one
            vectors.extend(ev.embeddings)
            if isinstance(ev, proto.Embeddings):
                count = ev.prompt_eval_count
    return vectors, count, load_ns


def normalise(vec: list[float], dims: int) -> list[float]:
    """Cut to ``dims`` (0: keep all) and scale to unit length."""
    if 0 < dims < len(vec):
        vec = vec[:dims]
    if not all(math.isfinite(v) for v in vec):
        raise ModelhubError("the model produced a non-finite embedding value")
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]
