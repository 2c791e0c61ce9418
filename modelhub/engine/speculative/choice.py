"""Which drafter drafts a round, when a request has several (``DRAFT auto``).

A model may have more than one way to draft: its own MTP heads, a draft model, a drafter file
that came with it, and always the n-gram drafter. Each has its own :class:`AdaptiveDraftLength`
(acceptance and cost per guess, per kind of request and per batch load; the verify costs are the
target's and shared), and every round goes to the one expected to give the most tokens per
second, measured on this machine:

- a *rated* drafter (n-gram, a prediction) prices each of its guesses; its proposal is used when
  the prefix its controller keeps beats plain decoding (by the controller's margin) and the best
  model drafter's expected rate, as llama.cpp chains n-gram before a draft model, but decided by
  measured figures;
- among *model* drafters, one without enough evidence is tried first (``TRIAL_ROUNDS`` drafted
  rounds each), then the one with the best expected rate drafts, the runner-up every
  ``REVISIT_EVERY`` rounds so that its figures stay current; its controller picks the length,
  0 included (plain decoding, with its own probes).

Whatever drafts, verification keeps the output the target's own, so the choice changes speed only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.factory import Preparing

# Drafters whose proposals carry a per-token confidence (``Proposal.confidence``).
RATED_KINDS = frozenset({"ngram", "prediction"})
# A model drafter is tried for this many drafted rounds before its figures are compared.
TRIAL_ROUNDS = 8
# The runner-up model drafter drafts one round in this many, to keep its figures current.
REVISIT_EVERY = 64


@dataclass
class Member:
    """One of a request's drafters: the name a request or ``show`` uses, its bound on guesses,
    and what a guess is assumed to cost (in one-row target steps) until one is measured."""

    name: str
    drafter: Drafter
    max_k: int
    cost_prior: float | None = None
    # Read every round: worked out once (a runtime-checkable Protocol's isinstance costs tens
    # of microseconds, a share of a fast step).
    rated: bool = field(init=False)
    prepare: Callable[[Sequence[int]], bool] | None = field(init=False)

    def __post_init__(self) -> None:
        self.rated = self.drafter.kind in RATED_KINDS
        self.prepare = self.drafter.prepare if isinstance(self.drafter, Preparing) else None


Controllers = Callable[[Member], AdaptiveDraftLength]


class DraftChoice:
    """A request's drafters and the choice among them, round by round."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.rated = [m for m in members if m.rated]
        self.models = [m for m in members if not m.rated]
        self._rounds = 0

    def drop(self, member: Member) -> None:
        """``member`` cannot draft for this request any more (it could not follow a shift)."""
        self.members = [m for m in self.members if m is not member]
        self.rated = [m for m in self.rated if m is not member]
        self.models = [m for m in self.models if m is not member]

    def model(self, controller: Controllers) -> Member | None:
        """The model drafter for this round (None when the request has none)."""
        if len(self.models) <= 1:
            return self.models[0] if self.models else None
        self._rounds += 1
        trials = [m for m in self.models if controller(m).draft_rounds < TRIAL_ROUNDS]
        if trials:
            return min(trials, key=lambda m: controller(m).draft_rounds)
        ranked = sorted(self.models, key=lambda m: controller(m).best_rate() or 0.0, reverse=True)
        return ranked[1] if self._rounds % REVISIT_EVERY == 0 else ranked[0]


def load_bucket(decoding: int) -> int:
    """The batch load a round's figures belong to: 1, 2, up to 4, more (a 4-row decode costs
    2.4-2.9x a 1-row one on a 2-core CPU, so drafting pays less as the batch fills)."""
    if decoding <= 2:
        return max(1, decoding)
    return 4 if decoding <= 4 else 8
