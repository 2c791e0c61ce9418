"""Lossless speculative decoding on a real model pair (SmolLM2-135M: Q8_0 target, Q4_1 draft).

Greedy output with every drafter must be token-identical to the target alone, for fixed draft
lengths and adaptive drafting, including requests that reuse the prompt cache. Each model is
loaded once per module; references are computed once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from devtools.realmodels import smollm2_q4_1, smollm2_q8_0
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions, GenerateResult

pytestmark = pytest.mark.slow

N_TOKENS = 200
SYSTEM = (
    "<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)
QUESTIONS = [
    "Write a story about a robot who learns to paint.",
    "Explain how a bicycle works.",
    "What is the boiling point of water? Explain briefly.",  # ends by itself (EOG)
]
REWRITE = (
    "Rewrite this function so that the variable `total` is called `sum_of_items`:\n\n"
    "def add_all(items):\n"
    "    total = 0\n"
    "    for item in items:\n"
    "        total = total + item\n"
    "    print('running total', total)\n"
    "    return total\n"
)


def chat(user: str) -> str:
    return f"{SYSTEM}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def greedy(k: int | None = None, n: int = N_TOKENS) -> GenerateOptions:
    return GenerateOptions(num_predict=n, temperature=0, draft_num_predict=k)


def _engine(**kw: object) -> Engine:
    cfg = EngineConfig(smollm2_q8_0(), n_ctx=2048, n_threads=0, **kw)  # type: ignore[arg-type]
    return Engine(cfg)


@pytest.fixture(scope="module")
def plain() -> Iterator[Engine]:
    with _engine() as e:
        yield e


@pytest.fixture(scope="module")
def prompts(plain: Engine) -> list[list[int]]:
    return [plain.tokenize(chat(q)) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(plain: Engine, prompts: list[list[int]]) -> list[GenerateResult]:
    results = [plain.generate(p, greedy()) for p in prompts]
    assert any(r.done_reason == "stop" for r in results), "one prompt should end by itself"
    assert all(len(r.tokens) >= 20 for r in results)
    return results


def _draft_engine(adaptive: bool) -> Engine:
    return _engine(
        draft_kind="draft_model",
        draft_path=smollm2_q4_1(),
        draft_num_predict=8,
        adaptive=adaptive,
    )


@pytest.fixture(scope="module")
def fixed_k() -> Iterator[Engine]:
    with _draft_engine(adaptive=False) as e:
        yield e


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_draft_model_greedy_identity(
    fixed_k: Engine, prompts: list[list[int]], reference: list[GenerateResult], k: int
) -> None:
    for prompt, expected in zip(prompts, reference, strict=True):
        got = fixed_k.generate(prompt, greedy(k))
        assert got.tokens == expected.tokens
        assert got.done_reason == expected.done_reason
        assert got.drafter == "draft_model"
        assert got.draft_count > 0
        assert got.acceptance > 0.5  # the Q4_1 draft agrees with its Q8_0 requantisation
        assert not any(fixed_k.model.is_eog(t) for t in got.tokens)


def test_draft_model_adaptive_identity_and_cache_reuse(
    plain: Engine, prompts: list[list[int]], reference: list[GenerateResult]
) -> None:
    with _draft_engine(adaptive=True) as adaptive:
        for _ in range(2):  # the second pass reuses the prompt cache
            for prompt, expected in zip(prompts, reference, strict=True):
                got = adaptive.generate(prompt, greedy())
                assert got.tokens == expected.tokens
        # the same prompt twice in a row: only its last token is evaluated again
        again = adaptive.generate(prompts[2], greedy())
        assert again.prompt_eval_count == 1 and again.tokens == reference[2].tokens
        # a follow-up turn after an answer: both engines see the same request sequence
        follow = (
            prompts[0]
            + reference[0].tokens
            + adaptive.tokenize(
                "<|im_end|>\n<|im_start|>user\nNow make it shorter.<|im_end|>\n"
                "<|im_start|>assistant\n",
                add_special=False,
            )
        )
        plain.generate(prompts[0], greedy())
        expected = plain.generate(follow, greedy(n=120))
        adaptive.generate(prompts[0], greedy())
        got = adaptive.generate(follow, greedy(n=120))
        assert got.prompt_eval_count < 40
        assert got.tokens == expected.tokens


def test_ngram_identity_and_drafting_on_a_rewrite(
    plain: Engine, prompts: list[list[int]], reference: list[GenerateResult]
) -> None:
    with _engine(draft_kind="ngram", draft_num_predict=8, adaptive=False) as ngram:
        for prompt, expected in zip(prompts, reference, strict=True):
            assert ngram.generate(prompt, greedy()).tokens == expected.tokens
        rewrite = plain.tokenize(chat(REWRITE))
        expected = plain.generate(rewrite, greedy(n=120))
        drafted = []
        got = ngram.generate(rewrite, greedy(n=120), on_token=lambda ev: drafted.append(ev.drafted))
        assert got.tokens == expected.tokens
        assert got.drafter == "ngram"
        # SmolLM2 answers with a short rewrite that repeats the function's first line: 11-16
        # accepted drafts measured here; with no match nothing would be accepted.
        assert got.draft_accepted_count >= 8
        assert sum(drafted) == got.draft_accepted_count


def test_sampled_speculation_accepts_most_drafts(fixed_k: Engine, prompts: list[list[int]]) -> None:
    opts = GenerateOptions(
        num_predict=80,
        temperature=0.8,
        top_k=40,
        top_p=0.95,
        min_p=0.05,
        seed=3,
        draft_num_predict=4,
        sampling_verify="rejection",
    )
    got = fixed_k.generate(prompts[0], opts)
    assert len(got.tokens) == 80
    assert got.acceptance > 0.7  # rejection sampling with the draft's own q
    compare = fixed_k.generate(prompts[0], dataclasses.replace(opts, sampling_verify="compare"))
    assert compare.acceptance < got.acceptance
    coupled = fixed_k.generate(prompts[0], dataclasses.replace(opts, sampling_verify="coupled"))
    assert compare.acceptance < coupled.acceptance  # the draft draws with the target's noise


def test_a_seeded_request_repeats_and_matches_the_target_alone(
    plain: Engine, fixed_k: Engine, prompts: list[list[int]]
) -> None:
    """The same seed gives the same text every time with an adaptive draft model (whose draft
    lengths follow measured timings), at any fixed K, and the text the target alone gives for
    that seed."""
    opts = GenerateOptions(num_predict=60, temperature=0.8, seed=42)
    with _draft_engine(adaptive=True) as adaptive:
        for prompt in prompts[:2]:
            expected = plain.generate(prompt, opts)
            runs = [adaptive.generate(prompt, opts) for _ in range(2)]
            fixed = [
                fixed_k.generate(prompt, dataclasses.replace(opts, draft_num_predict=k))
                for k in (2, 8)
            ]
            assert [r.tokens for r in runs + fixed] == [expected.tokens] * 4
            assert all(r.draft_accepted_count > 0 for r in fixed)


SCHEMA = {
    "type": "object",
    "properties": {
        "parts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "job": {"type": "string"}},
                "required": ["name", "job"],
            },
        }
    },
    "required": ["parts"],
}


def test_drafting_under_a_grammar_is_lossless(
    plain: Engine, fixed_k: Engine, prompts: list[list[int]]
) -> None:
    """Drafts are checked against the grammar in the state the drafts before them lead to, and
    every verification row is judged in its own state: the output is the target's alone."""
    from modelhub.engine.gbnf import format_grammar

    opts = GenerateOptions(num_predict=120, temperature=0, grammar=format_grammar(SCHEMA))
    expected = plain.generate(prompts[1], opts)
    assert expected.text.startswith("{") and expected.drafter is None
    got = fixed_k.generate(prompts[1], dataclasses.replace(opts, draft_num_predict=4))
    assert got.tokens == expected.tokens
    assert got.drafter == "draft_model" and got.draft_accepted_count > 0
    predicted = plain.generate(prompts[1], opts, prediction=expected.tokens)
    assert predicted.tokens == expected.tokens and predicted.acceptance > 0.9
    # a prediction the grammar forbids: its drafts are cut before verification, output unchanged
    off = plain.tokenize("Sure! Here is the answer in prose. " * 4, add_special=False)
    wrong = plain.generate(prompts[1], opts, prediction=off)
    assert wrong.tokens == expected.tokens
    sampled = fixed_k.generate(
        prompts[1], dataclasses.replace(opts, temperature=0.8, seed=5, num_predict=200)
    )
    assert sampled.draft_count > 0
    if sampled.done_reason == "stop":
        import json

        assert isinstance(json.loads(sampled.text)["parts"], list)


def test_prediction_identity(
    plain: Engine, prompts: list[list[int]], reference: list[GenerateResult]
) -> None:
    """OpenAI-style predicted output: the engine's own earlier answer, and an edit's source."""
    for prompt, expected in zip(prompts, reference, strict=True):
        got = plain.generate(prompt, greedy(8), prediction=expected.tokens)
        assert got.tokens == expected.tokens
        assert got.drafter == "prediction" and got.acceptance > 0.95
    rewrite = plain.tokenize(chat(REWRITE))
    expected = plain.generate(rewrite, greedy(n=120))
    source = plain.tokenize(REWRITE.split("\n\n", 1)[1], add_special=False)
    got = plain.generate(rewrite, greedy(8, n=120), prediction=source)
    assert got.tokens == expected.tokens
    assert got.draft_accepted_count > 0  # the 135M model copies only parts of the source
