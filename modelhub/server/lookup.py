"""The stored model a request names, with the same answers on every route."""

from __future__ import annotations

import asyncio

from modelhub.errors import InputError, NotFoundError
from modelhub.library.views import ModelView
from modelhub.server.state import ServerState
from modelhub.store import ModelName, parse_name
from modelhub.templates.prompt import prepare_templates


async def find_model(state: ServerState, raw: str) -> ModelView:
    """The model ``raw`` names (``x:local`` is ``x``): 400 for a bad name (the name grammar's
    reason), 404 ``model 'x' not found`` if there is none."""
    if raw.lower().endswith(":cloud"):
        raise InputError("cloud models are not supported by modelhub")
    name = parse_name(raw[: -len(":local")] if raw.lower().endswith(":local") else raw)
    try:
        return await asyncio.to_thread(_view, state, name)
    except NotFoundError:
        raise NotFoundError(f"model '{raw}' not found") from None


def _view(state: ServerState, name: ModelName) -> ModelView:
    """The model's view, its template parsed into the cache (seconds for a large one, which
    must not run on the event loop when a prompt is rendered)."""
    view = state.views.get(name)
    prepare_templates(view.template, view.info.chat_template if view.info else None)
    return view
