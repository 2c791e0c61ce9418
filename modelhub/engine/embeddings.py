"""Embeddings: one L2-normalised vector per text, pooled by the model's own pooling type (mean
when it declares none), from a context of their own so that embedding never touches the
generation context's cache.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from modelhub.engine.context import LlamaContext
from modelhub.engine.llama import LlamaModel
from modelhub.errors import InputError


def embedding_context(model: LlamaModel, n_ctx: int, n_threads: int) -> LlamaContext:
    """A context for embedding with ``model``: at most 8192 positions, all in one batch."""
    size = min(n_ctx, 8192)
    pooling = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    native = model.meta(f"{model.architecture}.pooling_type")
    if native is not None and native.isdigit() and int(native) > 0:
        pooling = int(native)
    return LlamaContext(
        model,
        n_ctx=size,
        n_batch=size,
        n_threads=n_threads,
        embeddings=True,
        pooling=pooling,
    )


def embed_texts(model: LlamaModel, ctx: LlamaContext, texts: list[str]) -> list[list[float]]:
    """The normalised embedding of each text, each decoded alone in ``ctx``."""
    out: list[list[float]] = []
    for text in texts:
        tokens = model.tokenize(text, add_special=True, parse_special=False)
        if not tokens:
            raise InputError("cannot embed an empty input")
        if len(tokens) > ctx.n_batch:
            raise InputError(
                f"input has {len(tokens)} tokens; at most {ctx.n_batch} can be embedded"
            )
        ctx.clear()
        ctx.decode(tokens, 0, "all")
        vector = ctx.embeddings_seq().astype(np.float64)
        norm = float(np.linalg.norm(vector))
        out.append((vector / norm if norm > 0 else vector).tolist())
    return out
