"""Plain generation on a real model (SmolLM2-135M Q8_0): the loop without drafting."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devtools.realmodels import smollm2_q8_0
from modelhub.engine.gbnf import format_grammar
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions, TokenEvent
from modelhub.errors import InputError

pytestmark = pytest.mark.slow

SYSTEM = (
    "<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)


def chat(user: str) -> str:
    return f"{SYSTEM}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def target() -> Path:
    return smollm2_q8_0()


@pytest.fixture(scope="module")
def engine(target: Path) -> Iterator[Engine]:
    with Engine(EngineConfig(target, n_ctx=1024, n_threads=0)) as e:
        yield e


def greedy(n: int = 48, **kw: object) -> GenerateOptions:
    return GenerateOptions(num_predict=n, temperature=0, **kw)  # type: ignore[arg-type]


def test_greedy_matches_llama_cpp_python(engine: Engine, target: Path) -> None:
    """An independent oracle: llama-cpp-python's own generation on the same file."""
    from llama_cpp import Llama

    from modelhub.engine.llama import KV_TYPES

    prompt = engine.tokenize(chat("Name three colours of the rainbow."))
    ours = engine.generate(prompt, greedy(40))
    type_k, type_v = KV_TYPES[engine.kv_cache_type]
    llm = Llama(
        str(target),
        n_ctx=1024,
        n_threads=0,
        flash_attn=True,
        type_k=type_k,
        type_v=type_v,
        verbose=False,
    )
    try:
        theirs = llm.create_completion(prompt, max_tokens=40, temperature=0.0, top_k=1)
    finally:
        llm.close()
    assert ours.text == theirs["choices"][0]["text"]  # type: ignore[index]


def test_prompt_cache_reuses_the_shared_prefix(target: Path) -> None:
    # Prefill in chunks of 32: on this CPU build, batches of up to ~32 rows give bitwise the
    # same logits as one-token decodes (larger batches take another kernel), so a warm cache
    # and a cold prefill must then agree exactly.
    with Engine(EngineConfig(target, n_ctx=1024, n_batch=32, n_threads=0)) as engine:
        prompt = engine.tokenize(chat("What is the capital of France?"))
        first = engine.generate(prompt, greedy(24))
        again = engine.generate(prompt, greedy(24))
        assert again.tokens == first.tokens
        assert again.prompt_eval_count == 1  # only the last prompt token is evaluated again
        follow = (
            prompt
            + first.tokens
            + engine.tokenize(
                "<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n",
                add_special=False,
            )
        )
        cont = engine.generate(follow, greedy(24))
        assert cont.prompt_eval_count <= len(follow) - len(prompt) - len(first.tokens) + 1
        changed = engine.generate(engine.tokenize(chat("What is the capital of Spain?")), greedy(8))
        assert changed.prompt_eval_count < len(prompt)  # the system prompt is still shared
    with Engine(EngineConfig(target, n_ctx=1024, n_batch=32, n_threads=0)) as cold:
        assert cold.generate(follow, greedy(24)).tokens == cont.tokens


def test_stop_string_spanning_tokens_and_streaming(engine: Engine) -> None:
    prompt = engine.tokenize(chat("Write two sentences about cats."))
    full = engine.generate(prompt, greedy(60))
    stop = full.text[25:31]
    assert stop not in full.text[:25]
    events: list[TokenEvent] = []
    cut = engine.generate(prompt, greedy(60, stop=[stop]), on_token=events.append)
    assert cut.done_reason == "stop"
    assert cut.text == full.text[:25] + full.text[25:31].split(stop)[0]
    assert "".join(ev.text for ev in events) == cut.text
    assert all(ev.token >= 0 for ev in events)


def test_num_predict_and_eog(engine: Engine) -> None:
    prompt = engine.tokenize(chat("Reply with the single word: yes"))
    short = engine.generate(prompt, greedy(3))
    assert len(short.tokens) == 3 and short.done_reason == "length"
    done = engine.generate(prompt, greedy(100))
    assert done.done_reason == "stop" and len(done.tokens) < 100
    assert not any(engine.model.is_eog(t) for t in done.tokens)
    assert engine.generate(prompt, greedy(0)).tokens == []


