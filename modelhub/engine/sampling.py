"""Ollama sampling options turned into probability vectors.

One function, :meth:`Sampler.candidates`, maps a logits row and the token history before it to the
exact distribution a token is drawn from. The target's p and a draft model's q both come from it,
penalties included, which is what makes rejection sampling lossless (SPEC-03).

The transforms follow llama.cpp's default chain (the one Ollama's runner uses), in its order:
penalties, top-k, typical-p, top-p, min-p, temperature. Truncation happens at temperature 1;
temperature only reshapes the survivors. Temperature <= 0 is greedy: the argmax of the penalised
logits.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from modelhub.engine.speculative.base import ProbabilityFn
from modelhub.errors import InputError

FloatArray = npt.NDArray[np.float32]
# Under a grammar, greedy decoding asks this many of the best tokens before masking all.
_GREEDY_PROBES = 64
IdArray = npt.NDArray[np.int64]


class TokenConstraint(Protocol):
    """A stateful filter on the next token (a grammar). See :mod:`modelhub.engine.grammar`."""

    def allows(self, token: int) -> bool: ...

    def mask(self, logits: FloatArray) -> None:
        """Set the logits of every forbidden token to -inf, in place."""

    def accept(self, token: int) -> None: ...

    def clone(self) -> TokenConstraint:
        """An independent copy in the same state."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class SamplingParams:
    """The sampling subset of Ollama's options, with Ollama's defaults."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    def validate(self) -> None:
        """Raise :class:`BadRequest` naming the first option that cannot work."""
        checks: list[tuple[str, float, bool, str]] = [
            ("temperature", self.temperature, math.isfinite(self.temperature), "a number"),
            ("top_p", self.top_p, 0.0 <= self.top_p <= 1.0, "between 0 and 1"),
            ("min_p", self.min_p, 0.0 <= self.min_p <= 1.0, "between 0 and 1"),
            ("typical_p", self.typical_p, 0.0 < self.typical_p <= 1.0, "in (0, 1]"),
            ("repeat_penalty", self.repeat_penalty, self.repeat_penalty > 0.0, "positive"),
            ("repeat_last_n", self.repeat_last_n, self.repeat_last_n >= -1, "-1, 0 or positive"),
            (
                "presence_penalty",
                self.presence_penalty,
                math.isfinite(self.presence_penalty),
                "a number",
            ),
            (
                "frequency_penalty",
                self.frequency_penalty,
                math.isfinite(self.frequency_penalty),
                "a number",
            ),
        ]
        for name, value, ok, expected in checks:
            if not ok:
                raise InputError(f"option {name}={value!r} is invalid: it must be {expected}")


@dataclass
class Candidates:
    """A sparse distribution: token ids (best first) and their probabilities (summing to 1)."""

    ids: IdArray
    probs: npt.NDArray[np.float64]

    def dense(self, n_vocab: int) -> FloatArray:
        out = np.zeros(n_vocab, dtype=np.float32)
        out[self.ids] = self.probs
        return out

    def draw(self, rng: np.random.Generator) -> int:
        cumulative = np.cumsum(self.probs)
        index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return int(self.ids[min(index, len(self.ids) - 1)])


def softmax(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float64]:
    shifted = logits.astype(np.float64) - np.max(logits)
    weights = np.exp(shifted)
    result: npt.NDArray[np.float64] = weights / weights.sum()
    return result


class Sampler:
    """Sampling for one request: the options, the history window, an optional grammar, a RNG."""

    def __init__(
        self,
        params: SamplingParams,
        n_vocab: int,
        *,
        n_ctx: int = 4096,
        seed: int | None = None,
        constraint: TokenConstraint | None = None,
    ) -> None:
        params.validate()
        self.params = params
        self.n_vocab = n_vocab
        self.constraint = constraint
        self.seed = seed if seed is not None and seed >= 0 else None
        self.rng = np.random.default_rng(self.seed)
        self.coupled = False  # draw by Gumbel-max with noise fixed by (seed, token index)
        self.emitted = 0  # tokens accepted so far: the index of the next one
        last_n = params.repeat_last_n
        self._window = n_ctx if last_n == -1 else last_n

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def with_constraint(self, constraint: TokenConstraint | None) -> Sampler:
        """This sampler (same options, same random stream) under another constraint state."""
        twin = copy.copy(self)
        twin.constraint = constraint
        return twin

    def penalised(self, logits: FloatArray, history: Sequence[int]) -> FloatArray:
        """The logits after repeat/presence/frequency penalties (a copy when anything changes)."""
        p = self.params
        if not p.has_penalties or self._window <= 0 or not history:
            return logits
        window = np.asarray(history[-self._window :], dtype=np.int64)
        ids, counts = np.unique(window, return_counts=True)
        ids_ok = ids[(ids >= 0) & (ids < len(logits))]
        counts = counts[(ids >= 0) & (ids < len(logits))]
        out = logits.copy()
        selected = out[ids_ok]
        if p.repeat_penalty != 1.0:
            selected = np.where(
                selected <= 0, selected * p.repeat_penalty, selected / p.repeat_penalty
            )
        selected = selected - (counts * p.frequency_penalty + p.presence_penalty)
        out[ids_ok] = selected.astype(np.float32)
        return out

    def _constrained(self, logits: FloatArray) -> FloatArray:
        if self.constraint is None:
            return logits
        masked = logits.copy()
        self.constraint.mask(masked)
        if not np.isfinite(masked).any():
            raise InputError("the grammar allows no token at this point of the output")
        return masked

    def greedy_token(self, logits: FloatArray, history: Sequence[int]) -> int:
        """The argmax of the penalised logits (respecting the grammar, if any)."""
        scores = self.penalised(logits, history)
        token = int(np.argmax(scores))
        if self.constraint is not None and not self.constraint.allows(token):
            token = self._best_allowed(scores)
        return token

    def _best_allowed(self, scores: FloatArray) -> int:
        """The best token the grammar allows: the leading candidates are asked one by one
        (masking the whole vocabulary costs far more); the mask only when none of them is
        allowed, or when the one found ties a candidate left out (then the lowest id of the
        tie must win, as ``argmax`` over the mask would choose)."""
        assert self.constraint is not None
        n = min(_GREEDY_PROBES, len(scores))
        lead = np.argpartition(-scores, n - 1)[:n]
        lead = lead[np.lexsort((lead, -scores[lead]))]  # best first, lowest id among ties
        floor = scores[lead[-1]]
        for token in lead[1:]:
            if scores[token] <= floor and n < len(scores):
                break
            if self.constraint.allows(int(token)):
                return int(token)
        return int(np.argmax(self._constrained(scores)))

    def candidates(self, logits: FloatArray, history: Sequence[int]) -> Candidates:
        """The distribution the next token is drawn from (one-hot when greedy)."""
        scores = self.penalised(logits, history)
        if self.constraint is not None:
            scores = self._constrained(scores)
        return self._truncate(scores)

    def probs(self, logits: FloatArray, history: Sequence[int]) -> FloatArray:
        """Full-vocabulary probability vector; satisfies ``base.ProbabilityFn``."""
        return self.candidates(logits, history).dense(self.n_vocab)

    def log_distribution(
        self, logits: FloatArray, history: Sequence[int]
    ) -> npt.NDArray[np.float64]:
        """Log-probabilities of every token under the transforms the request asked for
        (penalties, grammar, truncation, temperature): -inf outside what can be drawn. Greedy
        requests get the penalised distribution at temperature 1 (their one-hot choice would
        say nothing)."""
        scores = self.penalised(logits, history)
        if self.constraint is not None:
            scores = self._constrained(scores)
        if self.greedy:
            shifted = scores.astype(np.float64) - np.max(scores)
            with np.errstate(divide="ignore"):
                result: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum())
            return result
        cand = self._truncate(scores)
        out = np.full(self.n_vocab, -np.inf)
        with np.errstate(divide="ignore"):
            out[cand.ids] = np.log(cand.probs)
        return out

    def couple(self) -> None:
        """Draw every token by Gumbel-max, the noise of the token at index i fixed by the seed
        and i alone: the same seed gives the same output whatever is drafted (a draft is kept
        exactly when it is the token this draw picks), with the target's distribution."""
        if self.seed is None:
            raise InputError("coupled sampling needs a seed")
        self.coupled = True

    def coupled_token(self, logits: FloatArray, history: Sequence[int], index: int) -> int:
        """argmax of log p + Gumbel noise(seed, index) over what can be drawn: a draw from p."""
        cand = self.candidates(logits, history)
        u = np.random.default_rng([self.seed or 0, index]).random(self.n_vocab)[cand.ids]
        with np.errstate(divide="ignore"):
            scores = np.log(cand.probs) - np.log(-np.log(u))
        return int(cand.ids[int(np.argmax(scores))])

    def coupled_probs(self, first_index: int, base: int) -> ProbabilityFn:
        """For a drafting model: the one-hot of the token the coupled draw picks from its own
        row, the draft after ``base`` tokens of history being token ``first_index + k``."""

        def probs(logits: FloatArray, history: Sequence[int]) -> FloatArray:
            token = self.coupled_token(logits, history, first_index + len(history) - base)
            out = np.zeros(self.n_vocab, dtype=np.float32)
            out[token] = 1.0
            return out

        return probs

    def sample(self, logits: FloatArray, history: Sequence[int], offset: int = 0) -> int:
        """Draw the next token (``offset`` tokens after the last accepted one). With a grammar,
        try the unconstrained draw first (as llama.cpp does) and mask the whole vocabulary
        only when that token is not allowed."""
        if self.greedy:
            return self.greedy_token(logits, history)
        if self.coupled:
            return self.coupled_token(logits, history, self.emitted + offset)
        scores = self.penalised(logits, history)
        token = self._truncate(scores).draw(self.rng)
        if self.constraint is not None and not self.constraint.allows(token):
            token = self._truncate(self._constrained(scores)).draw(self.rng)
        return token

    def accept(self, token: int) -> None:
        """Advance stateful parts (the token index, the grammar) past an emitted token."""
        self.emitted += 1
        if self.constraint is not None:
            self.constraint.accept(token)

    def _truncate(self, scores: FloatArray) -> Candidates:
        p = self.params
        if p.greedy:
            best = int(np.argmax(scores))
            return Candidates(np.array([best], dtype=np.int64), np.ones(1))
        ids = _top_k_ids(scores, p.top_k)
        ids = ids[np.isfinite(scores[ids])]
        if len(ids) == 0:
            raise InputError("no token has a finite probability under these sampling options")
        logits = scores[ids].astype(np.float64)
        if p.typical_p < 1.0:
            ids, logits = _typical(ids, logits, p.typical_p)
        if p.top_p < 1.0:
            ids, logits = _top_p(ids, logits, p.top_p)
        if p.min_p > 0.0:
            keep = logits >= logits[0] + math.log(p.min_p)
            keep[0] = True
            ids, logits = ids[keep], logits[keep]
        return Candidates(ids, softmax(logits / p.temperature))


