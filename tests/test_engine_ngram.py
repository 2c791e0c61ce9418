"""The n-gram drafter and its shared pool, on synthetic token streams (no model)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.ngram import NgramDrafter, NgramPool, common_prefix_length


@dataclass
class Run:
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    proposals: list[list[int]] = field(default_factory=list)


def simulate(drafter: Drafter, prompt: Sequence[int], output: Sequence[int], k: int) -> Run:
    """The engine's greedy loop with a target that emits ``output``: every round verifies the
    proposal against it, keeps the agreeing prefix plus the target's own next token, commits."""
    run = Run()
    drafter.begin(list(prompt))
    tokens = [*prompt, output[0]]
    produced = 1
    while produced < len(output):
        proposal = drafter.propose(tokens, k).tokens[:k]
        accepted = 0
        while (
            accepted < len(proposal)
            and produced + accepted < len(output)
            and proposal[accepted] == output[produced + accepted]
        ):
            accepted += 1
        kept = output[produced : produced + accepted + 1]
        tokens += kept
        produced += len(kept)
        drafter.commit(tokens)
        run.rounds += 1
        run.proposed += len(proposal)
        run.accepted += accepted
        run.proposals.append(list(proposal))
    return run


def random_tokens(n: int, seed: int, vocab: int = 49152) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def test_repetitive_text_gets_long_drafts() -> None:
    sentence = random_tokens(20, seed=1)
    prompt = sentence * 3
    output = (sentence * 8)[:120]
    run = simulate(NgramDrafter(), prompt, output, k=16)
    assert run.accepted >= 110
    assert run.rounds <= 9  # 119 tokens after the first at up to 17 per round
    assert max(len(p) for p in run.proposals) == 16


def test_unseen_text_drafts_nothing() -> None:
    drafter = NgramDrafter()
    tokens = random_tokens(200, seed=2)
    drafter.begin(tokens)
    assert drafter.propose(tokens, 8).tokens == []


def test_chain_follows_the_most_recent_follower() -> None:
    drafter = NgramDrafter()
    tokens = [10, 11, 12, 13, 99, 10, 11, 12, 13, 50, 51, 52, 0, 1, 10, 11, 12, 13]
    drafter.begin(tokens)
    proposal = drafter.propose(tokens, 3)
    assert proposal.tokens == [50, 51, 52]
    assert proposal.probs is None


def test_chain_stops_when_it_loops_back_to_its_start() -> None:
    drafter = NgramDrafter()
    once = [1, 2, 3, 4, 5, 1, 2, 3, 4]
    drafter.begin(once)
    assert drafter.propose(once, 20).tokens == [5, 1, 2, 3, 4]


def test_chain_continues_a_cycle_the_context_already_repeats() -> None:
    drafter = NgramDrafter()
    twice = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4]
    drafter.begin(twice)
    assert drafter.propose(twice, 12).tokens == [5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1]


def test_single_token_matches_need_two_sightings() -> None:
    drafter = NgramDrafter()
    tokens = [7, 8, 9, 7]
    drafter.begin(tokens)
    assert drafter.propose(tokens, 4).tokens == []  # "7 -> 8" seen once only
    tokens += [8, 10, 7]
    drafter.commit(tokens)
    assert drafter.propose(tokens, 1).tokens == [8]


def test_n_min_drops_short_drafts() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 90, 1, 2, 3, 4]
    assert NgramDrafter(n_min=2).propose(tokens, 8).tokens == [5, 6, 90, 1, 2, 3, 4]
    assert NgramDrafter(n_min=8).propose(tokens, 8).tokens == []


def test_shorter_n_match_still_drafts() -> None:
    pool = NgramPool(4)
    tokens = [5, 6, 7, 8, 1, 2, 6, 7]  # only the 2-gram "6 7" recurs
    drafter = NgramDrafter(2, pool=pool)
    drafter.begin(tokens)
    assert drafter.propose(tokens, 1).tokens == [8]


def test_pool_lets_a_similar_second_request_draft_at_once() -> None:
    answer = random_tokens(300, seed=3)
    pool = NgramPool()
    first = simulate(NgramDrafter(pool=pool), random_tokens(50, seed=4), answer, k=12)
    assert first.accepted < 10  # nothing to copy from the first time
    second = simulate(NgramDrafter(pool=pool), random_tokens(60, seed=5), answer, k=12)
    assert second.proposed == second.accepted >= 270  # every draft was right
    assert second.rounds <= 25  # 299 tokens at up to 13 per round, after one empty round
    assert second.proposals[1] == answer[2:14]  # long drafts from the second round on
    alone = simulate(NgramDrafter(), random_tokens(60, seed=5), answer, k=12)
    assert alone.accepted < 10


def test_indexing_is_incremental() -> None:
    pool = NgramPool(4)
    drafter = NgramDrafter(pool=pool)
    prompt = random_tokens(1000, seed=6)
    drafter.begin(prompt)
    assert pool.writes == 4 * 1000 - (1 + 2 + 3 + 4)  # positions 1..3 have shorter histories
    tokens = list(prompt)
    for step in range(1, 50):
        before = pool.writes
        tokens += random_tokens(step % 5 + 1, seed=100 + step)
        drafter.commit(tokens)
        assert pool.writes - before == 4 * (step % 5 + 1)
        before = pool.writes
        drafter.propose(tokens, 8)
        assert pool.writes == before  # drafting writes nothing


