"""Per-token acceptance estimates (speculative.confidence) and the cut they drive."""

from __future__ import annotations

from itertools import pairwise

import pytest

from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.confidence import AcceptanceByClass


def test_prior_then_learning_per_class() -> None:
    acc = AcceptanceByClass({"long": 0.8, "short": 0.2}, default_prior=0.5)
    assert acc.estimate("long") == pytest.approx(0.8)
    assert acc.estimate("short") == pytest.approx(0.2)
    assert acc.estimate("other") == pytest.approx(0.5)
    for _ in range(40):
        acc.record("short", True)
    assert acc.estimate("short") > 0.95  # the evidence outweighs the prior
    assert acc.estimate("long") == pytest.approx(0.8)  # classes are independent
    for _ in range(200):
        acc.record("long", False)
    assert acc.estimate("long") == pytest.approx(0.02)  # never certain to fail


def test_old_outcomes_fade() -> None:
    acc = AcceptanceByClass({}, decay=0.9)
    for _ in range(50):
        acc.record(1, True)
    for _ in range(10):
        acc.record(1, False)
    assert acc.estimate(1) < 0.4  # ten recent misses outweigh fifty old hits


def test_judging_reads_the_committed_tokens_up_to_the_first_miss() -> None:
    acc = AcceptanceByClass({}, default_prior=0.5, prior_weight=1.0, decay=1.0)
    # drafts for positions 3..6 after [pending at 2]
    acc.expect(3, [10, 11, 12, 13], ["a", "b", "c", "d"])
    acc.judge([0, 1, 2, 10, 11, 99])  # 10, 11 kept; 12 lost to 99; 13 never judged
    assert acc.estimate("a") == pytest.approx(1.5 / 2)
    assert acc.estimate("b") == pytest.approx(1.5 / 2)
    assert acc.estimate("c") == pytest.approx(0.5 / 2)
    assert acc.estimate("d") == pytest.approx(0.5)
    acc.judge([0, 1, 2, 10, 11, 12, 13])  # judged once only
    assert acc.estimate("d") == pytest.approx(0.5)


def test_positions_past_the_verified_drafts_are_evidence_and_unknown_ones_are_not() -> None:
    acc = AcceptanceByClass({}, default_prior=0.5, prior_weight=1.0, decay=1.0)
    # Only the first draft was verified; the target's own next token matched the second draft.
    acc.expect(1, [5, 6, 7], ["x", "y", "z"])
    acc.judge([0, 5, 6])
    assert acc.estimate("y") == pytest.approx(1.5 / 2)
    assert acc.estimate("z") == pytest.approx(0.5)  # generation stopped before it: no evidence
    acc.expect(3, [8], ["x"])
    acc.forget()  # a new request began: the proposal is never judged
    acc.judge([0, 5, 6, 1])
    assert acc.estimate("x") == pytest.approx(1.5 / 2)


def _measured(costs: dict[int, float], draft: float = 0.0001) -> AdaptiveDraftLength:
    """A controller that has measured these verify costs (seconds per row count)."""
    ctl = AdaptiveDraftLength(16)
    for rows, seconds in costs.items():
        ctl.record(rows - 1, rows - 1, 0, draft * (rows - 1), seconds)
    return ctl


# verify cost on this CPU for SmolLM2 Q8_0, in units of one decode: the second row costs ~0.5
COSTS = {1: 1.0, 2: 1.5, 5: 1.9, 9: 2.4, 17: 3.5}


def test_cut_keeps_the_prefix_that_pays() -> None:
    ctl = _measured(COSTS)
    assert ctl.cut([0.99] * 16) == 16  # a near-certain copy: verify all of it
    assert ctl.cut([0.1] * 16) == 0  # hopeless guesses: decode plainly
    # a confident start, then a weak link: verify up to the weak link
    assert ctl.cut([0.97] * 6 + [0.05] + [0.97] * 9) == 6
    # a single guess pays only when it is likely (the second row costs half a decode)
    assert ctl.cut([0.3]) == 0
    assert ctl.cut([0.9]) == 1


def test_rated_drafters_are_asked_for_every_token() -> None:
    ctl = _measured(COSTS)
    ctl.cut([0.1, 0.1])
    assert ctl.next_k() == 16  # the cut, not the round's K, decides from now on
    fixed = AdaptiveDraftLength(8, adaptive=False)
    assert fixed.cut([0.01] * 8) == 8  # fixed K: every draft is verified


def _true_cost(rows: int) -> float:
    """COSTS, interpolated linearly between the row counts it lists."""
    known = sorted(COSTS.items())
    for (n0, v0), (n1, v1) in pairwise(known):
        if n0 <= rows <= n1:
            return v0 + (v1 - v0) * (rows - n0) / (n1 - n0)
    return known[-1][1]


def _run_rated(ctl: AdaptiveDraftLength, confidence: list[float], rounds: int) -> list[int]:
    """``rounds`` rounds of a rated drafter whose drafts are all accepted; the verify times
    are the true costs. Returns the number of drafts verified per round."""
    cuts = []
    for _ in range(rounds):
        k = ctl.cut(confidence)
        cuts.append(k)
        ctl.record(len(confidence), k, k, 0.0, _true_cost(k + 1))
    return cuts


def test_a_slow_wide_verify_is_measured_again() -> None:
    # The wide verifies were measured while another process held the core: 20x their cost.
    ctl = _measured({1: 1.0, **{n: 20 * v for n, v in COSTS.items() if n > 1}})
    confident = [0.99] * 16
    assert ctl.cut(confident) == 0  # believed: drafting looks like a loss
    cuts = _run_rated(ctl, confident, 120)
    first = next(i for i, k in enumerate(cuts) if k)
    assert first <= 40, cuts  # a probe came within a request's worth of tokens
    assert all(k == 16 for k in cuts[-20:]), cuts  # and drafting stays on once re-measured


def test_probes_back_off_when_the_wide_verify_really_is_slow() -> None:
    ctl = _measured({1: 1.0, **{n: 20 * v for n, v in COSTS.items() if n > 1}})
    cuts = []
    for _ in range(1000):
        k = ctl.cut([0.99] * 16)
        cuts.append(k)
        ctl.record(16, k, k, 0.0, 20 * _true_cost(k + 1) if k else 1.0)
    probes = sum(1 for k in cuts if k)
    assert 1 <= probes <= 6, probes  # 32, 64, 128, ... rounds apart: a few percent at most


def test_a_requests_misses_lower_its_estimates_and_hits_restore_them() -> None:
    acc = AcceptanceByClass({"long": 0.8}, prior_weight=50.0)  # a long history other requests left
    assert acc.expect(1, [5], ["long"]) == [pytest.approx(0.8)]  # nothing judged yet: as learned
    acc.judge([0, 9])  # a miss at a confident class
    assert acc.estimate("long") == pytest.approx(0.79, abs=0.01)  # the history barely moves
    lowered = acc.for_request("long")
    assert lowered < 0.6  # this request's estimates drop at once
    assert acc.expect(2, [6], ["long"]) == [pytest.approx(lowered)]
    for n in range(3, 9):  # then its guesses come out right: the estimates come back
        acc.expect(n, [n], ["long"])
        acc.judge(list(range(n + 1)))
    assert acc.for_request("long") > acc.estimate("long") * 0.95
    acc.forget()  # the next request starts from the classes' rates
    assert acc.calibration() == 1.0 and acc.for_request("long") == acc.estimate("long")
