"""The drafters a stored model has: what ``DRAFT auto`` chooses among, and what a request's
``draft`` option may name.

- ``auto`` (a Modelfile without ``DRAFT``, or ``DRAFT auto``): the model's drafter layer when it
  came with one (a sidecar a pull attached: a draft model, an MTP-heads file, a Gemma 4
  assistant, EAGLE-3, DFlash), the target's own MTP heads, one draft model from the local store
  (suggested by the catalog for this model, or at most 1/8 of the target's size) whose
  tokenizer passes the same pairing checks as ``create``, and n-gram (the runner adds it). The
  runner then chooses per round by measurement (``engine.speculative.choice``).
- a fixed ``DRAFT`` line: that drafter, and n-gram for requests that ask for it.
- ``DRAFT none`` (or ``MODELHUB_DRAFT=off`` for models without a ``DRAFT`` line): no drafting
  unless a request names n-gram.
Nothing is downloaded here: only what is already in the store counts.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from modelhub.errors import DraftError, ModelhubError
from modelhub.gguf.info import GGUFInfo, read_gguf_info
from modelhub.gguf.pairing import check_draft_pairing, check_mtp_target
from modelhub.library.views import (
    DRAFT_AUTO,
    DRAFT_DFLASH,
    DRAFT_EAGLE3,
    DRAFT_MODEL,
    DRAFT_MTP,
    DRAFT_MTP_DRAFTER,
    DRAFT_NGRAM,
    DRAFT_NONE,
    ModelView,
    ModelViews,
)
from modelhub.store import parse_name

log = logging.getLogger(__name__)

Mode = Literal["auto", "fixed", "none"]
# Config draft kinds -> the engine's drafter kinds.
ENGINE_KIND = {
    DRAFT_MODEL: "draft_model",
    DRAFT_MTP: "mtp",
    DRAFT_MTP_DRAFTER: "mtp",
    DRAFT_NGRAM: "ngram",
    DRAFT_EAGLE3: "eagle3",
    DRAFT_DFLASH: "dflash",
}
# A store model drafts for a target at most this fraction of its size (unless suggested).
STORE_DRAFT_RATIO = 1 / 8


@dataclass(frozen=True)
class DrafterOption:
    """One drafter of a model. ``name`` is what ``options.draft`` and ``show`` call it,
    ``kind`` the config's draft kind, ``origin`` where it comes from (shown to users)."""

    name: str
    kind: str
    path: Path | None
    info: GGUFInfo | None
    origin: str

    @property
    def engine_kind(self) -> str:
        return ENGINE_KIND[self.kind]


def draft_mode(view: ModelView, default: str) -> Mode:
    """How ``view`` drafts: its ``DRAFT`` line, else the daemon's default (``auto``/``off``)."""
    kind = str((view.draft or {}).get("kind") or "")
    if kind == DRAFT_NONE:
        return "none"
    if kind == DRAFT_AUTO or (view.draft or {}).get("sidecar"):
        return "auto"
    if kind in ENGINE_KIND:
        return "fixed"
    return "none" if default == "off" else "auto"


def fixed_drafter(view: ModelView) -> DrafterOption | None:
    """The drafter a ``DRAFT`` line names (None for auto and none)."""
    kind = str((view.draft or {}).get("kind") or "")
    if kind not in ENGINE_KIND:
        return None
    path = view.draft_path if kind != DRAFT_NGRAM and kind != DRAFT_MTP else None
    return DrafterOption(kind, kind, path, view.draft_info, "the Modelfile's DRAFT line")


def auto_drafters(view: ModelView, views: ModelViews, suggested: list[str]) -> list[DrafterOption]:
    """The candidates of ``DRAFT auto`` besides n-gram, the ones that came with the model
    first. ``suggested`` are the catalog's draft suggestions for this model (names)."""
    found: list[DrafterOption] = []
    draft = view.draft or {}
    kind = str(draft.get("kind") or "")
    if view.draft_path is not None and kind in ENGINE_KIND and kind != DRAFT_NGRAM:
        found.append(DrafterOption(kind, kind, view.draft_path, view.draft_info, "pulled with it"))
    info = view.info
    if info is not None and info.has_mtp_heads:
        try:
            check_mtp_target(info)
            found.append(DrafterOption(DRAFT_MTP, DRAFT_MTP, None, None, "the model's MTP heads"))
        except DraftError as exc:
            log.info("%s: its MTP heads cannot draft: %s", view.name.display, exc.message)
    store_draft = _store_draft(view, views, suggested)
    if store_draft is not None:
        found.append(store_draft)
    return found


def _display(name: str) -> str:
    """A suggested name as the store shows it (``smollm2`` -> ``smollm2:latest``)."""
    try:
        return parse_name(name).display.lower()
    except ModelhubError:
        return name.lower()


# (target digest, draft digest) -> the pair passed the tokenizer checks
_pairing: dict[tuple[str, str], bool] = {}
_pairing_lock = threading.Lock()


def _store_draft(view: ModelView, views: ModelViews, suggested: list[str]) -> DrafterOption | None:
    """The largest stored model that can draft for ``view``: same tokenizer, and suggested by
    the catalog or at most ``STORE_DRAFT_RATIO`` of the target's size."""
    target, layer = view.info, view.model_layer
    if target is None or layer is None or view.model_path is None:
        return None
    wanted = {_display(s) for s in suggested}
    best: tuple[int, DrafterOption] | None = None
    for stored in views.store.list_models():
        try:
            other = views.view(stored)
        except Exception as exc:  # a damaged model is listed elsewhere; it cannot draft
            log.debug("%s: skipped as a draft (%s)", stored.name.display, exc)
            continue
        draft_layer, info = other.model_layer, other.info
        if draft_layer is None or info is None or other.model_path is None:
            continue
        if draft_layer.digest == layer.digest or info.is_mtp_drafter:
            continue
        if info.architecture in ("eagle3", "dflash"):
            continue
        name = other.name.display
        small = draft_layer.size <= layer.size * STORE_DRAFT_RATIO
        if not small and name.lower() not in wanted:
            continue
        if not _pairs(view, other):
            continue
        option = DrafterOption(name, DRAFT_MODEL, other.model_path, info, f"the store ({name})")
        if best is None or draft_layer.size > best[0]:
            best = (draft_layer.size, option)
    return best[1] if best else None


def _pairs(target: ModelView, draft: ModelView) -> bool:
    """The tokenizer pairing checks of ``create`` (cached per pair of blobs)."""
    assert target.model_layer is not None and draft.model_layer is not None
    key = (target.model_layer.digest, draft.model_layer.digest)
    with _pairing_lock:
        known = _pairing.get(key)
    if known is not None:
        return known
    assert target.model_path is not None and draft.model_path is not None
    try:
        check_draft_pairing(
            read_gguf_info(target.model_path, with_tokens=True),
            read_gguf_info(draft.model_path, with_tokens=True),
            target.model_path,
            draft.model_path,
        )
        ok = True
    except DraftError:
        ok = False
    except Exception as exc:  # an unreadable header: not a draft
        log.debug("pairing %s with %s: %s", target.name.display, draft.name.display, exc)
        ok = False
    with _pairing_lock:
        _pairing[key] = ok
    return ok