def _top_k_ids(scores: FloatArray, top_k: int) -> IdArray:
    """Token ids sorted by descending score, cut to ``top_k`` when it is positive."""
    n = len(scores)
    if 0 < top_k < n:
        part = np.argpartition(-scores, top_k - 1)[:top_k]
        order = np.argsort(-scores[part], kind="stable")
        return part[order].astype(np.int64)
    return np.argsort(-scores, kind="stable").astype(np.int64)


def _top_p(
    ids: IdArray, logits: npt.NDArray[np.float64], top_p: float
) -> tuple[IdArray, npt.NDArray[np.float64]]:
    probs = softmax(logits)
    cumulative = np.cumsum(probs)
    keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1
    keep = max(1, min(keep, len(ids)))
    return ids[:keep], logits[:keep]


def _typical(
    ids: IdArray, logits: npt.NDArray[np.float64], typical_p: float
) -> tuple[IdArray, npt.NDArray[np.float64]]:
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy."""
    probs = softmax(logits)
    with np.errstate(divide="ignore"):
        log_probs = np.log(probs)
    entropy = -float(np.sum(probs * np.where(probs > 0, log_probs, 0.0)))
    shift = np.abs(-log_probs - entropy)
    order = np.argsort(shift, kind="stable")
    cumulative = np.cumsum(probs[order])
    keep = int(np.searchsorted(cumulative, typical_p, side="right")) + 1
    keep = max(1, min(keep, len(ids)))
    chosen = np.sort(order[:keep])  # back to descending-logit order
    return ids[chosen], logits[chosen]
