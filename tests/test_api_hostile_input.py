"""Hostile input (issue 26, items 10-13 and 15): a keep_alive no clock holds, degenerate floats,
lone surrogates and NUL in every text field, grammars and schemas deep enough to overflow
llama.cpp's parser, unbounded stop lists. Each is a clear 400 or a valid answer, never a 500, a
crashed runner or a body that is not JSON.

The routes' validation runs in-process over fake runners (``app``, ``tests/fakes``); what a
real runner must survive (the sampler at the extremes the ranges allow, the deepest grammar and
the longest stop list the bounds let through, NUL and U+FFFD in its text) runs on a real daemon
with the tiny synthetic model (``served``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from modelhub.engine import protocol as p
from modelhub.modelfile.params import MAX_STOP_COUNT, MAX_STOP_LENGTH
from modelhub.modelfile.render import go_quote
from modelhub.server.grammar_limits import MAX_GRAMMAR_DEPTH, MAX_GRAMMAR_RULES, MAX_SCHEMA_DEPTH
from tests.fakes.daemon import FakeDaemon, fake_daemon
from tests.fixtures.synthetic import write_tiny_llama


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    """The app over fake runners with ``tiny`` created: for what the routes decide."""
    with fake_daemon(tmp_path_factory.mktemp("hostile-fake")) as d:
        d.add_model("tiny")
        yield d


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("hostile")
    d = start_daemon(base / "models", base / "daemon.log")
    mf = base / "tiny.Modelfile"
    mf.write_text(f"FROM {write_tiny_llama(base / 'tiny.gguf')}\n")
    d.create("tiny", mf)
    yield d
    d.stop()


def strict(text: str) -> Any:
    """JSON as RFC 8259 defines it: ``NaN`` and ``Infinity`` are not JSON."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in a response body: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def post(c: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    """``body`` as ASCII JSON: a lone surrogate goes out as the ``\\ud800`` escape clients
    write."""
    data = json.dumps(body).encode()
    return c.post(path, content=data, headers={"content-type": "application/json"})


def lines(r: httpx.Response) -> list[Any]:
    """Every NDJSON line or SSE ``data:`` event of a response, parsed strictly."""
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: "):
            line = line.removeprefix("data: ")
            if line == "[DONE]":
                continue
        elif line.startswith("event: ") or not line.strip():
            continue
        out.append(strict(line))
    return out


def error(r: httpx.Response) -> str:
    body = strict(r.text)["error"]
    return str(body["message"] if isinstance(body, dict) else body)


# ---- 10. keep_alive -----------------------------------------------------------------------------
@pytest.mark.parametrize("keep_alive", [1_000_000_000_000, "100000000h", 10**400, 1e300])
def test_a_keep_alive_no_clock_holds_is_forever_and_ps_answers(
    app: FakeDaemon, keep_alive: Any
) -> None:
    c = app.http
    raw = b'{"model": "tiny", "keep_alive": %s}' % json.dumps(keep_alive).encode()
    r = c.post("/api/generate", content=raw)
    assert r.status_code == 200, r.text
    ps = c.get("/api/ps")
    assert ps.status_code == 200, ps.text
    (model,) = strict(ps.text)["models"]
    expires = datetime.fromisoformat(model["expires_at"])
    years = (expires - datetime.now(expires.tzinfo)).days / 365.25
    assert 290 < years < 293, model["expires_at"]  # forever: the farthest deadline there is
    c.post("/api/generate", json={"model": "tiny", "keep_alive": 0}).raise_for_status()


def test_a_keep_alive_that_is_not_a_number_is_refused(app: FakeDaemon) -> None:
    for literal in (b"NaN", b"Infinity", b"1e400"):
        r = app.http.post(
            "/api/generate", content=b'{"model": "tiny", "keep_alive": ' + literal + b"}"
        )
        assert r.status_code == 400, r.text
        assert error(r).startswith("invalid JSON in request body: "), r.text


# ---- 11. degenerate floats ----------------------------------------------------------------------
DEGENERATE = [
    ({"temperature": 1e-320}, "option temperature must be a float32: 0, or between 1.18e-38"),
    (
        {"repeat_penalty": 5e-324, "frequency_penalty": 1e308},
        "option repeat_penalty must be between 1e-06 and 1000000",
    ),
    ({"frequency_penalty": 1e308}, "option frequency_penalty must be between -1000000 and"),
    ({"presence_penalty": -(10**400)}, 'option "presence_penalty" is out of range for a float32'),
]


@pytest.mark.parametrize(("options", "message"), DEGENERATE)
@pytest.mark.parametrize("stream", [False, True])
def test_degenerate_sampling_floats_are_refused_with_their_range(
    app: FakeDaemon, options: dict[str, Any], message: str, stream: bool
) -> None:
    body = {"model": "tiny", "prompt": "a b", "logprobs": True, "top_logprobs": 3}
    c = app.http
    r = c.post(
        "/api/generate",
        content=json.dumps({**body, "stream": stream, "options": options}).encode(),
    )
    assert r.status_code == 400, r.text
    assert error(r).startswith(message), r.text
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "a"}], "logprobs": True}
    top = {k: v for k, v in options.items() if k != "repeat_penalty"}
    if top:
        r = c.post("/v1/chat/completions", content=json.dumps({**chat, **top}).encode())
        assert r.status_code == 400, r.text
        assert "must be" in error(r) or "out of range" in error(r), r.text


EXTREMES = [
    {"temperature": 1.2e-38, "top_k": 0, "top_p": 1.0},
    {"temperature": 1e-30, "repeat_penalty": 1e-6, "repeat_last_n": -1},
    {"temperature": 0.7, "frequency_penalty": -1e6, "presence_penalty": 1e6, "repeat_penalty": 1e6},
    {"temperature": 3e38, "frequency_penalty": 1e6, "presence_penalty": -1e6},
]


OPENAI_SAMPLING = ("temperature", "top_p", "frequency_penalty", "presence_penalty")


@pytest.mark.parametrize("options", EXTREMES)
def test_the_extremes_the_ranges_allow_answer_valid_json(
    served: Daemon, options: dict[str, Any]
) -> None:
    """A real runner: the sampler's log-probabilities at these settings are the subject."""
    body = {
        "model": "tiny",
        "prompt": "a b a b a b",
        "logprobs": True,
        "top_logprobs": 5,
        "options": {**options, "num_predict": 12, "seed": 1},
    }
    with served.client() as c:
        whole = c.post("/api/generate", json={**body, "stream": False})
        assert whole.status_code == 200, whole.text
        streamed = c.post("/api/generate", json=body)
        assert streamed.status_code == 200, streamed.text
        parts = lines(streamed)
        sampling = {k: v for k, v in options.items() if k in OPENAI_SAMPLING}
        legacy = {"model": "tiny", "prompt": "a b a b", "max_tokens": 8, "logprobs": 3}
        openai = c.post("/v1/completions", json={**legacy, **sampling})
        assert openai.status_code == 200, openai.text
        strict(openai.text)
    entries = strict(whole.text)["logprobs"] + [e for p in parts for e in p.get("logprobs", [])]
    assert entries and not any("error" in p for p in parts), parts[-1]
    for entry in entries:
        for value in [entry["logprob"], *(t["logprob"] for t in entry["top_logprobs"])]:
            assert isinstance(value, float) and -9999.0 <= value <= 0.0, entry


