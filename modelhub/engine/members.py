"""A model's drafters in its sequences, and the drafters of one request.

Each sequence (slot) has instances of the engine's drafters (``Engine.sources``, the defaults
first): sequence 0 loads them, the others fork them (n-grams share the model's pool, a draft
model its weights, MTP its heads). A request uses the defaults, the one its ``draft`` option
names, or a prediction with the n-gram drafter behind it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from modelhub.engine.context import LlamaContext
from modelhub.engine.host import EngineHost
from modelhub.engine.llama import LlamaModel, LoadPlacement
from modelhub.engine.options import (
    DRAFT_AUTO,
    DRAFT_OFF,
    DraftSource,
    EngineConfig,
    GenerateOptions,
)
from modelhub.engine.slot import Slot
from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.choice import Member
from modelhub.engine.speculative.factory import (
    make_drafter,
    ngram_drafter,
    prediction_drafter,
)
from modelhub.errors import DraftError, InputError


def load_drafters(
    cfg: EngineConfig,
    target: tuple[LlamaModel, LlamaContext, int],
    placement: LoadPlacement,
    sources: list[DraftSource],
    given: Drafter | None,
) -> list[Member]:
    """Sequence 0's drafters: the caller's, or one per source (the default first), drafting
    for ``target`` (its model, context and threads); ``placement`` is where draft files go."""
    if given is not None:
        return [Member(given.kind, given, cfg.draft_num_predict)]
    model, ctx, n_threads = target
    members = []
    for src in sources:
        drafter = make_drafter(cfg, model, ctx, n_threads, placement, src)
        if drafter is not None:
            prior = size_prior(model.path, src) if cfg.draft_kind == DRAFT_AUTO else None
            members.append(Member(src.name, drafter, src.max_k, prior))
    return members


def size_prior(target: Path, src: DraftSource) -> float | None:
    """What ``DRAFT auto`` assumes a draft model's guess costs before it has measured one, in
    one-row target steps: its file's size against the target's (decoding reads every weight
    once). A candidate as big as the target is then never probed, which would cost a catch-up
    on the whole prompt for nothing. A draft the Modelfile or the request names is always
    tried (no prior)."""
    if src.kind != "draft_model" or src.path is None:
        return None
    try:
        return Path(src.path).stat().st_size / max(1, target.stat().st_size)
    except OSError:
        return None


def fork_drafters(model: LlamaModel, first: list[Member]) -> list[Member]:
    """Another sequence's instances of the drafters of sequence 0 (``first``): n-grams share
    the model's pool, a draft model its weights, MTP its heads (each sequence has a draft
    context of its own)."""
    members = []
    for member in first:
        fork = getattr(member.drafter, "fork", None)  # draft model, MTP, EAGLE-3, DFlash
        if callable(fork):
            members.append(replace(member, drafter=fork()))
        elif member.drafter.kind == "ngram":
            members.append(replace(member, drafter=ngram_drafter(model.path)))
        else:
            raise DraftError(f"{member.drafter.kind} drafting serves one sequence at a time")
    return members


def request_drafters(
    engine: EngineHost, slot: Slot, options: GenerateOptions, prediction: list[int] | None
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
    else:  # a drafter the request names is tried whatever its size says (no prior)
        chosen = [replace(m, cost_prior=None) for m in slot.members if m.name == options.draft]
        if not chosen:
            names = ", ".join(m.name for m in slot.members) or "none"
            raise InputError(
                f"draft {options.draft!r} is not one of this model's drafters ({names}); "
                "use auto, off or one of those"
            )
    return [replace(m, max_k=min(m.max_k, k_max)) for m in chosen], k_max


def slot_ngram(engine: EngineHost, slot: Slot) -> Drafter:
    """The slot's n-gram drafter: one of its drafters, or one made for prediction requests
    (kept, with what it learned, for the next)."""
    for member in slot.members:
        if member.drafter.kind == "ngram":
            return member.drafter
    if slot.ngram is None:
        slot.ngram = ngram_drafter(engine.model.path)
    return slot.ngram


def unsupported_drafter(cfg: EngineConfig) -> str | None:
    """Why the configured drafter cannot be driven (None: it can): external MTP drafter
    files other than MTP-only GGUFs and Gemma 4 assistants have no driver here, and the
    model is served without drafting."""
    if cfg.draft_kind != "mtp" or cfg.draft_path is None:
        return None
    from modelhub.gguf.info import read_gguf_info

    info = read_gguf_info(Path(cfg.draft_path))
    if info.is_mtp_only or info.architecture == "gemma4-assistant":
        return None
    return (
        f"external MTP drafter files other than MTP-only GGUFs and Gemma 4 assistants "
        f"({Path(cfg.draft_path).name}) are not supported by this engine yet"
    )
