"""Continuous batching in the engine: several requests decoded together, each one's greedy output
token-identical to the same request served alone (plain, n-gram and draft-model drafting), at
most ``n_parallel`` running at once, cancellation of one leaving the others alone, and a chat's
next turn returning to the slot that holds its history."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from devtools.realmodels import smollm2_q4_1, smollm2_q8_0
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions, GenerateResult
from tests.fixtures.concurrency import run_concurrently
from tests.fixtures.prompts import QUESTIONS

pytestmark = pytest.mark.slow

N_TOKENS = 48
ASSISTANT = "<|im_start|>assistant\n"


def greedy(n: int = N_TOKENS) -> GenerateOptions:
    return GenerateOptions(temperature=0.0, num_predict=n)


def _engine(**kw: object) -> Engine:
    cfg = EngineConfig(smollm2_q8_0(), n_ctx=1024, n_threads=0, n_parallel=4, **kw)  # type: ignore[arg-type]
    return Engine(cfg)


def _prompts(engine: Engine) -> list[list[int]]:
    return [
        engine.tokenize(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module", params=["plain", "ngram", "draft_model"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    kw: dict[str, object] = {}
    if request.param == "ngram":
        kw = {"draft_kind": "ngram", "draft_num_predict": 8}
    elif request.param == "draft_model":
        kw = {"draft_kind": "draft_model", "draft_path": smollm2_q4_1(), "draft_num_predict": 4}
    with _engine(**kw) as e:
        assert e.n_parallel == 4 and len(e.slots) == 4
        yield e


def test_eight_at_once_equal_each_alone(engine: Engine) -> None:
    prompts = _prompts(engine)
    alone = [engine.generate(p, greedy()) for p in prompts]
    together, running, waiting = run_concurrently(engine, prompts, greedy())
    for a, b in zip(alone, together, strict=True):
        assert b.tokens == a.tokens and b.done_reason == a.done_reason
    assert running == 4 and waiting >= 1  # four ran while the others waited
    if engine.drafter is not None:
        assert sum(r.draft_count for r in together) > 0
        assert sum(r.draft_accepted_count for r in together) > 0
    assert engine.load == (0, 0)


def test_cancelling_one_leaves_the_others_alone(engine: Engine) -> None:
    prompts = _prompts(engine)[:4]
    alone = [engine.generate(p, greedy()) for p in prompts]
    cancel = threading.Event()
    results: list[GenerateResult | None] = [None] * 4
    seen: list[object] = []

    def cancel_after_five(event: object) -> None:
        seen.append(event)
        if len(seen) == 5:
            cancel.set()

    def run(i: int) -> None:
        if i == 1:
            results[i] = engine.generate(
                prompts[i], greedy(), on_token=cancel_after_five, cancel=cancel
            )
        else:
            results[i] = engine.generate(prompts[i], greedy())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [r for r in results if r is not None]
    assert len(got) == 4
    assert got[1].done_reason == "cancel" and len(got[1].tokens) < N_TOKENS
    assert got[1].tokens == alone[1].tokens[: len(got[1].tokens)]
    for i in (0, 2, 3):
        assert got[i].tokens == alone[i].tokens


def test_a_chat_returns_to_its_slot() -> None:
    with _engine() as e:
        prompts = _prompts(e)
        first = e.generate(prompts[0], greedy(16))
        # three other conversations take the other slots meanwhile
        run_concurrently(e, prompts[1:4], greedy(8))
        follow = (
            prompts[0]
            + first.tokens
            + e.tokenize(
                "<|im_end|>\n<|im_start|>user\nAnd another one.<|im_end|>\n<|im_start|>assistant\n",
                add_special=False,
            )
        )
        again = e.generate(follow, greedy(8))
        assert again.prompt_eval_count < 20  # only the new turn was evaluated
        assert again.prompt_eval_count < len(follow) - len(prompts[0])


def _row_differences(kv_cache_type: str) -> list[float]:
    """Largest logit difference between a one-row decode and the same token decoded first in
    batches of 2 and 64 rows, at 300 and 600 cached tokens."""
    from modelhub.engine.context import LlamaContext
    from modelhub.engine.llama import LlamaModel
    from modelhub.engine.native import default_threads

    model = LlamaModel(smollm2_q8_0())
    threads = default_threads()
    ctx = LlamaContext(
        model, n_ctx=1024, n_batch=512, n_threads=threads, kv_cache_type=kv_cache_type
    )
    try:
        text = model.tokenize("The quick brown fox jumps over the lazy dog. " * 80)
        out = []
        for n in (300, 600):
            ctx.clear()
            ctx.decode_chunked(text[: n - 1], 0, logits_last=False)
            ctx.decode([text[n - 1]], n - 1, "last")
            one = ctx.last_logits().copy()
            for rows in (2, 64):
                ctx.truncate(n - 1)
                ctx.decode(text[n - 1 : n - 1 + rows], n - 1, "all")
                out.append(float(abs(ctx.logits()[0] - one).max()))
        return out
    finally:
        ctx.close()
        model.close()


def test_the_default_kv_cache_keeps_every_batch_shape_bit_identical() -> None:
    """Past 256 cached tokens llama.cpp's CPU attention takes other paths for one row (split
    KV) and for 64+ rows (tiled) when keys and values are F16; the default KV cache type (Q8_0
    keys) keeps one kernel, so drafting and batching stay exact on long contexts."""
    assert max(_row_differences(EngineConfig(smollm2_q8_0()).kv_cache_type)) == 0.0
    assert max(_row_differences("f16")) > 0.0  # why F16 keys are not the default


def test_a_long_answer_under_load_equals_it_alone() -> None:
    """400 tokens (well past 256 cached) with n-gram drafting, among three other requests."""
    with _engine(draft_kind="ngram", draft_num_predict=8) as e:
        prompts = _prompts(e)
        story = e.tokenize(
            "<|im_start|>user\nWrite a very long story about a lighthouse keeper.<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        with _engine() as plain:
            alone = plain.generate(story, greedy(400))
        got, running, _ = run_concurrently(e, [story, *prompts[:3]], greedy(400))
        assert running == 4
        assert got[0].tokens == alone.tokens and len(alone.tokens) > 300
        assert got[0].draft_count > 0


def test_context_shifts_in_one_sequence_leave_the_others_exact() -> None:
    """A shift re-rotates (and with Q8_0 keys re-quantises) the cache; other sequences in the
    same context must still give their output alone, and so must the shifted one."""
    cfg = EngineConfig(smollm2_q8_0(), n_ctx=128, n_threads=0, n_parallel=2)
    with Engine(cfg) as e:
        topics = ["a dragon who loves books", "a city under the sea", "a robot chef", "a comet"]
        prompts = [
            e.tokenize(f"<|im_start|>user\nWrite a long story about {t}.<|im_end|>\n{ASSISTANT}")
            for t in topics
        ]
        opts = greedy(220)
        alone = [e.generate(p, opts) for p in prompts]
        together, running, _ = run_concurrently(e, prompts, opts)
    assert running == 2
    for a, b in zip(alone, together, strict=True):
        assert b.tokens == a.tokens
    assert sum(len(p) + len(a.tokens) > 200 for p, a in zip(prompts, alone, strict=True)) >= 2