# ---- 12. lone surrogates and NUL ----------------------------------------------------------------
def _generation_bodies(text: str) -> list[tuple[str, dict[str, Any]]]:
    short = {"num_predict": 2}
    chat = {"model": "tiny", "stream": False, "options": short}
    call = {"function": {"name": "lookup", "arguments": {"query": text}}}
    return [
        ("/api/generate", {"model": "tiny", "prompt": text, "stream": False, "options": short}),
        (
            "/api/generate",
            {"model": "tiny", "prompt": text, "raw": True, "stream": False, "options": short},
        ),
        (
            "/api/generate",
            {"model": "tiny", "prompt": "a", "system": text, "stream": False, "options": short},
        ),
        ("/api/generate", {"model": "tiny", "prompt": "a", "options": {**short, "stop": [text]}}),
        ("/api/chat", {**chat, "messages": [{"role": "user", "content": text}]}),
        (
            "/api/chat",
            {
                **chat,
                "messages": [
                    {"role": "system", "content": text},
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": text, "tool_name": "lookup"},
                ],
            },
        ),
        (
            "/v1/chat/completions",
            {
                "model": "tiny",
                "max_tokens": 2,
                "stop": [text],
                "messages": [{"role": "user", "content": text}],
            },
        ),
        ("/v1/completions", {"model": "tiny", "prompt": text, "max_tokens": 2}),
        ("/api/embed", {"model": "tiny", "input": [text, "a"]}),
    ]


