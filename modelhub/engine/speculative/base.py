"""The interface every drafter implements.

The engine keeps one invariant: ``tokens`` is the accepted sequence and its last element is the
*pending* token (sampled but not yet decoded by the target). A drafter proposes continuations of
that sequence; the engine verifies them in one batched target decode and tells the drafter what
was kept, so the drafter can roll back whatever state it built past that point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from modelhub.engine.speculative.verify import draw


@dataclass
class Proposal:
    """Draft tokens for the positions after the pending token.

    ``probs`` holds the distribution each token was drawn from (shape ``(len(tokens), n_vocab)``)
    when the drafter sampled; ``None`` means the drafter is deterministic, so q is one-hot.
    ``confidence`` optionally estimates, per token, the probability that it is accepted given
    that the drafts before it were; the engine then verifies only the prefix that pays.
    """

    tokens: list[int]
    probs: npt.NDArray[np.float32] | None = None
    confidence: list[float] | None = None


class ProbabilityFn(Protocol):
    """Maps a logits row and the token history before it to the sampler's full distribution."""

    def __call__(
        self, logits: npt.NDArray[np.float32], history: Sequence[int]
    ) -> npt.NDArray[np.float32]: ...


class Drafter(Protocol):
    kind: str  # "draft_model" | "mtp" | "ngram" | "prediction"

    def begin(self, tokens: Sequence[int]) -> None:
        """A request starts with prompt ``tokens`` (state may be reused from earlier requests)."""

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        """Up to ``max_tokens`` guesses for what follows ``tokens`` (an empty list is allowed).

        With ``probs`` the drafter samples through the same transforms as the target and returns
        the q vectors; without it, it drafts greedily/deterministically.
        """

    def commit(self, tokens: Sequence[int]) -> None:
        """Verification kept ``tokens`` (pending token last); drop any state beyond them."""


def pick_draft(
    row: npt.NDArray[np.float32],
    history: Sequence[int],
    probs: ProbabilityFn | None,
    p_min: float,
    rng: np.random.Generator,
) -> tuple[int, npt.NDArray[np.float32] | None] | None:
    """One draft token from a drafting model's logits row, and the q it was drawn from.

    Greedy (``probs`` None): the argmax, q one-hot (None). Sampled: a draw from q, the target's
    own transforms applied to the row. None when the drafter's top probability is under
    ``p_min``: the draft should stop there.
    """
    if probs is None:
        if p_min > 0.0 and _top_probability(row) < p_min:
            return None
        return int(np.argmax(row)), None
    q = probs(row, history)
    if p_min > 0.0 and float(q.max()) < p_min:
        return None
    return draw(q, rng), q


def _top_probability(row: npt.NDArray[np.float32]) -> float:
    shifted = row.astype(np.float64) - float(np.max(row))
    return float(1.0 / np.exp(shifted).sum())
