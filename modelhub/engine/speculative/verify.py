"""Deciding which drafted tokens to keep: greedy prefix matching and rejection sampling.

Both rules are lossless. Greedy keeps the longest prefix of drafts equal to the target's own
argmax and then adds the target's token at the first mismatch (or after the last draft: the bonus).
Under sampling, each draft d drawn from q is kept with probability min(1, p(d)/q(d)); on rejection
the replacement is drawn from norm(max(0, p - q)); when every draft is kept the bonus is drawn
from p. The emitted token is then distributed exactly as p (Leviathan et al., Chen et al.).
A deterministic drafter (n-gram, prediction, greedy draft model) has a one-hot q.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.floating[Any]]

#: Signature of a rejection step: (p, q or None for one-hot, draft token, rng) ->
#: (accepted, emitted token). The engine takes it as a parameter so that tests can prove that a
#: deliberately wrong rule is caught.
AcceptanceRule = Callable[[Vector, Vector | None, int, np.random.Generator], tuple[bool, int]]


def greedy_prefix(target_tokens: Sequence[int], drafts: Sequence[int]) -> int:
    """How many drafts match the target's choices, counting from the first."""
    n = 0
    for draft, target in zip(drafts, target_tokens, strict=False):
        if draft != target:
            break
        n += 1
    return n


def accept_probability(p: Vector, q: Vector | None, token: int) -> float:
    """min(1, p(token) / q(token)); q None means one-hot at ``token`` (so just p(token))."""
    p_tok = float(p[token])
    if q is None:
        return min(1.0, p_tok)
    q_tok = float(q[token])
    if q_tok <= 0.0:
        # The draft could not have drawn this token; treat it as a certain rejection.
        return 0.0
    return min(1.0, p_tok / q_tok)


def residual_distribution(p: Vector, q: Vector | None, token: int) -> npt.NDArray[np.float64]:
    """norm(max(0, p - q)): what to draw from after rejecting ``token``.

    With one-hot q this is p without ``token``. If rounding leaves nothing (p == q up to float
    error, so a rejection was essentially impossible) fall back to p.
    """
    p64 = np.asarray(p, dtype=np.float64)
    if q is None:
        rest = p64.copy()
        rest[token] = 0.0
    else:
        rest = np.maximum(p64 - np.asarray(q, dtype=np.float64), 0.0)
    total = float(rest.sum())
    if total <= 1e-12:
        return p64 / float(p64.sum())
    result: npt.NDArray[np.float64] = rest / total
    return result


def draw(distribution: Vector, rng: np.random.Generator) -> int:
    """One token from a (dense) probability vector."""
    cumulative = np.cumsum(np.asarray(distribution, dtype=np.float64))
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(cumulative) - 1)


def rejection_step(
    p: Vector, q: Vector | None, token: int, rng: np.random.Generator
) -> tuple[bool, int]:
    """Keep ``token`` with probability min(1, p/q); otherwise draw from the residual."""
    if rng.random() < accept_probability(p, q, token):
        return True, token
    return False, draw(residual_distribution(p, q, token), rng)


def output_distribution(p: Vector, q: Vector) -> npt.NDArray[np.float64]:
    """The exact distribution of the token :func:`rejection_step` emits for a draft drawn from q.

    P(x) = q(x) a(x) + (1 - sum_y q(y) a(y)) r(x), with a the accept probability and r the
    residual. Built from the same two functions the step uses, so a bug in either shows up as a
    difference from p.
    """
    q64 = np.asarray(q, dtype=np.float64)
    accept = np.array([accept_probability(p, q, x) if q64[x] > 0 else 0.0 for x in range(len(q64))])
    kept = q64 * accept
    some_token = int(np.argmax(q64))  # the residual does not depend on it when q is given
    result: npt.NDArray[np.float64] = kept + (1.0 - float(kept.sum())) * residual_distribution(
        p, q, some_token
    )
    return result


def deterministic_output_distribution(p: Vector, token: int) -> npt.NDArray[np.float64]:
    """The exact output distribution of :func:`rejection_step` for a fixed draft ``token``."""
    a = accept_probability(p, None, token)
    out = (1.0 - a) * residual_distribution(p, None, token)
    out[token] += a
    return out
