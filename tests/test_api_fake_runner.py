"""Routes, the scheduler and the client in-process over fake runners (``tests/fakes``): what
reaches the runner from each endpoint, and errors that keep their class from the runner to the
Python client, streamed or not, 5xx included. No runner process, no llama.cpp."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from modelhub.errors import (
    DraftError,
    InsufficientMemoryError,
    ModelhubError,
    NotFoundError,
    RequestCancelledError,
    RunnerCrashedError,
    ServerBusyError,
)
from tests.fakes.daemon import FakeDaemon

DOCS = Path(__file__).resolve().parents[1] / "docs" / "api.md"

# Each of Ollama's documented options (docs/api.md, "Options"): a value that is not its
# default, and where the runner receives it: ("load", EngineConfig field) or ("generate",
# option name), with the value it arrives as.
OLLAMA_OPTIONS: dict[str, tuple[Any, str, str, Any]] = {
    "num_ctx": (128, "load", "n_ctx", 128),
    "num_batch": (64, "load", "n_batch", 64),
    "num_thread": (1, "load", "n_threads", 1),
    "draft_min": (2, "load", "draft_min", 2),
    "draft_p_min": (0.5, "load", "draft_p_min", 0.5),
    "draft_adaptive": (False, "load", "adaptive", False),
    "num_predict": (7, "generate", "num_predict", 7),
    "temperature": (0.25, "generate", "temperature", 0.25),
    "top_k": (7, "generate", "top_k", 7),
    "top_p": (0.75, "generate", "top_p", 0.75),
    "min_p": (0.05, "generate", "min_p", 0.05),
    "typical_p": (0.9, "generate", "typical_p", 0.9),
    "repeat_penalty": (1.1, "generate", "repeat_penalty", 1.1),
    "repeat_last_n": (32, "generate", "repeat_last_n", 32),
    "presence_penalty": (0.5, "generate", "presence_penalty", 0.5),
    "frequency_penalty": (0.25, "generate", "frequency_penalty", 0.25),
    "seed": (42, "generate", "seed", 42),
    "stop": (["END"], "generate", "stop", ["END"]),
    "num_keep": (5, "generate", "num_keep", 5),
    "draft_num_predict": (3, "generate", "draft_num_predict", 3),
}


def documented_options() -> set[str]:
    """The option names of docs/api.md's "Options" paragraph."""
    text = DOCS.read_text(encoding="utf-8")
    paragraph = text.split("Ollama's `options`:", 1)[1].split("A value of the wrong type", 1)[0]
    return set(re.findall(r"`([a-z_]+)`", paragraph))


def received(fake: FakeDaemon) -> tuple[dict[str, Any], dict[str, Any]]:
    """The last load config and the last generate's options (with grammar and prediction)."""
    load = fake.runners.loads()[-1].config
    generate = fake.runners.generates()[-1]
    return dict(load), {**generate.options.given(), "prediction": generate.prediction}


def test_every_documented_option_covered() -> None:
    assert documented_options() == set(OLLAMA_OPTIONS)


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_every_ollama_option_reaches_the_runner(fake: FakeDaemon, path: str) -> None:
    fake.add_model()
    options = {name: sent for name, (sent, *_) in OLLAMA_OPTIONS.items()}
    body: dict[str, Any] = {"model": "tiny", "stream": False, "options": options}
    if path == "/api/chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    r = fake.http.post(path, json=body)
    assert r.status_code == 200, r.text
    load, generate = received(fake)
    for name, (_, where, key, value) in OLLAMA_OPTIONS.items():
        got = load.get(key) if where == "load" else generate.get(key)
        assert got == value, (name, got)


OPENAI_FIELDS = {
    "temperature": 0.25,
    "top_p": 0.75,
    "max_tokens": 7,
    "stop": "END",
    "seed": 42,
    "frequency_penalty": 0.25,
    "presence_penalty": 0.5,
    "top_k": 7,
    "draft_num_predict": 3,
}
OPENAI_RECEIVED = {
    "temperature": 0.25,
    "top_p": 0.75,
    "num_predict": 7,
    "stop": ["END"],
    "seed": 42,
    "frequency_penalty": 0.25,
    "presence_penalty": 0.5,
    "top_k": 7,
    "draft_num_predict": 3,
}


@pytest.mark.parametrize(
    ("path", "extra", "logprobs"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2},
            2,
        ),
        ("/v1/completions", {"prompt": "hi", "logprobs": 2}, 2),
    ],
)
def test_every_openai_field_reaches_the_runner(
    fake: FakeDaemon, path: str, extra: dict[str, Any], logprobs: int
) -> None:
    fake.add_model()
    r = fake.http.post(path, json={"model": "tiny", **OPENAI_FIELDS, **extra})
    assert r.status_code == 200, r.text
    _, generate = received(fake)
    assert {k: generate.get(k) for k in OPENAI_RECEIVED} == OPENAI_RECEIVED
    assert generate["top_logprobs"] == logprobs
    predicted = {"prediction": {"type": "content", "content": "Hello there"}}
    if path == "/v1/chat/completions":
        r = fake.http.post(path, json={"model": "tiny", **extra, **predicted})
        assert r.status_code == 200, r.text
        assert received(fake)[1]["prediction"] == "Hello there"


