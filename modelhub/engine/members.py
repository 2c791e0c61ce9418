"""A model's drafters in its sequences, and the drafters of one request.

Each sequence (slot) has instances of the engine's drafters (``Engine.sources``, the defaults
first): sequence 0 loads them, the others fork them (n-grams share the model's pool, a draft
model its weights, MTP its heads). A request uses the defaults, the one its ``draft`` option
names, or a prediction with the n-gram drafter behind it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modelhub.engine.options import DRAFT_AUTO, DRAFT_OFF, GenerateOptions
from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.choice import Member
from modelhub.engine.speculative.factory import (
    install_ngram_pool,
    make_drafter,
    ngram_drafter,
    prediction_drafter,
)
from modelhub.errors import DraftError, InputError

if TYPE_CHECKING:
    from modelhub.engine.generate import Engine
    from modelhub.engine.sequence import Slot


def load_drafters(engine: Engine, given: Drafter | None) -> list[Member]:
    """Sequence 0's drafters: the caller's, or one per source (the default first)."""
    if given is not None:
        return [Member(given.kind, given, engine.cfg.draft_num_predict)]
    saved = engine.learning.memory.load_ngram_pool(engine.cfg.ngram_persist)
    if saved is not None:
        install_ngram_pool(engine.model.path, saved)
    members = []
    for src in engine.sources:
        drafter = make_drafter(
            engine.cfg,
            engine.model,
            engine.ctx,
            engine.n_threads,
            engine.offload.draft(engine.repack),
            src,
        )
        if drafter is not None:
            members.append(Member(src.name, drafter, src.max_k))
    return members


def fork_drafters(engine: Engine) -> list[Member]:
    """Another sequence's instances of the model's drafters: n-grams share the model's
    pool, a draft model its weights, MTP its heads (each sequence has a draft context of
    its own)."""
    members = []
    for member in engine.slots[0].members:
        fork = getattr(member.drafter, "fork", None)  # draft model, MTP, EAGLE-3, DFlash
        if callable(fork):
            members.append(Member(member.name, fork(), member.max_k))
        elif member.drafter.kind == "ngram":
            members.append(Member(member.name, ngram_drafter(engine.model.path), member.max_k))
        else:
            raise DraftError(f"{member.drafter.kind} drafting serves one sequence at a time")
    return members


def request_drafters(
    engine: Engine, slot: Slot, options: GenerateOptions, prediction: list[int] | None
) -> tuple[list[Member], int]:
    """The drafters and the K bound of a request in ``slot`` (none: plain decoding)."""
    k_max = engine.cfg.draft_num_predict if engine.cfg.draft_kind != "auto" else 0
    k_max = max([k_max, *(m.max_k for m in slot.members)])
    if options.draft_num_predict is not None:
        k_max = options.draft_num_predict
    k_max = min(k_max, engine.ctx.n_batch - 1)
    if k_max <= 0 or options.draft == DRAFT_OFF:
        return [], 0
    if prediction:
        drafter = prediction_drafter(prediction, slot_ngram(engine, slot))
        return [Member("prediction", drafter, k_max)], k_max
    if options.draft in (None, DRAFT_AUTO):
        chosen = [m for m in slot.members if m.name in engine.default_drafters]
    else:
        chosen = [m for m in slot.members if m.name == options.draft]
        if not chosen:
            names = ", ".join(m.name for m in slot.members) or "none"
            raise InputError(
                f"draft {options.draft!r} is not one of this model's drafters ({names}); "
                "use auto, off or one of those"
            )
    return [Member(m.name, m.drafter, min(m.max_k, k_max)) for m in chosen], k_max


def slot_ngram(engine: Engine, slot: Slot) -> Drafter:
    """The slot's n-gram drafter: one of its drafters, or one made for prediction requests
    (kept, with what it learned, for the next)."""
    for member in slot.members:
        if member.drafter.kind == "ngram":
            return member.drafter
    if slot.ngram is None:
        slot.ngram = ngram_drafter(engine.model.path)
    return slot.ngram
