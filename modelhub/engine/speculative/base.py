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
