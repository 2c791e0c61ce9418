"""Drafters that read the target's hidden states, with images in the context.

MTP (NextN) heads (and Gemma 4 assistants, the same class: untested with images, no fixture)
follow every target decode (``observe_target``): the row at position p of their cache holds the
token at p and the target's hidden state at p - 1.
An image's positions are decoded by the target from embeddings (``vision.decode_embeddings``),
and llama.cpp's NextN output has a hidden state for every row of a batch, embeddings or tokens:
so the heads follow an image's rows like any others, with the image's placeholder token as the
token half of each row (the heads' input is a token id; the hidden states carry the image). The
rows right after an image then pair the first text token with the hidden state of the image's
last position, as the target sees it.

The prompt cache must never make the target replay from inside an image: when an observer asks
the target to decode again from an earlier position (it lacks the hidden state before the reuse
point, which is the end of an image when the new prompt differs right after one), that position
is moved back to the start of the image it falls in (:func:`settle_reuse`).

EAGLE-3 and DFlash read other states of the target (chosen layers' outputs, captured per row)
and are not proven with images: a request with images is refused for them
(``vision.IMAGES_WITH_OBSERVERS``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from modelhub.engine.vision import ImageSpan, reusable


def follows_images(observers: Sequence[object]) -> bool:
    """Whether every drafter that follows the target's decodes can follow image rows."""
    from modelhub.engine.speculative.mtp import MtpDrafter

    return all(isinstance(o, MtpDrafter) for o in observers)


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