def test_a_chat_that_grows_is_indexed_only_where_it_is_new() -> None:
    pool = NgramPool(4)
    turn1 = random_tokens(800, seed=7)
    simulate(NgramDrafter(pool=pool), turn1, random_tokens(100, seed=8), k=4)
    history = list(turn1) + random_tokens(100, seed=8)
    turn2 = history + random_tokens(30, seed=9)
    before = pool.writes
    NgramDrafter(pool=pool).begin(turn2)
    assert pool.writes - before == 4 * 30


def test_pool_memory_is_bounded() -> None:
    pool = NgramPool(4, capacity=1 << 10, max_sequences=2, max_sequence_tokens=100)
    bound = (8 + 4 + 1) * (1 << 10) + 2 * 100 * 4
    for seed in range(5):
        drafter = NgramDrafter(pool=pool)
        tokens = random_tokens(5000, seed=10 + seed)
        drafter.begin(tokens[:1000])
        drafter.commit(tokens)
        assert pool.nbytes <= bound
    assert len(pool._sequences) == 2
    # Recent material survives eviction well enough to draft.
    phrase = random_tokens(12, seed=20)
    tokens = [*random_tokens(50, seed=21), *phrase, *random_tokens(5, seed=22), *phrase[:4]]
    drafter = NgramDrafter(pool=pool)
    drafter.begin(tokens)
    assert drafter.propose(tokens, 8).tokens == phrase[4:12]


def test_rewound_sequence_is_resynchronised() -> None:
    drafter = NgramDrafter()
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    drafter.begin(tokens)
    drafter.commit([1, 2, 3, 4, 40, 41])  # not an extension of what was committed
    proposal = drafter.propose([1, 2, 3, 4, 40, 41, 9, 1, 2, 3, 4], 2)
    assert proposal.tokens == [40, 41]


def test_constructor_errors_are_clear() -> None:
    with pytest.raises(TypeError, match="pool="):
        NgramDrafter(NgramPool())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pool's n_match"):
        NgramDrafter(6, pool=NgramPool(4))
    with pytest.raises(ValueError, match="power of two"):
        NgramPool(capacity=1000)


def test_common_prefix_length() -> None:
    a = list(range(1000))
    assert common_prefix_length(a, a) == 1000
    assert common_prefix_length(a, a[:300]) == 300
    assert common_prefix_length(a, [*a[:700], -1, *a[701:]]) == 700
    assert common_prefix_length([], a) == 0


def test_drafter_satisfies_the_protocol() -> None:
    drafter: Drafter = NgramDrafter()
    assert drafter.kind == "ngram"


def test_long_orders_follow_the_right_source() -> None:
    """A 4-gram that recurs with another continuation misleads a 4-gram pool; the longer
    orders (up to 16) tell the two places apart, so a copy of the first passage stays right."""
    first: list[int] = []
    second: list[int] = []
    for j in range(6):  # six 4-grams that recur in both passages, each followed differently
        shared = random_tokens(4, seed=30 + j)
        first += [*shared, *random_tokens(8, seed=40 + j)]
        second += [*shared, *random_tokens(8, seed=50 + j)]
    prompt = [*first, *random_tokens(20, seed=60), *second]  # the misleading one is newer
    short = simulate(NgramDrafter(pool=NgramPool(4)), prompt, first, k=16)
    long = simulate(NgramDrafter(), prompt, first, k=16)
    # every token but the first and one per round came from a draft: no draft was wrong
    assert long.accepted >= len(first) - 1 - long.rounds
    assert long.rounds == 5  # 72 tokens, 16 drafts and the target's own token a round
    assert short.rounds >= 7  # misled where a round drafted across a shared 4-gram
    assert NgramPool().orders == (1, 2, 3, 4, 6, 8, 12, 16)


def test_a_pool_writes_once_per_order_and_token() -> None:
    pool = NgramPool(16)
    NgramDrafter(pool=pool).begin(random_tokens(100, seed=36))
    # position i has min(i, 16) tokens of history; it writes each order that fits
    assert pool.writes == sum(sum(1 for n in pool.orders if n <= i) for i in range(1, 100))


def test_drafts_carry_estimates_that_learn_from_outcomes() -> None:
    sentence = random_tokens(30, seed=37)
    drafter = NgramDrafter()
    tokens = [*sentence, *sentence[:5]]
    drafter.begin(tokens)
    proposal = drafter.propose(tokens, 16)
    assert proposal.confidence is not None
    assert len(proposal.confidence) == len(proposal.tokens) == 16
    # the chain starts from a 4-gram match and reaches the 16-gram order as it extends
    assert proposal.confidence[0] < proposal.confidence[-1]
    before = drafter.acceptance.estimate(16)
    simulate(drafter, [*sentence, *sentence[:5]], (sentence * 4)[5:], k=16)
    assert drafter.acceptance.estimate(16) > before  # long copies were right every time
