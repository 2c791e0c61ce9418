"""Drafting from a caller-supplied prediction of the output (OpenAI "Predicted Outputs").

The drafter keeps an alignment point: the position in the predicted tokens that the output
has reached. While the output follows the prediction, it proposes the next predicted tokens.
When the output departs from it (the model inserts, deletes or replaces something), it looks for
where the output's recent suffix occurs in the prediction at or after the last confirmed
alignment point and resumes there, so an edit in the middle of a long prediction costs a few
tokens, not the rest of the prediction. While the output is somewhere the prediction does not
cover (a preamble, an inserted passage), an optional ``fallback`` drafter (the model's n-gram
drafter) drafts instead, from the prompt and what came before.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from modelhub.engine.speculative.base import Drafter, ProbabilityFn, Proposal
from modelhub.engine.speculative.confidence import AcceptanceByClass

# Starting acceptance estimates: right after a confirmed alignment the output usually goes on
# copying the prediction; after a one-token or guessed re-alignment it is a coin toss.
_PRIORS = {"confirmed": 0.8, "tentative": 0.4}


class PredictionDrafter:
    """Proposes the predicted tokens that follow the current alignment point.

    Re-alignment looks at or after the last confirmed point and prefers the longest suffix match
    (up to ``max_suffix`` tokens), then the nearest. A match of fewer than ``min_far_match``
    tokens is only trusted within ``near_window`` tokens of that point. If nothing qualifies,
    the whole prediction is searched, n-gram style, for a match of at least ``min_far_match``
    tokens (the output may repeat an earlier part). A one-token match is tentative: the
    confirmed point moves only when the next output token agrees with the prediction too.
    """

    kind = "prediction"

    def __init__(
        self,
        predicted_tokens: Sequence[int],
        *,
        max_suffix: int = 16,
        near_window: int = 256,
        min_far_match: int = 3,
        max_candidates: int = 4096,
        fallback: Drafter | None = None,
    ) -> None:
        self.predicted = list(predicted_tokens)
        self.fallback = fallback
        self.max_suffix = max_suffix
        self.near_window = near_window
        self.min_far_match = min_far_match
        self.max_candidates = max_candidates
        self._positions: dict[int, list[int]] = {}
        for i, token in enumerate(self.predicted):
            self._positions.setdefault(token, []).append(i)
        self.realignments = 0  # how often the output left a confirmed alignment (statistics)
        self.acceptance = AcceptanceByClass(_PRIORS)
        self.begin([])

    def begin(self, tokens: Sequence[int]) -> None:
        self.acceptance.forget()
        if self.fallback is not None:
            self.fallback.begin(tokens)
        self._prompt_len = len(tokens)
        self._output: list[int] = []
        self._pos = 0  # next predicted token expected
        self._anchor = 0  # last confirmed alignment point
        self._aligned = True
        self._substitute_at: int | None = None  # where a one-token substitution would resume
        self._departed_at = 0  # output length when the output left the prediction

    def commit(self, tokens: Sequence[int]) -> None:
        self.acceptance.judge(tokens)
        if self.fallback is not None:
            self.fallback.commit(tokens)
        output_len = len(tokens) - self._prompt_len
        if output_len < len(self._output) or (
            self._output and tokens[self._prompt_len + len(self._output) - 1] != self._output[-1]
        ):
            # The output was rewound (not the usual append-only growth): start over on it.
            self.begin(tokens[: self._prompt_len])
        new_tokens = tokens[self._prompt_len + len(self._output) :]
        if not new_tokens:
            return
        for token in new_tokens:
            self._output.append(int(token))
            if (
                self._aligned
                and self._pos < len(self.predicted)
                and self.predicted[self._pos] == token
            ):
                self._pos += 1
                self._anchor = self._pos
            elif self._aligned:
                self._aligned = False
                self._departed_at = len(self._output)
                if self._pos == self._anchor:  # not merely a tentative guess proved wrong
                    self.realignments += 1
                    # A departure from a confirmed point may be a one-token substitution.
                    self._substitute_at = self._pos
                else:
                    self._substitute_at = None
        if not self._aligned:
            self._realign()

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        self.commit(tokens)
        if max_tokens <= 0:
            return Proposal([], None)
        if not self._aligned:
            if self.fallback is not None:
                return self.fallback.propose(tokens, max_tokens, probs)
            return Proposal([], None)
        # Past the prediction's end nothing is proposed: the reply usually ends there too.
        drafts = self.predicted[self._pos : self._pos + max_tokens]
        state = "confirmed" if self._pos == self._anchor else "tentative"
        classes = [state, *["confirmed"] * (len(drafts) - 1)][: len(drafts)]
        return Proposal(drafts, None, self.acceptance.expect(len(tokens), drafts, classes))

    @property
    def position(self) -> int | None:
        """Index in the prediction of the next expected token (None while lost)."""
        return self._pos if self._aligned else None

    def _realign(self) -> None:
        found = self._best_match(self._anchor, self.near_window) or self._best_match(0, 0)
        if found is None:
            if self._substitute_at is not None and len(self._output) == self._departed_at:
                # Only the departing token is unknown: guess it replaced one predicted token.
                self._pos = self._substitute_at + 1
                self._aligned = True
            return
        end, length = found
        self._pos = end + 1
        self._aligned = True
        if length >= 2:
            self._anchor = self._pos

    def _best_match(self, start: int, near_window: int) -> tuple[int, int] | None:
        """``(end, length)``: where the output's suffix best matches the prediction, ending at
        ``end >= start``. Longest wins, then nearest; a match shorter than ``min_far_match``
        counts only within ``near_window`` tokens of ``start``.
        """
        output, predicted = self._output, self.predicted
        positions = self._positions.get(output[-1], [])
        first = bisect.bisect_left(positions, start)
        near_limit = start + near_window
        best: tuple[int, int] | None = None
        for end in positions[first : first + self.max_candidates]:
            length = 1
            while (
                length < self.max_suffix
                and length < len(output)
                and end - length >= 0
                and output[-1 - length] == predicted[end - length]
            ):
                length += 1
            min_length = 1 if end < near_limit else self.min_far_match
            if length >= min_length and (best is None or length > best[1]):
                best = (end, length)
                if length == self.max_suffix:
                    break
        return best
