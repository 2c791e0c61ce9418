"""Drafting inside a continuous batch, without a model: drafts are priced as the whole step they
make (simulated CPU cost curve, requests sharing one controller as a model's slots do), and
decoding requests yield to a prompt in the step (fake requests through the batch loop, and a
request's drafting state)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from modelhub.engine.batching import BatchLoop
from modelhub.engine.drafting import RequestDrafting
from modelhub.engine.options import GenerateOptions
from modelhub.engine.sampling import Sampler
from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.base import ProbabilityFn, Proposal
from modelhub.engine.speculative.choice import Member
from modelhub.engine.speculative.costs import StepShare


def step_seconds(rows: int) -> float:
    """A CPU-bound step: each row costs about as much as the next (measured on the 2-core
    machine, SmolLM2: 1 row 10 ms, 4 rows 44 ms, 8 rows ~75 ms, 20 rows ~150 ms)."""
    return 0.004 + 0.0075 * rows


def simulate_batch(decoding: int, copy_share: float, steps: int = 1500, seed: int = 0) -> float:
    """``decoding`` requests drafting with one rated controller (n-gram-like: a guess is
    accepted with the probability its confidence says; ``copy_share`` of the rounds find a
    passage to copy, the others guess at 0.2-0.7), planned one after another in each step as
    the batch loop plans them. Returns the batch's tokens per second against every request
    decoding plainly."""
    rng = np.random.default_rng(seed)
    ctl = AdaptiveDraftLength(8, verify={})
    tokens, seconds = 0, 0.0
    for _ in range(steps):
        ks: list[int] = []
        confidences: list[list[float]] = []
        rows = 0
        for i in range(decoding):
            ctl.others, ctl.base_rows = decoding - 1, rows + (decoding - i - 1)
            if rng.random() < copy_share:
                confidence = [0.98] * 8
            else:
                confidence = [float(c) for c in rng.uniform(0.2, 0.7, 8)]
            k = ctl.cut(confidence)
            ks.append(k)
            confidences.append(confidence)
            rows += k + 1
        t_step = step_seconds(rows) * (1.0 + 0.05 * (rng.random() - 0.5))
        for k, confidence in zip(ks, confidences, strict=True):
            accepted = 0
            while accepted < k and rng.random() < confidence[accepted]:
                accepted += 1
            ctl.base_rows = rows - k - 1  # what the others' rows turned out to be
            ctl.record(8, k, accepted, k * 0.0001, t_step)
            tokens += accepted + 1
            seconds += k * 0.0001
        seconds += t_step
    return tokens / seconds / (decoding / step_seconds(decoding))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_a_batch_drafts_are_priced_as_the_whole_step(seed: int) -> None:
    """Each step's time is recorded under the step's total rows, and a request prices its
    drafts with the rows the others put in the step. Keyed by a round's own rows (as before),
    a plain round in a step where another request drafted recorded the whole wide step as the
    cost of one row, extra rows looked free and two requests drafting on mixed text ran at
    0.88-0.94x of plain decoding; priced by the step they ran ahead."""
    assert simulate_batch(2, copy_share=0.3, seed=seed) >= 1.03
    # Four requests on a CPU-bound step: a guess costs nearly a token's time, so drafting on
    # text it cannot predict must cost (almost) nothing.
    assert simulate_batch(4, copy_share=0.0, seed=seed) >= 0.97


# ---- the batch loop yields to prompts -----------------------------------------------------------


class _Context:
    """A target context that records each step's rows."""

    n_batch = 512

    def __init__(self) -> None:
        self.steps: list[list[int]] = []  # each step's sequence ids, one per row

    def decode_rows(
        self, tokens: list[int], positions: list[int], seqs: list[int], outputs: list[bool]
    ) -> None:
        self.steps.append(list(seqs))

    def row_logits(self, row: int) -> npt.NDArray[np.float32]:
        return np.zeros(4, dtype=np.float32)


