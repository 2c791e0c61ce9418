"""The acceptance rules alone: greedy prefix matching and rejection sampling (SPEC-03)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from modelhub.engine.speculative.verify import (
    accept_probability,
    deterministic_output_distribution,
    draw,
    greedy_prefix,
    output_distribution,
    rejection_step,
    residual_distribution,
)


def _random_dist(rng: np.random.Generator, n: int, zeros: int = 0) -> np.ndarray:
    w = rng.random(n) ** 3
    if zeros:
        w[rng.choice(n, size=zeros, replace=False)] = 0.0
    if w.sum() == 0:
        w[0] = 1.0
    return w / w.sum()


def _pairs() -> list[tuple[str, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    p = _random_dist(rng, 10)
    disjoint_p = np.array([0.5, 0.5, 0, 0, 0, 0, 0, 0, 0, 0.0])
    disjoint_q = np.array([0, 0, 0.25, 0.25, 0.5, 0, 0, 0, 0, 0.0])
    one_hot = np.zeros(10)
    one_hot[3] = 1.0
    return [
        ("equal", p, p.copy()),
        ("random", _random_dist(rng, 10), _random_dist(rng, 10)),
        ("q zero where p>0", _random_dist(rng, 10), _random_dist(rng, 10, zeros=4)),
        ("disjoint", disjoint_p, disjoint_q),
        ("one-hot q", _random_dist(rng, 10), one_hot),
    ]


@pytest.mark.parametrize(("name", "p", "q"), _pairs(), ids=[n for n, _, _ in _pairs()])
def test_analytic_output_distribution_is_p(name: str, p: np.ndarray, q: np.ndarray) -> None:
    assert np.max(np.abs(output_distribution(p, q) - p)) < 1e-9


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=12),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    p_zeros=st.integers(min_value=0, max_value=5),
    q_zeros=st.integers(min_value=0, max_value=5),
)
def test_analytic_output_distribution_random(n: int, seed: int, p_zeros: int, q_zeros: int) -> None:
    rng = np.random.default_rng(seed)
    p = _random_dist(rng, n, zeros=min(p_zeros, n - 1))
    q = _random_dist(rng, n, zeros=min(q_zeros, n - 1))
    assert np.max(np.abs(output_distribution(p, q) - p)) < 1e-9
    for token in range(n):
        assert np.max(np.abs(deterministic_output_distribution(p, token) - p)) < 1e-9


def test_accept_probability_and_residual_values() -> None:
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.25, 0.6, 0.15])
    assert accept_probability(p, q, 0) == 1.0
    assert accept_probability(p, q, 1) == pytest.approx(0.5)
    assert accept_probability(p, None, 1) == pytest.approx(0.3)
    # residual: max(0, p - q) = [0.25, 0, 0.05] normalised
    assert residual_distribution(p, q, 1) == pytest.approx([0.25 / 0.3, 0.0, 0.05 / 0.3])
    # one-hot: p without the drafted token
    assert residual_distribution(p, None, 0) == pytest.approx([0.0, 0.6, 0.4])


def _empirical(step, p: np.ndarray, q: np.ndarray, trials: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(p))
    for _ in range(trials):
        drafted = draw(q, rng)
        _, token = step(p, q, drafted, rng)
        counts[token] += 1
    return counts


def _wrong_step(p, q, token, rng):
    """The classic bug: on rejection, resample from p instead of the residual."""
    if rng.random() < accept_probability(p, q, token):
        return True, token
    return False, draw(p, rng)


def _chi2_pvalue(counts: np.ndarray, p: np.ndarray) -> float:
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    return float(chisquare(counts[support], counts.sum() * p[support]).pvalue)


@pytest.mark.parametrize(("name", "p", "q"), _pairs()[1:4], ids=[n for n, _, _ in _pairs()[1:4]])
def test_rejection_step_samples_p(name: str, p: np.ndarray, q: np.ndarray) -> None:
    counts = _empirical(rejection_step, p, q, trials=40_000, seed=11)
    assert _chi2_pvalue(counts, p) > 1e-3


def test_wrong_residual_is_caught() -> None:
    _, p, q = _pairs()[1]
    counts = _empirical(_wrong_step, p, q, trials=40_000, seed=11)
    assert _chi2_pvalue(counts, p) < 1e-6


def test_greedy_prefix() -> None:
    assert greedy_prefix([1, 2, 3, 4], [1, 2, 3]) == 3
    assert greedy_prefix([1, 9, 3, 4], [1, 2, 3]) == 1
    assert greedy_prefix([5, 2, 3], [1, 2]) == 0
    assert greedy_prefix([5], []) == 0
