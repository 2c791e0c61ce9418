"""``show``'s ``drafting`` object (the drafters a model has, and what they measured) and
``/api/ps``'s ``draft`` (what a loaded model's drafters did since the load).

The figures come from the loaded runner when the model is loaded (``op: drafting``), else from
what the last load kept in the model's state directory (``engine.drafting_state``): per
drafter, acceptance, the cost of one guess against a target step, the best length, the
expected speed-up and how many rounds and requests the figures rest on, and the drafter
expected to pay most (``in_use``; None when none is expected to beat plain decoding).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from modelhub.engine import protocol as proto
from modelhub.errors import ModelhubError
from modelhub.library.drafters import DrafterOption, auto_drafters, draft_mode, fixed_drafter
from modelhub.library.views import ModelView
from modelhub.runtime.scheduler import Loaded
from modelhub.server.state import ServerState, catalog_drafts

NGRAM = {"name": "ngram", "kind": "ngram", "origin": "built in: guesses from text already seen"}


async def drafting_payload(state: ServerState, view: ModelView) -> dict[str, Any]:
    mode = draft_mode(view, state.settings.draft)
    options: list[DrafterOption] = []
    if mode == "fixed":
        fixed = fixed_drafter(view)
        options = [fixed] if fixed is not None else []
    elif mode == "auto":
        options = await asyncio.to_thread(auto_drafters, view, state.views, catalog_drafts(view))
    drafters = [{"name": o.name, "kind": o.kind, "origin": o.origin} for o in options]
    if not any(d["name"] == "ngram" for d in drafters):
        drafters.append(
            dict(NGRAM, origin=NGRAM["origin"] if mode == "auto" else "on request only")
        )
    out: dict[str, Any] = {"mode": mode, "drafters": drafters}
    measured = await _measured(state, view)
    if measured:
        out["measured"] = measured
    return out


async def _measured(state: ServerState, view: ModelView) -> dict[str, Any] | None:
    layer = view.model_layer
    if layer is None:
        return None
    for loaded in state.scheduler.snapshot():
        if loaded.spec.model_blob == layer.digest and loaded.usable:
            try:
                async for event in loaded.process.request(proto.Drafting()):
                    if isinstance(event, proto.DraftingReport):
                        return event.report
            except ModelhubError:
                break
    path = state.store.drafting_dir(layer.digest) / "drafting.json"
    try:
        doc = json.loads(await asyncio.to_thread(path.read_text, encoding="utf-8"))
    except (OSError, ValueError):
        return None
    summary = doc.get("summary") if isinstance(doc, dict) else None
    return summary if isinstance(summary, dict) else None


def ps_draft(loaded: Loaded, config: dict[str, Any], kv_cache_type: str) -> dict[str, Any]:
    """A loaded model's drafting: how it was configured, and what its drafters did since the
    load (acceptance of finished requests; the share of streamed tokens that came from
    accepted drafts, counted live)."""
    tally = loaded.drafting
    out: dict[str, Any] = {
        # A fixed drafter by the kind show and the Modelfile use (``mtp_drafter`` for a Gemma 4
        # assistant, which the engine runs as ``mtp``); else auto or none.
        "kind": config.get("draft_name") or config["draft_kind"],
        "drafters": list(loaded.info.default_drafters),
        "draft_num_predict": config.get("draft_num_predict"),
        "adaptive": bool(config.get("adaptive", True)),
        "devices": list(loaded.info.draft_devices),
        "tokens": tally.tokens,
        "drafted_tokens": tally.drafted,
        "draft_count": tally.checked,
        "draft_accepted_count": tally.kept,
    }
    lean = loaded.spec.lean
    if lean is not None:  # the draft models' share of the estimate (weights, KV, compute)
        n = loaded.n_parallel  # as loaded, in the KV cache type in use (``kv_cache_type``)
        full = loaded.spec.memory.with_sequences(n, kv_cache_type).total
        out["size"] = max(0, full - lean.memory.with_sequences(n, kv_cache_type).total)
    if tally.checked:
        out["acceptance"] = round(tally.kept / tally.checked, 3)
    if tally.last_drafter:
        out["in_use"] = tally.last_drafter
    return out