class _Decoding:
    """A decoding request that drafts as many rows as it is given, up to ``wants``."""

    phase = "decode"
    cancelled = False

    def __init__(self, seq: int, wants: int, yields: bool = True) -> None:
        self.slot = SimpleNamespace(seq=seq, recurrent=SimpleNamespace(replay=None))
        self.tokens = [1, 2, 3]
        self.wants = wants
        self.yields = yields  # False: a fixed draft length (draft_adaptive false)
        self.shares: list[Any] = []
        self.step_rows: list[int | None] = []

    def plan_round(self, max_rows: int, share: Any = None) -> list[int]:
        self.shares.append(share)
        return [self.tokens[-1]] + [7] * min(self.wants, max_rows - 1)

    def after_round(self, logits: Any, first: int, decode_ns: int, step_rows: Any = None) -> None:
        self.step_rows.append(step_rows)


class _Prefilling:
    """A new request's prompt: all but its last token, then the last token alone."""

    phase = "prefill"
    cancelled = False

    def __init__(self, seq: int, prompt_len: int) -> None:
        self.slot = SimpleNamespace(seq=seq, recurrent=SimpleNamespace(replay=None))
        self.prompt = list(range(prompt_len))
        self.next_pos = 0

    def prefill_chunk(self, budget: int) -> list[int]:
        last = len(self.prompt) - 1
        if self.next_pos < last:
            return self.prompt[self.next_pos : min(self.next_pos + budget, last)]
        return [self.prompt[last]]

    def after_prefill(self, chunk: list[int], logits: Any, row: int) -> None:
        self.next_pos += len(chunk)
        if self.next_pos == len(self.prompt):
            self.phase = "done"  # its first token: what the test waits for


def test_decoding_requests_draft_nothing_while_a_prompt_is_in_the_step() -> None:
    """A short request arriving while three others draft waits for its prompt chunk and its
    last token, two steps: they carry one row per decoding request, as plain decoding would
    make them, and their times are no measure of a round. Once the prompt is in, the others
    draft again, priced with the rows planned before them and one for each after."""
    ctx = _Context()
    loop = BatchLoop(ctx, [])  # type: ignore[arg-type]
    decoding = [_Decoding(seq, wants=8) for seq in range(3)]
    short = _Prefilling(3, prompt_len=12)
    loop.active = [*decoding, short]  # type: ignore[list-item]
    loop._step()  # the prompt's chunk
    loop._step()  # its last token, whose logits give the first token
    assert short.phase == "done"
    assert [sorted(set(s)) for s in ctx.steps] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert [len(s) for s in ctx.steps] == [3 + 11, 3 + 1]  # no drafted rows
    for gen in decoding:
        assert [s.prompt for s in gen.shares] == [True, True]
        assert gen.step_rows == [None, None]
    loop.active = list(decoding)  # type: ignore[arg-type]
    loop._step()
    assert len(ctx.steps[-1]) == 3 * 9  # drafting resumed
    assert [g.shares[-1] for g in decoding] == [
        StepShare(3, 2, False),
        StepShare(3, 9 + 1, False),
        StepShare(3, 18, False),
    ]
    assert [g.step_rows[-1] for g in decoding] == [27, 27, 27]


def test_a_fixed_draft_length_drafts_every_step() -> None:
    """``draft_adaptive`` false promises K guesses every step, prompts or not."""
    ctx = _Context()
    loop = BatchLoop(ctx, [])  # type: ignore[arg-type]
    fixed, adaptive = _Decoding(0, wants=4, yields=False), _Decoding(1, wants=4)
    loop.active = [fixed, adaptive, _Prefilling(2, prompt_len=12)]  # type: ignore[list-item]
    loop._step()
    assert len(ctx.steps[0]) == 5 + 1 + 11
    assert fixed.shares[0].prompt is False and adaptive.shares[0].prompt is True
    assert fixed.step_rows == adaptive.step_rows == [None]  # prompt rows: no measure


