"""OpenAI's model list and embeddings: ``GET /v1/models``, ``GET /v1/models/{model}`` and
``POST /v1/embeddings``.

The generating routes are elsewhere: /v1/chat/completions and /v1/completions in
``routes_completions.py``, /v1/responses in ``routes_responses.py`` and /v1/messages
(Anthropic's) in ``routes_messages.py``. Errors use OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from modelhub.server.embedding import embed_texts, normalise
from modelhub.server.jsonbody import JSONResponse
from modelhub.server.lookup import find_model
from modelhub.server.openai_models import EmbeddingsRequestBody
from modelhub.server.request_models import openapi_body, read_request
from modelhub.server.state import get_state

router = APIRouter()


def _model_entry(name: str, modified: float) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(modified), "owned_by": "library"}


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    state = get_state(request)
    data = [_model_entry(m.name.display, m.modified) for m in state.store.list_models()]
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/models/{model:path}")
async def get_model(request: Request, model: str) -> Response:
    view = await find_model(get_state(request), model)
    return JSONResponse(_model_entry(view.name.display, view.stored.modified))


@router.post("/v1/embeddings", openapi_extra=openapi_body(EmbeddingsRequestBody))
async def embeddings(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    body = await read_request(request, EmbeddingsRequestBody)
    view = await find_model(state, body.model)
    vectors, count, _ = await embed_texts(state, view, body.input, {}, None, started)
    if body.encoding_format == "base64":
        items: list[Any] = [
            base64.b64encode(struct.pack(f"<{len(v)}f", *normalise(v, body.dimensions))).decode()
            for v in vectors
        ]
    else:
        items = [normalise(v, body.dimensions) for v in vectors]
    data = [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(items)]
    usage = {"prompt_tokens": count, "total_tokens": count}
    return JSONResponse({"object": "list", "data": data, "model": body.model, "usage": usage})