def test_full_context_ends_with_length(target: Path) -> None:
    with Engine(EngineConfig(target, n_ctx=64, n_threads=0)) as small:
        prompt = small.tokenize(chat("Write a long story about a dragon and a knight."))
        r = small.generate(prompt, greedy(-1, shift=False))  # shifting: test_engine_shift.py
        assert r.done_reason == "length"
        assert len(prompt) + len(r.tokens) == small.n_ctx + 1
        again = small.generate(prompt, greedy(-1, shift=False))
        assert again.tokens == r.tokens
        with pytest.raises(InputError, match="context holds"):
            small.generate(prompt * 3, greedy())


def test_cancel_between_steps_keeps_the_cache_consistent(engine: Engine) -> None:
    prompt = engine.tokenize(chat("Tell me a story about a dragon."))
    reference = engine.generate(prompt, greedy(30)).tokens
    cancel = threading.Event()

    def on_token(ev: TokenEvent) -> None:
        if len(seen) == 6:
            cancel.set()
        seen.append(ev.token)

    seen: list[int] = []
    r = engine.generate(prompt, greedy(30), on_token=on_token, cancel=cancel)
    assert r.done_reason == "cancel" and r.tokens == reference[:7]
    assert engine.ctx.pos_max() == len(prompt) + 7 - 2
    pre = threading.Event()
    pre.set()
    assert engine.generate(prompt, greedy(30), cancel=pre).done_reason == "cancel"
    assert engine.generate(prompt, greedy(30)).tokens == reference


def test_seeded_sampling(engine: Engine) -> None:
    prompt = engine.tokenize(chat("Invent a name for a cat."))
    opts = GenerateOptions(num_predict=30, temperature=1.0, seed=123)
    a = engine.generate(prompt, opts)
    b = engine.generate(prompt, opts)
    c = engine.generate(prompt, GenerateOptions(num_predict=30, temperature=1.0, seed=124))
    assert a.tokens == b.tokens != c.tokens


def test_json_schema_grammar(engine: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "sure": {"type": "boolean"}},
        "required": ["colour", "sure"],
    }
    prompt = engine.tokenize(chat("What colour is the sky? Answer in prose, at length."))
    r = engine.generate(
        prompt,
        GenerateOptions(num_predict=60, temperature=0.7, seed=1, grammar=format_grammar(schema)),
    )
    value = json.loads(r.text)
    assert value["colour"] in ("red", "green", "blue") and isinstance(value["sure"], bool)
    any_json = engine.generate(prompt, greedy(200, grammar=format_grammar("json")))
    if any_json.done_reason == "stop":
        json.loads(any_json.text)
    assert any_json.text.lstrip()[:1] in ("{", "[", '"') or any_json.text.strip()[:1].isdigit()


def test_bad_requests_are_clear(engine: Engine) -> None:
    with pytest.raises(InputError, match="empty"):
        engine.generate([], greedy())
    with pytest.raises(InputError, match="outside the vocabulary"):
        engine.generate([1, 10**6], greedy())
    with pytest.raises(InputError, match="grammar"):
        engine.generate([1, 2], greedy(grammar="root ::= (("))
    with pytest.raises(InputError, match="top_p"):
        engine.generate([1, 2], GenerateOptions(top_p=3))
    with pytest.raises(InputError, match="format"):
        format_grammar("yaml")
    with pytest.raises(InputError, match="num_batch"):
        EngineConfig  # noqa: B018 - the config is validated when an engine is built
        Engine(EngineConfig(Path("x.gguf"), n_batch=4, draft_kind="ngram", draft_num_predict=8))


def test_embeddings_are_normalised_and_deterministic(engine: Engine) -> None:
    a, b, c = engine.embed(["a cat sat on the mat", "a cat sat on the mat", "quantum physics"])
    assert len(a) == engine.model.n_embd
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    assert a == b and a != c
    # generation still works afterwards (its own context)
    assert engine.generate(engine.tokenize(chat("Hi")), greedy(3)).tokens