class _Guesser:
    """A rated drafter (n-gram-like) that always guesses four tokens at 0.9."""

    kind = "ngram"

    def __init__(self) -> None:
        self.asked = 0

    def begin(self, tokens: Sequence[int]) -> None: ...

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        self.asked += 1
        return Proposal([5, 6, 7, 8][:max_tokens], confidence=[0.9] * min(4, max_tokens))

    def commit(self, tokens: Sequence[int]) -> None: ...


def test_a_round_that_yields_to_a_prompt_asks_no_drafter_and_records_nothing() -> None:
    verify: dict[int, Any] = {}
    ctl = AdaptiveDraftLength(4, verify=verify)
    guesser = _Guesser()
    options = GenerateOptions(temperature=0.0, num_predict=32)
    drafting = RequestDrafting(
        [Member("ngram", guesser, 4)],  # type: ignore[arg-type]
        lambda name, klass, load, bound: ctl,
        Sampler(options, 16),
        options,
        0,
    )
    tokens = [1, 2, 3]
    drafting.begin(tokens, None)
    assert drafting.plan(tokens, 4, StepShare(4, 3, prompt=True)) == []
    drafting.after_round(tokens, 1, 0, 90_000_000, None)
    assert guesser.asked == 0 and verify == {} and ctl.draft_rounds == 0
    # The prompt is in: the next round drafts (nothing measured yet: all four guesses) and
    # its step is recorded under the step's rows.
    tokens = [1, 2, 3, 4]
    assert drafting.plan(tokens, 4, StepShare(4, 3)) == [5, 6, 7, 8]
    drafting.after_round([*tokens, 5, 6, 7], 4, 3, 60_000_000, 3 + 5)
    assert guesser.asked == 1 and list(verify) == [8] and ctl.draft_rounds == 1


class _Sampler:
    """A model-drafter stand-in: four guesses, drawn from a uniform q when asked to sample."""

    kind = "draft_model"

    def begin(self, tokens: Sequence[int]) -> None: ...

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        k = min(4, max_tokens)
        q = None if probs is None else np.full((k, 16), 1 / 16, dtype=np.float32)
        return Proposal([5, 6, 7, 8][:k], q)

    def commit(self, tokens: Sequence[int]) -> None: ...


@pytest.mark.parametrize(
    ("options", "cut"),
    [
        (GenerateOptions(temperature=0.0, num_predict=32), True),  # greedy
        (GenerateOptions(temperature=0.8, num_predict=32, seed=3), True),  # coupled draws
        (GenerateOptions(temperature=0.8, num_predict=32), False),  # drawn from q, verified by it
    ],
)
def test_guesses_stop_before_one_that_ends_the_answer(options: GenerateOptions, cut: bool) -> None:
    """Nothing after an end-of-generation guess can be kept, and the round's own token after
    the last kept guess ends the answer just the same: such guesses are not verified, except
    where q was drawn from and verifies them (whether a position is verified must not depend
    on what was drawn there: that would bias the output away from the target's p)."""
    for member, expected in (
        (Member("ngram", _Guesser(), 4), [5, 6]),
        (Member("draft", _Sampler(), 4, cost_prior=0.01), [5, 6] if cut else [5, 6, 7, 8]),
    ):
        ctl = AdaptiveDraftLength(4, adaptive=False)
        sampler = Sampler(options, 16, seed=options.seed)
        if options.seed is not None:
            sampler.couple()  # as the engine does for a seeded request
        drafting = RequestDrafting(
            [member],
            lambda name, klass, load, bound, ctl=ctl: ctl,
            sampler,
            options,
            0,
            lambda drafts: drafts.index(7) if 7 in drafts else None,  # 7 would end the answer
        )
        tokens = [1, 2, 3]
        drafting.begin(tokens, None)
        assert drafting.plan(tokens, 4) == expected, member.name