def _runner_texts(request: p.Message) -> list[str]:
    """The text a request hands the runner: prompt and stop strings, or embedding inputs."""
    if isinstance(request, p.Generate):
        return [request.prompt, *(request.options.stop or [])]
    if isinstance(request, (p.Embed, p.Count)):
        return list(request.texts)
    return []


@pytest.mark.parametrize(
    ("text", "stored"),
    [("a\ud800b", "a\ufffdb"), ("\udfff", "\ufffd"), ("a\x00b", "a\x00b")],
    ids=["lone-high", "lone-low", "nul"],
)
def test_lone_surrogates_and_nul_in_every_text_field(
    app: FakeDaemon, text: str, stored: str
) -> None:
    c = app.http
    for path, body in _generation_bodies(text):
        before = len(app.runners.received)
        r = post(c, path, body)
        assert r.status_code == 200, (path, body, r.text)
        lines(r)
        # what reached the runner is the text as stored: U+FFFD for a lone surrogate, the
        # NUL kept, and nothing UTF-8 cannot carry
        handed = [t for m in app.runners.received[before:] for t in _runner_texts(m)]
        assert any(stored in t for t in handed), (path, handed)
        for t in handed:
            t.encode("utf-8")
    name = f"odd-{len(text)}-{ord(text[-1])}"
    create = {
        "model": name,
        "from": "tiny",
        "system": text,
        "template": "{{ .System }} " + text + " {{ .Prompt }}",
        "license": text,
        "parameters": {"stop": [text]},
        "messages": [{"role": "user", "content": text}],
        "stream": False,
    }
    r = post(c, "/api/create", create)
    assert r.status_code == 200, r.text
    shown = strict(post(c, "/api/show", {"model": name}).text)
    assert shown["system"] == stored and stored in shown["template"]
    assert shown["license"] == stored and shown["messages"][0]["content"] == stored
    assert f"stop {go_quote(stored)}" in " ".join(shown["parameters"].split())
    again = {"model": name, "prompt": text, "stream": False, "options": {"num_predict": 2}}
    r = post(c, "/api/generate", again)
    assert r.status_code == 200, r.text
    assert c.request("DELETE", "/api/delete", json={"model": name}).status_code == 200


def test_a_lone_surrogate_in_a_model_name_is_named_in_a_valid_answer(app: FakeDaemon) -> None:
    r = post(app.http, "/api/generate", {"model": "ti\ud800ny", "prompt": "a"})
    assert r.status_code in (400, 404), r.text
    assert "ti\ufffdny" in error(r)


# ---- 13. grammars and schemas -------------------------------------------------------------------
DEEP_GRAMMAR = "root ::= " + "(" * 20_000 + ' "a" ' + ")" * 20_000
AT_LIMIT_GRAMMAR = "root ::= " + "(" * MAX_GRAMMAR_DEPTH + ' "a" ' + ")" * MAX_GRAMMAR_DEPTH


def test_a_deeply_nested_grammar_is_refused_before_the_runner(app: FakeDaemon) -> None:
    chain = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(20_000))
    chain += 'r20000 ::= "a"\n'
    body = {"model": "tiny", "prompt": "a", "stream": False, "options": {"num_predict": 3}}
    c = app.http
    assert c.post("/api/generate", json=body).status_code == 200
    handed = len(app.runners.generates())
    r = c.post("/api/generate", json={**body, "grammar": DEEP_GRAMMAR})
    assert r.status_code == 400, r.text
    assert error(r) == (
        f"grammar: the grammar nests groups more than {MAX_GRAMMAR_DEPTH} levels deep "
        "(the limit); name the inner parts as rules instead"
    )
    r = c.post("/v1/completions", json={"model": "tiny", "prompt": "a", "grammar": DEEP_GRAMMAR})
    assert r.status_code == 400 and "more than 64 levels deep" in error(r), r.text
    r = c.post("/api/generate", json={**body, "grammar": chain})
    assert r.status_code == 400, r.text
    assert error(r) == f"grammar: the grammar has 20002 rules; the limit is {MAX_GRAMMAR_RULES}"
    assert len(app.runners.generates()) == handed  # none of them reached a runner
    r = c.post("/api/generate", json={**body, "grammar": AT_LIMIT_GRAMMAR})
    assert r.status_code == 200, r.text
    assert app.runners.generates()[-1].grammar == AT_LIMIT_GRAMMAR