def test_messages_and_responses_options_reach_the_runner(fake: FakeDaemon) -> None:
    fake.add_model()
    r = fake.http.post(
        "/v1/messages",
        json={
            "model": "tiny",
            "max_tokens": 7,
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.25,
            "top_p": 0.75,
            "top_k": 7,
            "stop_sequences": ["END"],
        },
    )
    assert r.status_code == 200, r.text
    got = received(fake)[1]
    assert {k: got.get(k) for k in ("num_predict", "temperature", "top_p", "top_k", "stop")} == {
        "num_predict": 7,
        "temperature": 0.25,
        "top_p": 0.75,
        "top_k": 7,
        "stop": ["END"],
    }
    r = fake.http.post(
        "/v1/responses",
        json={
            "model": "tiny",
            "input": "hi",
            "temperature": 0.25,
            "top_p": 0.75,
            "max_output_tokens": 7,
            "store": False,
            "draft": "off",
            "draft_num_predict": 3,
        },
    )
    assert r.status_code == 200, r.text
    got = received(fake)[1]
    assert (got.get("draft"), got.get("draft_num_predict")) == ("off", 3)
    assert {k: got.get(k) for k in ("num_predict", "temperature", "top_p")} == {
        "num_predict": 7,
        "temperature": 0.25,
        "top_p": 0.75,
    }


# ---- errors keep their class ----------------------------------------------------------------

ERRORS = [
    DraftError("the draft does not fit"),
    NotFoundError("no such drafter"),
    RunnerCrashedError("model runner for tiny stopped unexpectedly (killed by SIGKILL)"),
    InsufficientMemoryError("not memory enough"),
    ServerBusyError("busy"),
]


def generate_body(stream: bool) -> dict[str, Any]:
    return {"model": "tiny", "prompt": "hi", "stream": stream}


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_a_runner_error_reaches_the_client_as_its_class(
    fake: FakeDaemon, error: ModelhubError
) -> None:
    """Before the answer started (an HTTP status) and mid-stream (after tokens): the same
    class, the same message, 5xx included."""
    fake.add_model()
    fake.script.error, fake.script.error_after = error, 0
    with pytest.raises(type(error)) as before:
        fake.client.request_json("POST", "/api/generate", generate_body(False))
    assert type(before.value) is type(error) and before.value.message == error.message
    fake.script.error_after = 1  # a token first: the stream has started with status 200
    got: list[dict[str, Any]] = []
    with pytest.raises(type(error)) as during:
        for item in fake.client.stream("POST", "/api/generate", generate_body(True)):
            got.append(item)
    assert type(during.value) is type(error) and during.value.message == error.message
    assert [g["response"] for g in got] == ["Hello"]


def test_a_load_error_keeps_its_class(fake: FakeDaemon) -> None:
    fake.add_model()
    fake.script.load_error = DraftError("the drafter's vocabulary differs")
    with pytest.raises(DraftError, match="vocabulary differs"):
        fake.client.request_json("POST", "/api/generate", generate_body(False))
    assert fake.state.scheduler.runners == {}  # nothing kept loaded


def test_a_crash_mid_stream_fails_that_request_and_a_fresh_runner_serves_the_next(
    fake: FakeDaemon,
) -> None:
    fake.add_model()
    fake.script.crash_after = 1
    with pytest.raises(RunnerCrashedError, match="stopped unexpectedly"):
        list(fake.client.stream("POST", "/api/generate", generate_body(True)))
    fake.script.crash_after = None
    answer = fake.client.request_json("POST", "/api/generate", generate_body(False))
    assert answer["response"] == "Hello!" and answer["draft_accepted_count"] == 1
    first, second = fake.runners.made
    assert first.dead and not second.dead


def test_a_cancelled_request_is_a_499_of_its_class(fake: FakeDaemon) -> None:
    fake.add_model()
    fake.script.error = RequestCancelledError("request canceled")
    r = fake.http.post("/api/generate", json=generate_body(False))
    assert r.status_code == 499
    assert r.headers["X-Modelhub-Error-Class"] == "RequestCancelledError"
    assert r.json() == {"error": "request canceled"}  # Ollama's body, unchanged


def test_responses_usage_counts_the_drafts(fake: FakeDaemon) -> None:
    """/v1/responses reports what drafting checked and kept, as /v1/messages does."""
    fake.add_model()
    fake.script.tokens = [("a", False), ("b", True), ("c", True), ("d", False)]
    r = fake.http.post("/v1/responses", json={"model": "tiny", "input": "hi", "store": False})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert (usage["output_tokens"], usage["draft_count"], usage["draft_accepted_count"]) == (
        4,
        2,
        2,
    )


def test_an_unknown_option_is_ignored_with_a_warning_in_the_log(
    fake: FakeDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    """As Ollama: a request's option that does not exist is not an error, the log names it,
    and it reaches the runner under no name."""
    fake.add_model()
    body = {"model": "tiny", "prompt": "hi", "stream": False}
    body["options"] = {"temprature": 0.2, "temperature": 0.5}
    with caplog.at_level(logging.WARNING, logger="modelhub.planning"):
        r = fake.http.post("/api/generate", json=body)
    assert r.status_code == 200, r.text
    assert "invalid option provided: 'temprature'" in caplog.text
    _, options = received(fake)
    assert options["temperature"] == 0.5 and "temprature" not in options
