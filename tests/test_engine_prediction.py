"""The predicted-outputs drafter on synthetic streams: following, re-aligning after edits."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine_ngram import Run, simulate

from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.ngram import NgramDrafter
from modelhub.engine.speculative.prediction import PredictionDrafter

K = 8
PROMPT = [1, 2, 3]

CODE = """
def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal = subtotal + item . price * item . quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest(items):
    best = None
    for item in items:
        if best is None or item . price < best . price:
            best = item
    return best


def most_expensive(items):
    best = None
    for item in items:
        if best is None or item . price > best . price:
            best = item
    return best
"""


def words(text: str, vocab: dict[str, int]) -> list[int]:
    """Word-level token ids: repeated words (for, in, items, :) make re-alignment ambiguous."""
    return [vocab.setdefault(w, len(vocab) + 100) for w in text.replace("\n", " \n ").split(" ")]


def distinct_tokens(n: int, seed: int) -> list[int]:
    return random.Random(seed).sample(range(1000, 1_000_000), n)


def run_prediction(prediction: list[int], output: list[int]) -> tuple[Run, PredictionDrafter]:
    drafter = PredictionDrafter(prediction)
    return simulate(drafter, PROMPT, output, K), drafter


def test_exact_prediction_is_proposed_in_full() -> None:
    prediction = distinct_tokens(300, seed=1)
    run, drafter = run_prediction(prediction, prediction)
    assert run.proposed == run.accepted  # nothing rejected
    assert run.rounds == -(-299 // (K + 1))
    assert drafter.realignments == 0


def _edit_cost(prediction: list[int], output: list[int]) -> int:
    """Rounds beyond the ideal for ``output`` (every round accepting K drafts + 1)."""
    run, _ = run_prediction(prediction, output)
    return run.rounds - -(-(len(output) - 1) // (K + 1))


def test_insertion_costs_a_few_rounds() -> None:
    prediction = distinct_tokens(400, seed=2)
    inserted = distinct_tokens(5, seed=3)
    assert _edit_cost(prediction, prediction[:200] + inserted + prediction[200:]) <= 5 + 2


def test_deletion_costs_a_few_rounds() -> None:
    prediction = distinct_tokens(400, seed=4)
    assert _edit_cost(prediction, prediction[:200] + prediction[230:]) <= 2


def test_replacement_costs_a_few_rounds() -> None:
    prediction = distinct_tokens(400, seed=5)
    replaced = distinct_tokens(4, seed=6)
    assert _edit_cost(prediction, prediction[:200] + replaced + prediction[204:]) <= 4 + 2


def test_an_edit_wastes_at_most_one_round_of_drafts() -> None:
    # Without re-alignment every draft after the edit would be rejected (about 300 tokens).
    prediction = distinct_tokens(400, seed=7)
    output = [*prediction[:100], 5, *prediction[100:]]
    run, drafter = run_prediction(prediction, output)
    # The edit round's drafts, and one round guessing the new token replaced a predicted one.
    assert run.proposed - run.accepted <= 2 * K
    assert run.accepted >= len(output) - 1 - run.rounds  # every round but the edit one: all kept
    assert drafter.realignments == 1


def test_guesses_after_a_tentative_realignment_are_rated_lower() -> None:
    prediction = distinct_tokens(400, seed=8)
    drafter = PredictionDrafter(prediction)
    tokens = [*PROMPT, *prediction[:50]]
    drafter.begin(PROMPT)
    confident = drafter.propose(tokens, K)
    assert confident.confidence is not None and len(confident.confidence) == K
    # The output departs with one new token: the drafter guesses a one-token substitution.
    tokens = [*tokens, 5]
    drafter.commit(tokens)
    guessed = drafter.propose(tokens, K)
    assert guessed.tokens == prediction[51 : 51 + K]
    assert guessed.confidence is not None
    # the first guess rests on a guessed alignment; the rest follow it like a confirmed copy
    # (both scaled by this request's calibration, which the miss lowered)
    assert drafter.acceptance.calibration() < 1.0
    confirmed = drafter.acceptance.for_request("confirmed")
    assert guessed.confidence[0] == drafter.acceptance.for_request("tentative") < confirmed
    assert guessed.confidence[1:] == [confirmed] * (K - 1)


def test_estimates_learn_from_the_outcomes() -> None:
    prediction = distinct_tokens(300, seed=9)
    _, drafter = run_prediction(prediction, prediction)
    assert drafter.acceptance.estimate("confirmed") > 0.95  # every draft was kept
    noisy = [t if i % 3 else t + 1 for i, t in enumerate(prediction)]  # every third one differs
    _, drafter = run_prediction(prediction, noisy)
    assert drafter.acceptance.estimate("confirmed") < 0.8


def test_a_fallback_drafts_where_the_prediction_does_not_reach() -> None:
    """A reply that first quotes the prompt, then follows the prediction, then goes on."""
    quoted = distinct_tokens(40, seed=10)
    prediction = distinct_tokens(100, seed=11)
    prompt = [*distinct_tokens(5, seed=12), *quoted, *distinct_tokens(5, seed=13)]
    output = [*quoted, *prediction, *quoted]
    alone = simulate(PredictionDrafter(prediction), prompt, output, K)
    both = simulate(PredictionDrafter(prediction, fallback=NgramDrafter()), prompt, output, K)
    assert both.accepted >= alone.accepted + 60  # the two quotes, drafted by the fallback
    assert both.proposed - both.accepted <= 3 * K  # and few wasted guesses for it
    assert both.rounds * 3 < alone.rounds


def test_edits_in_code_with_repeated_lines() -> None:
    vocab: dict[str, int] = {}
    prediction = words(CODE, vocab)
    # Rename a variable in the second function only, and add a docstring line to the third.
    edited = CODE.replace(
        "def cheapest(items):\n    best = None", "def cheapest(items):\n    winner = None"
    ).replace(
        "def most_expensive(items):\n", 'def most_expensive(items):\n    """ Highest price . """\n'
    )
    output = words(edited, vocab)
    run, drafter = run_prediction(prediction, output)
    assert drafter.realignments >= 2
    assert run.accepted >= len(output) - 3 * run.rounds  # most of each round was drafted
    assert run.rounds - -(-(len(output) - 1) // (K + 1)) <= 12


def test_a_preamble_before_the_predicted_text() -> None:
    prediction = distinct_tokens(200, seed=8)
    preamble = distinct_tokens(6, seed=9)
    assert _edit_cost(prediction, preamble + prediction) <= 6 + 2


def test_output_longer_than_the_prediction() -> None:
    prediction = distinct_tokens(50, seed=10)
    extra = distinct_tokens(30, seed=11)
    assert not set(extra) & set(prediction)
    # Having followed the whole prediction, the drafter expects the token after its end.
    drafter = PredictionDrafter(prediction)
    drafter.begin(PROMPT)
    drafter.commit([*PROMPT, *prediction])
    assert drafter.position == 50
    assert drafter.propose([*PROMPT, *prediction], K).tokens == []  # nothing left to propose
    # Output the prediction does not contain: one departure, then lost for good (a guessed
    # one-token substitution is refuted by the next token and nothing matches any more).
    run, drafter = run_prediction(prediction, prediction + extra)
    assert run.accepted >= 40
    assert drafter.realignments == 1
    assert drafter.position is None


def test_repeating_an_earlier_part_falls_back_to_a_global_search() -> None:
    prediction = distinct_tokens(300, seed=12)
    output = prediction[:250] + prediction[20:60] + prediction[250:]
    run, _ = run_prediction(prediction, output)
    ideal = -(-(len(output) - 1) // (K + 1))
    assert run.rounds - ideal <= 4


def test_empty_prediction_proposes_nothing() -> None:
    run, _ = run_prediction([], distinct_tokens(20, seed=13))
    assert run.proposed == 0


def test_drafter_satisfies_the_protocol() -> None:
    drafter: Drafter = PredictionDrafter([1, 2, 3])
    assert drafter.kind == "prediction"
    drafter.begin([9, 9])
    assert drafter.propose([9, 9, 1], 5).tokens == [2, 3]
    assert drafter.propose([9, 9, 1], 0).tokens == []


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(["insert", "delete", "replace"]),
    at=st.integers(0, 199),
    size=st.integers(1, 8),
)
def test_any_single_edit_costs_at_most_its_length_plus_one(
    seed: int, kind: str, at: int, size: int
) -> None:
    prediction = distinct_tokens(200, seed=seed)
    new = distinct_tokens(size, seed=seed + 1)
    new = [t + 1_000_000 for t in new]  # never in the prediction
    if kind == "insert":
        output = prediction[:at] + new + prediction[at:]
    elif kind == "delete":
        output = prediction[:at] + prediction[at + size :]
    else:
        output = prediction[:at] + new + prediction[at + size :]
    if len(output) < 2:
        return
    run, _ = run_prediction(prediction, output)
    ideal = -(-(len(output) - 1) // (K + 1))
    assert run.rounds - ideal <= (0 if kind == "delete" else size) + 1


@settings(max_examples=60, deadline=None)
@given(
    prediction=st.lists(st.integers(0, 5), max_size=60),
    output=st.lists(st.integers(0, 5), min_size=1, max_size=60),
)
def test_proposals_are_always_slices_of_the_prediction(
    prediction: list[int], output: list[int]
) -> None:
    run, _ = run_prediction(prediction, output)
    for proposal in run.proposals:
        assert any(
            prediction[i : i + len(proposal)] == proposal
            for i in range(len(prediction) - len(proposal) + 1)
        )