def test_what_the_bounds_let_through_a_real_runner_serves(served: Daemon) -> None:
    """The deepest grammar and the longest stop list the bounds allow, and NUL and U+FFFD (a
    lone surrogate as the daemon stores it) in a prompt, a stop string and an embedding input,
    through a real runner; a refused grammar never reaches it (the same runner serves all)."""
    body = {"model": "tiny", "prompt": "a", "stream": False, "options": {"num_predict": 3}}
    with served.client() as c:
        assert c.post("/api/generate", json=body).status_code == 200
        before = served.runner_pids()
        r = c.post("/api/generate", json={**body, "grammar": DEEP_GRAMMAR})
        assert r.status_code == 400, r.text
        r = c.post("/api/generate", json={**body, "grammar": AT_LIMIT_GRAMMAR})
        assert r.status_code == 200 and strict(r.text)["response"].startswith("a"), r.text
        most = [f"{i:03d}" + "x" * (MAX_STOP_LENGTH - 3) for i in range(MAX_STOP_COUNT)]
        r = c.post("/api/generate", json={**body, "options": {"stop": most, "num_predict": 3}})
        assert r.status_code == 200, r.text
        for text in ("a\ud800b", "\udfff", "a\x00b"):
            short = {"num_predict": 2, "stop": [text]}
            for raw in (False, True):
                r = post(c, "/api/generate", {**body, "prompt": text, "raw": raw, "options": short})
                assert r.status_code == 200, (text, r.text)
                lines(r)
            r = post(c, "/api/embed", {"model": "tiny", "input": [text, "a"]})
            assert r.status_code == 200, (text, r.text)
            lines(r)
        assert served.runner_pids() == before  # the same runner served all of it


def nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


def test_deep_schemas_are_refused_on_every_route(app: FakeDaemon) -> None:
    deep = nested_schema(MAX_SCHEMA_DEPTH)  # two JSON levels per object level
    pattern = {"type": "string", "pattern": "^" + "(" * 200 + "a" + ")" * 200 + "$"}
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "a"}],
        "stream": False,
        "options": {"num_predict": 4},
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    c = app.http
    r = c.post("/api/chat", json={**chat, "format": deep})
    assert r.status_code == 400, r.text
    assert error(r).startswith(
        f"format: the JSON schema nests objects and arrays more than {MAX_SCHEMA_DEPTH}"
    )
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}
    r = c.post("/v1/chat/completions", json={**chat, "response_format": schema})
    assert r.status_code == 400 and error(r).startswith("response_format: the JSON schema")
    r = c.post("/api/chat", json={**chat, "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 400 and error(r).startswith("tools: the JSON schema nests"), r.text
    r = c.post("/api/generate", json={"model": "tiny", "prompt": "a", "format": pattern})
    assert r.status_code == 400, r.text
    assert error(r).startswith("format: the grammar nests groups more than"), r.text
    fine = {**chat, "format": nested_schema(3)}
    assert c.post("/api/chat", json=fine).status_code == 200
    assert app.runners.generates()[-1].grammar  # the schema reached the runner as a grammar


# ---- 15. stop lists -----------------------------------------------------------------------------
def test_stop_lists_are_bounded(app: FakeDaemon) -> None:
    body = {"model": "tiny", "prompt": "a", "stream": False, "options": {"num_predict": 3}}
    many = [f"stop-{i}" for i in range(400_000)]
    c = app.http
    r = c.post("/api/generate", json={**body, "options": {"stop": many}})
    assert r.status_code == 400, r.text
    assert error(r) == (
        f"option stop takes at most {MAX_STOP_COUNT} strings, got 400000: keep the ones "
        "that can end a reply"
    )
    long = "x" * (MAX_STOP_LENGTH + 1)
    r = c.post("/api/generate", json={**body, "options": {"stop": [long]}})
    assert r.status_code == 400, r.text
    assert error(r) == (
        f"option stop strings must be at most {MAX_STOP_LENGTH} characters each, got one "
        f"of {MAX_STOP_LENGTH + 1}"
    )
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "a"}], "stop": many}
    r = c.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400 and "at most 64 strings" in error(r), r.text
    create = {"model": "stops", "from": "tiny", "parameters": {"stop": many[:65]}}
    r = c.post("/api/create", json={**create, "stream": False})
    assert r.status_code == 400 and "at most 64 strings, got 65" in error(r), r.text
    most = [f"{i:03d}" + "x" * (MAX_STOP_LENGTH - 3) for i in range(MAX_STOP_COUNT)]
    r = c.post("/api/generate", json={**body, "options": {"stop": most, "num_predict": 3}})
    assert r.status_code == 200, r.text
    assert app.runners.generates()[-1].options.stop == most  # the runner gets them all
