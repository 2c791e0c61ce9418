"""Long conversations through a real daemon: chat truncation (``truncate``), context shift
(``shift``, ``num_keep``) and the default context (``MODELHUB_CONTEXT_LENGTH``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q4_1
from modelhub.server.truncation import cut_points, prompt_limit

CHAT_CTX = 512  # the daemon's default context: the chat model sets none
GEN_CTX = 128
SYSTEM = "You are a concise assistant."
GREEDY = {"temperature": 0, "seed": 7}
PAIRS = 40  # turns of about 40 tokens: over three contexts


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("context")
    env = {"MODELHUB_CONTEXT_LENGTH": str(CHAT_CTX), "MODELHUB_NUM_PARALLEL": "1"}
    d = start_daemon(base / "models", base / "daemon.log", env)
    mf = base / "Modelfile"
    for name, text in (
        ("chat", f"FROM {smollm2_q4_1()}\n"),
        ("gen", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx {GEN_CTX}\n"),
        ("gen-ngram", "FROM gen\nDRAFT ngram\nPARAMETER draft_num_predict 8\n"),
    ):
        mf.write_text(text)
        d.create(name, mf)
    yield d
    d.stop()


def conversation(pairs: int) -> list[dict[str, str]]:
    """A system prompt, then ``pairs`` question/answer turns (the first names the user)."""
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(pairs):
        question = f"Tell me fact number {i} about the garden."
        if i == 0:
            question = "My name is Zorblax. " + question
        messages.append({"role": "user", "content": question})
        messages.append(
            {
                "role": "assistant",
                "content": f"Fact {i}: the old gardener plants {i + 3} rows of tulips, "
                "roses and sunflowers beside the stone wall every spring morning.",
            }
        )
    return messages


def chat(d: Daemon, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    payload = {"model": "chat", "messages": messages, "stream": False, **body}
    with d.client() as c:
        r = c.post("/api/chat", json=payload)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.slow
def test_a_conversation_three_contexts_long_is_cut_and_cached(served: Daemon) -> None:
    messages = [*conversation(PAIRS), {"role": "user", "content": "What is fact 23 about?"}]
    seen = chat(served, messages, _debug_render_only=True)["debug_info"]["rendered_template"]
    assert SYSTEM in seen and "What is fact 23 about?" in seen
    assert "Zorblax" not in seen and "Fact 0:" not in seen  # the oldest turns were dropped

    with served.client() as c:  # /v1 reports every prompt token the model was given
        first = c.post(
            "/v1/chat/completions",
            json={"model": "chat", "messages": messages, "max_tokens": 12, **GREEDY},
        ).json()
        ps = c.get("/api/ps").json()["models"]
    assert needed_tokens(served, messages) > 3 * CHAT_CTX
    assert 0 < first["usage"]["prompt_tokens"] <= prompt_limit(CHAT_CTX)
    answer = first["choices"][0]["message"]["content"]
    assert answer
    assert next(m for m in ps if m["name"] == "chat:latest")["context_length"] == CHAT_CTX

    # The next turn cuts in the same place: only the new turn is evaluated.
    follow = [*messages, {"role": "assistant", "content": answer}]
    follow.append({"role": "user", "content": "Thanks."})
    second = chat(served, follow, options={**GREEDY, "num_predict": 8})
    assert second["message"]["content"]
    assert second["prompt_eval_count"] < 60, second


def needed_tokens(d: Daemon, messages: list[dict[str, Any]]) -> int:
    """The tokens the whole conversation needs, from the truncate=false refusal."""
    with d.client() as c:
        r = c.post("/api/chat", json={"model": "chat", "messages": messages, "truncate": False})
    assert r.status_code == 400, r.text
    found = re.search(r"the conversation needs (\d+) tokens", r.json()["error"])
    assert found is not None, r.text
    return int(found.group(1))


@pytest.mark.slow
def test_truncate_false_refuses_a_conversation_that_does_not_fit(served: Daemon) -> None:
    with served.client() as c:
        r = c.post(
            "/api/chat",
            json={"model": "chat", "messages": conversation(PAIRS), "truncate": False},
        )
    assert r.status_code == 400
    error = r.json()["error"]
    assert "the conversation needs" in error and f"context holds {CHAT_CTX}" in error
    assert "truncate" in error


@pytest.mark.slow
def test_a_last_message_longer_than_the_context_is_refused(served: Daemon) -> None:
    long = "Please remember all of these words: " + "apple banana cherry " * 250
    for path, body in (
        ("/api/chat", {"stream": False}),
        ("/v1/chat/completions", {}),
    ):
        messages = [*conversation(2), {"role": "user", "content": long}]
        with served.client() as c:
            r = c.post(path, json={"model": "chat", "messages": messages, **body})
        assert r.status_code == 400, r.text
        text = r.text
        assert "the last message alone needs" in text and f"holds {CHAT_CTX}" in text, text


def generate(d: Daemon, model: str, **body: Any) -> dict[str, Any]:
    payload = {"model": model, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "raw": True, "stream": False}
    with d.client() as c:
        r = c.post("/api/generate", json={**payload, **body})
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.slow
def test_generation_shifts_past_the_context_with_and_without_a_draft(served: Daemon) -> None:
    options = {**GREEDY, "num_predict": 2 * GEN_CTX}
    plain = generate(served, "gen", options=options)
    assert plain["done_reason"] == "length" and plain["eval_count"] == 2 * GEN_CTX
    again = generate(served, "gen", options=options)  # after a shift the slot's cache is exact
    drafted = generate(served, "gen-ngram", options=options)
    assert again["response"] == plain["response"] == drafted["response"]
    assert drafted["eval_count"] == 2 * GEN_CTX and drafted["draft_count"] > 0
    assert "60, 61, 62" in plain["response"]  # still counting, long past the context


@pytest.mark.slow
def test_shift_false_stops_at_the_context(served: Daemon) -> None:
    out = generate(served, "gen", shift=False, options={**GREEDY, "num_predict": 2 * GEN_CTX})
    assert out["done_reason"] == "length"
    assert GEN_CTX // 2 < out["eval_count"] < GEN_CTX  # the prompt and the answer fill it


def test_a_bad_context_length_stops_the_daemon(tmp_path: Path) -> None:
    env = {"MODELHUB_CONTEXT_LENGTH": "8k"}
    with pytest.raises(RuntimeError, match="MODELHUB_CONTEXT_LENGTH='8k'"):
        start_daemon(tmp_path / "models", tmp_path / "daemon.log", env)


def test_cut_points_stay_put_as_a_conversation_grows() -> None:
    messages = conversation(PAIRS)
    sizes = [40 if m["role"] == "assistant" else 12 for m in messages]
    cuts = cut_points(messages, sizes, step=100, longest=10**6)
    assert all(messages[c]["role"] == "user" for c in cuts[:-1])  # a kept part starts a turn
    assert cuts[-1] == len(messages) - 1  # the last message alone comes last
    grown = [*messages, {"role": "user", "content": "More?"}]
    later = cut_points(grown, [*sizes, 3], step=100, longest=10**6)
    assert later[: len(cuts) - 1] == cuts[:-1]  # appending a turn moves none of them
