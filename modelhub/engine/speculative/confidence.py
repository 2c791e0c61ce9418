"""Per-token acceptance estimates for drafters that have no probabilities of their own.

A deterministic drafter (n-gram, prediction) knows why it proposed each token: the n-gram order
that matched, say. That reason is the token's *evidence class*. :class:`AcceptanceByClass`
learns, per class, how often such a token was what the target emitted, given that every draft
before it was; the engine turns the estimates of a proposal into the number of drafts worth
verifying (``AdaptiveDraftLength.cut``).

Outcomes are read off the committed sequence. The token the target emits at a drafted position
equals the draft exactly when the draft is accepted (greedy: the target's argmax; sampled with a
one-hot q: both happen with probability p(draft)), so the position just past the verified drafts,
where the target emits its own token, is evidence too: a class that is never worth verifying
keeps being measured.

A class's rate is learned across requests, but a request can differ from the ones before it (a
text whose repeats are coincidences after one that copied a document). So each request also
calibrates: the estimates its proposals carry are the classes' rates scaled by how its own
judged guesses fared against them, ``(hits + W) / (expected hits + W)`` up to 1; a miss or two
at a confident class then stops a request's hopeless guesses at once, instead of after the
history other requests left has faded, and hits bring them back (never above the classes'
rates: a lucky start would otherwise make long guesses look certain).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)  # an evidence class

# Estimates stay inside these bounds: no evidence makes a token certain or hopeless.
_FLOOR, _CEILING = 0.02, 0.995
# A request's calibration starts as if its first guesses had come out as the classes predict,
# worth this many expected hits (W above).
_CALIBRATION_WEIGHT = 2.0


class AcceptanceByClass(Generic[C]):
    """Decayed hit rates per evidence class, starting from a prior worth ``prior_weight`` trials.

    ``decay`` forgets old outcomes of a class (0.97: the last ~30 outcomes weigh most), so the
    estimates follow a change of text (copying a document, then writing freely).
    """

    def __init__(
        self,
        priors: Mapping[C, float],
        *,
        default_prior: float = 0.3,
        prior_weight: float = 2.0,
        decay: float = 0.97,
    ) -> None:
        self._priors = dict(priors)
        self._default = default_prior
        self._weight = prior_weight
        self._decay = decay
        self._stats: dict[C, list[float]] = {}  # class -> [hits, trials]
        self._pending: tuple[int, list[int], list[C]] | None = None
        self._request = [0.0, 0.0]  # this request's judged guesses: [hits, expected hits]

    def estimate(self, cls: C) -> float:
        """The class's rate, learned across requests."""
        hits, trials = self._stats.get(cls) or self._prior(cls)
        return min(_CEILING, max(_FLOOR, hits / trials))

    def calibration(self) -> float:
        """How this request's guesses fared against their classes' rates (1: as predicted or
        better)."""
        hits, expected = self._request
        return min(1.0, (hits + _CALIBRATION_WEIGHT) / (expected + _CALIBRATION_WEIGHT))

    def for_request(self, cls: C, calibration: float | None = None) -> float:
        """The class's rate scaled by this request's calibration (or by ``calibration``)."""
        scale = self.calibration() if calibration is None else calibration
        return min(_CEILING, max(_FLOOR, self.estimate(cls) * scale))

    def record(self, cls: C, hit: bool) -> None:
        stats = self._stats.setdefault(cls, self._prior(cls))
        stats[0] = stats[0] * self._decay + (1.0 if hit else 0.0)
        stats[1] = stats[1] * self._decay + 1.0

    def _prior(self, cls: C) -> list[float]:
        p = self._priors.get(cls, self._default)
        return [p * self._weight, self._weight]

    def expect(self, start: int, drafts: Sequence[int], classes: Sequence[C]) -> list[float]:
        """A proposal for the positions from ``start`` on, judged by the next :meth:`judge`;
        returns its drafts' estimates for this request (:meth:`for_request`)."""
        self._pending = (start, list(drafts), list(classes))
        scale = self.calibration()  # once per proposal: it changes only when judged
        return [self.for_request(c, scale) for c in classes]

    def forget(self) -> None:
        """A new request begins: drop an unjudged proposal and the calibration."""
        self._pending = None
        self._request = [0.0, 0.0]

    def judge(self, tokens: Sequence[int]) -> None:
        """``tokens`` is the committed sequence: score the pending proposal's known positions."""
        if self._pending is None:
            return
        start, drafts, classes = self._pending
        self._pending = None
        for i, (draft, cls) in enumerate(zip(drafts, classes, strict=True)):
            if start + i >= len(tokens):
                return  # generation stopped before this position: no evidence
            hit = tokens[start + i] == draft
            self._request[0] += hit
            self._request[1] += self.estimate(cls)  # before this outcome is learned
            self.record(cls, hit)
            if not hit:
                return
