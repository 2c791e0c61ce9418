"""Context shift: how a generation goes on once its sequence fills the context.

As llama.cpp's server and Ollama do: keep the first ``num_keep`` tokens (plus BOS), drop half of
the rest from the slot's KV sequence and move the later positions down (llama.cpp re-applies
RoPE to their keys at the next decode; a quantised K cache, Q8_0 by default, is dequantised,
rotated and quantised again). The accepted sequence and the slot's cache lose the same tokens,
so they stay what the KV sequence holds and the next request's prefix reuse stays exact.

Drafters follow: a draft model shifts its own cache alike (``factory.Shifting``); n-gram and
prediction drafters resynchronise on the shifted sequence; MTP heads, whose cache rows pair each
position with the target's hidden state of the one before, are cut back to the kept prefix and
that request drafts no more with them (the output is the target's either way).
"""

from __future__ import annotations

import logging

from modelhub.engine.context import LlamaContext
from modelhub.engine.llama import LlamaModel
from modelhub.engine.slot import Slot
from modelhub.engine.speculative.choice import Member
from modelhub.engine.speculative.factory import Shifting, TargetObserver

log = logging.getLogger("modelhub.engine")


def keep_count(num_keep: int, prompt: list[int], model: LlamaModel, n_ctx: int) -> int:
    """Tokens a shift keeps: ``num_keep`` after a BOS (negative: the whole prompt), as
    llama.cpp's server counts them, leaving at least 4 positions to discard from."""
    n = len(prompt) if num_keep < 0 else num_keep
    if num_keep >= 0 and model.add_bos and prompt[:1] == [model.bos]:
        n += 1
    return max(0, min(n, n_ctx - 4))


def shift_sequence(ctx: LlamaContext, slot: Slot, tokens: list[int], keep: int) -> int:
    """Shift the slot's full sequence in ``ctx`` (``tokens``: what it holds plus the pending
    token), editing ``tokens`` and ``slot.cached``; returns how many tokens were discarded (0:
    none, the memory cannot shift: recurrent state, M-RoPE)."""
    if ctx.model.is_recurrent or ctx.model.is_hybrid:
        return 0
    discard = (len(tokens) - 1 - keep) // 2
    if discard < 1 or not ctx.shift(keep, discard, slot.seq):
        return 0
    del tokens[keep : keep + discard]
    del slot.cached[keep : keep + discard]
    log.debug("context shift in sequence %d: kept %d, discarded %d", slot.seq, keep, discard)
    return discard


def follow_shift(
    slot: Slot, members: list[Member], tokens: list[int], keep: int, discard: int
) -> list[Member]:
    """Bring the slot's and the request's drafters in line with the shifted ``tokens``;
    returns the request's drafters that cannot follow (MTP heads): it drafts no more with
    them."""
    for observer in slot.observers():
        observer.rollback(keep)  # its rows before ``keep`` are still exact
    lost = []
    for member in members:
        drafter = member.drafter
        if isinstance(drafter, TargetObserver):
            lost.append(member)
        elif isinstance(drafter, Shifting):
            drafter.shift(keep, discard)
        else:
            drafter.begin(tokens)  # n-grams and predictions resynchronise on the new sequence
    return lost
