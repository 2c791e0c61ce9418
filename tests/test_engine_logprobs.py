"""Log-probabilities from the engine: every emitted token gets its own and the best alternatives,
from the target's distribution, exactly the same with and without a drafter (verification rows
are bit-identical to one-token decodes with the default KV cache), and a proper distribution."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from devtools.realmodels import smollm2_q4_1, smollm2_q8_0
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions, TokenEvent
from modelhub.engine.options import TokenLogprob
from tests.fixtures.prompts import QUESTIONS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Engine]]:
    base = {"n_ctx": 1024, "n_threads": 0}
    plain = Engine(EngineConfig(smollm2_q8_0(), **base))  # type: ignore[arg-type]
    ngram = Engine(EngineConfig(smollm2_q8_0(), draft_kind="ngram", draft_num_predict=6, **base))  # type: ignore[arg-type]
    draft = Engine(
        EngineConfig(
            smollm2_q8_0(),
            draft_kind="draft_model",
            draft_path=smollm2_q4_1(),
            draft_num_predict=4,
            **base,
        )  # type: ignore[arg-type]
    )
    yield {"plain": plain, "ngram": ngram, "draft": draft}
    for e in (plain, ngram, draft):
        e.close()


def _run(
    engine: Engine, prompt: str, opts: GenerateOptions
) -> tuple[list[int], list[TokenLogprob]]:
    seen: list[TokenLogprob] = []

    def on_token(ev: TokenEvent) -> None:
        if ev.logprob is not None:
            seen.append(ev.logprob)

    tokens = engine.tokenize(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
    result = engine.generate(tokens, opts, on_token=on_token)
    return result.tokens, seen


def test_greedy_logprobs_equal_with_and_without_drafting(engines: dict[str, Engine]) -> None:
    opts = GenerateOptions(temperature=0, num_predict=64, top_logprobs=5)
    for prompt in (QUESTIONS[6], "Repeat exactly: one two three, one two three, one two three."):
        tokens, plain = _run(engines["plain"], prompt, opts)
        assert len(plain) == len(tokens) and [lp.token for lp in plain] == tokens
        for kind in ("ngram", "draft"):
            got_tokens, got = _run(engines[kind], prompt, opts)
            assert got_tokens == tokens
            assert got == plain, kind  # token, logprob and alternatives, bit for bit


def test_logprobs_are_a_distribution_and_greedy_picks_the_best(engines: dict[str, Engine]) -> None:
    _, entries = _run(
        engines["plain"],
        QUESTIONS[0],
        GenerateOptions(temperature=0, num_predict=24, top_logprobs=20),
    )
    for lp in entries:
        assert len(lp.top) == 20
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-9
        assert lp.top[0] == (lp.token, lp.logprob)  # greedy: the chosen token is the best
        assert lp.logprob <= 0.0


def test_sampled_logprobs_follow_the_truncated_distribution(engines: dict[str, Engine]) -> None:
    opts = GenerateOptions(temperature=0.8, top_k=5, num_predict=24, seed=7, top_logprobs=8)
    _, entries = _run(engines["plain"], QUESTIONS[1], opts)
    for lp in entries:
        assert 1 <= len(lp.top) <= 5  # top_k 5: nothing outside it can be drawn
        assert abs(sum(math.exp(v) for _, v in lp.top) - 1.0) < 1e-6
        assert lp.token in [t for t, _ in lp.top] and np.isfinite(lp.logprob)


def test_no_logprobs_unless_asked(engines: dict[str, Engine]) -> None:
    _, entries = _run(engines["plain"], QUESTIONS[2], GenerateOptions(temperature=0, num_predict=8))
    assert entries == []
    tokens, bare = _run(
        engines["plain"],
        QUESTIONS[2],
        GenerateOptions(temperature=0, num_predict=8, top_logprobs=0),
    )
    assert len(bare) == len(tokens) > 0 and all(lp.top == [] for lp in bare)
