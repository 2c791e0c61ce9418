"""What the store holds, as ``/api/tags`` lists it and ``/api/verify`` checks it.

A damaged model (``library.damage``) is listed with the others, with ``"state": "damaged"`` and
``"damage"``: what is wrong and how to repair it. ``/api/verify`` re-hashes every blob of the
models it is asked about (a corrupt one is removed from the store, so that a pull or create can
bring it back) and reports each model as ``ok`` or ``damaged``.
"""

from __future__ import annotations

from typing import Any

from modelhub.errors import DamagedModelError, ModelhubError
from modelhub.gguf.info import capabilities
from modelhub.library.damage import content_problems, repair_hint
from modelhub.library.views import ModelView, ModelViews, rfc3339_local
from modelhub.store import ModelName, Store, StoredModel

EMPTY_DETAILS: dict[str, Any] = {
    "parent_model": "",
    "format": "",
    "family": "",
    "families": None,
    "parameter_size": "",
    "quantization_level": "",
}


def tag_entry(view: ModelView) -> dict[str, Any]:
    """A usable model's entry of ``/api/tags`` (Ollama's fields)."""
    stored = view.stored
    entry: dict[str, Any] = {
        "name": stored.name.display,
        "model": stored.name.display,
        "modified_at": view.modified_at,
        "size": stored.size,
        "digest": stored.digest,
        "details": view.details(),
    }
    if view.info is not None:
        entry["capabilities"] = capabilities(view.info, view.template)
    return entry


def damaged_entry(
    name: ModelName, modified: float, damage: str, stored: StoredModel | None = None
) -> dict[str, Any]:
    """The entry of a model that cannot be used: what is wrong in ``damage``."""
    return {
        "name": name.display,
        "model": name.display,
        "modified_at": rfc3339_local(modified),
        "size": stored.size if stored is not None else 0,
        "digest": stored.digest if stored is not None else "",
        "details": dict(EMPTY_DETAILS),
        "state": "damaged",
        "damage": damage,
    }


def list_entries(store: Store, views: ModelViews) -> list[dict[str, Any]]:
    """Every model of the store, newest first, damaged ones with what is wrong (blocking: a
    ``stat`` per blob and a GGUF header per model, cached)."""
    models, unreadable = store.scan_models()
    entries = []
    for stored in models:
        try:
            entries.append(tag_entry(views.view(stored)))
        except ModelhubError as exc:
            entries.append(damaged_entry(stored.name, stored.modified, exc.message, stored))
    for name, modified, problem in unreadable:
        entries.append(damaged_entry(name, modified, _unreadable(name, problem)))
    return entries


def verify_models(store: Store, views: ModelViews, name: ModelName | None) -> list[dict[str, Any]]:
    """Re-hash the blobs of the model ``name`` (all models when None); one report each:
    ``{"name", "state": "ok" | "damaged", "problems", "repair"}`` (blocking, slow: reads
    every blob once per state of its file)."""
    unreadable: list[tuple[ModelName, float, str]] = []
    if name is not None:
        models = [store.get(name)]
    else:
        models, unreadable = store.scan_models()
    reports = []
    for stored in models:
        display = stored.name.display
        problems = content_problems(store, stored.manifest)
        if not problems:
            try:
                views.view(stored)
            except DamagedModelError as exc:
                problems = exc.problems
            except ModelhubError as exc:
                problems = [exc.message]
        reports.append(_report(display, problems))
    for bad, _modified, problem in unreadable:
        reports.append(_report(bad.display, [_unreadable(bad, problem)]))
    return reports


def _report(display: str, problems: list[str]) -> dict[str, Any]:
    if not problems:
        return {"name": display, "state": "ok"}
    return {
        "name": display,
        "state": "damaged",
        "problems": problems,
        "repair": repair_hint(display),
    }


def _unreadable(name: ModelName, problem: str) -> str:
    """A manifest that cannot be read (the problem says how to repair it)."""
    return f"model '{name.display}' is damaged: {problem}"
