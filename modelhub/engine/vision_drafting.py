"""Drafters that read the target's states, with images (and audio clips) in the context.

Each follows every target decode (``observe_target``), and an image's positions are decoded by
the target from embeddings (``vision.decode_embeddings``), one decode per ``n_batch`` rows (one
for a non-causal image): after each, the drafters follow those rows like any others, with the
image's placeholder token as the token of each row (:func:`image_rows_observer`). What they read
of the target at those rows is computed from the image:

- MTP (NextN) heads, and Gemma 4 assistants (the same class): llama.cpp's NextN output has a
  hidden state for every row of a batch, embeddings or tokens. The row at position p of a head's
  cache holds the token at p and the target's hidden state at p - 1, so the rows right after an
  image pair the first text token with the hidden state of the image's last position, as the
  target sees it. An assistant reads the target's KV cache, which holds the image's rows.
- EAGLE-3 heads and DFlash block drafters read the inputs of chosen target layers, which
  llama.cpp copies out for every row of a batch, embedding rows too (layer 0's input at an
  image's rows is the image's embeddings: tests/test_engine_vision_layered.py checks it). EAGLE-3
  fuses them into g and pairs g_p with the token at p + 1 (a placeholder inside the image);
  DFlash puts them in its cache at the image's positions.

Drafts are verified by the target as always, so greedy output is the same as without drafting.

The prompt cache must never make the target replay from inside an image: when an observer asks
the target to decode again from an earlier position (it lacks the target's state before the
reuse point, which is the end of an image when the new prompt differs right after one), that
position is moved back to the start of the image it falls in (:func:`settle_reuse`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from modelhub.engine.vision import ImageSpan, reusable


def follows_images(observers: Sequence[object]) -> bool:
    """Whether every drafter that follows the target's decodes can follow image rows (the
    kinds above; another observer is refused with ``vision.IMAGES_WITH_OBSERVERS``)."""
    from modelhub.engine.speculative.layered import LayeredDrafter
    from modelhub.engine.speculative.mtp import MtpDrafter

    return all(isinstance(o, MtpDrafter | LayeredDrafter) for o in observers)


def image_rows_observer(
    observers: Sequence[Any], prompt: Sequence[int], span: ImageSpan
) -> Callable[[int, int], None] | None:
    """What ``decode_embeddings`` calls after each decode of ``span``'s rows (``off``, ``n``:
    the rows of that decode, from the image's start): the observers follow them, the image's
    placeholder tokens as the rows' tokens. None when nothing observes."""
    if not observers:
        return None

    def after(off: int, n: int) -> None:
        start = span.start + off
        for observer in observers:
            observer.observe_target(prompt[start : start + n], start, 0)

    return after


def settle_reuse(
    rollback: Any, slot: Any, cached_images: list[ImageSpan], wanted: list[ImageSpan], reuse: int
) -> int:
    """The prompt-cache reuse point, after the observers had their say, moved back to the start
    of the image it falls in (``rollback`` is the engine's ``Rollback``: it cuts the target's
    cache). The observers then follow from that start; when they need the target's state
    before it, the target decodes again from the position before the image (or from the start
    of the image before that one, when two images touch)."""
    snapped = reusable(cached_images, wanted, reuse)
    if snapped == reuse:
        return reuse
    reuse = rollback.reuse(slot.seq, slot.cached, slot.recurrent, snapped)
    need = min([reuse, *(observer.rollback(reuse) for observer in slot.observers())])
    if need < reuse:  # never called again: the rows from ``need`` bring what they lack
        reuse = rollback.reuse(
            slot.seq, slot.cached, slot.recurrent, reusable(cached_images, wanted, need)
        )
    return reuse
