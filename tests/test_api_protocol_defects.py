"""Issue 26, "Protocol": what clients met that Ollama and OpenAI answer otherwise, through a real
daemon with SmolLM2 and, where they install from PyPI, the clients that showed it (Haystack's
Ollama generator, pydantic-ai's Ollama provider; the Vercel AI SDK's request is sent as it is).

1. whitespace beside a tool call is never content, the same on the three chat APIs;
2. ``tools`` on a model whose template cannot show them is a 400 on every endpoint;
3. every ``tool_choice`` shape is accepted on every API;
4. thinking is written as both ``reasoning`` and ``reasoning_content`` on /v1 and read back
   from either;
5. ``_debug_render_only`` on /v1/chat/completions answers the rendered prompt;
6. JSON grammars let whitespace go only where pretty-printed JSON has it, and a forced call
   arrives within a budget just above its own length;
7. documented kinds, fields and CLI outputs are the code's.

What needs no model's words (refusing tools a template cannot show, the CLI's output, what
``ps`` names) runs in-process over fake runners (``fake``, ``tests/fakes``), the clients over
the app and the CLI in-process.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q8_0
from modelhub.library import views
from tests.fakes.daemon import BASE_URL, FakeDaemon
from tests.fixtures.synthetic_drafters import write_tiny_gemma4, write_tiny_gemma4_assistant
from tests.test_serving_replies import (
    THINK_FEWSHOT,
    THINK_TEMPLATE,
    TIME,
    TOOLS_TEMPLATE,
    WEATHER,
    _native_fewshot,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# Ollama's way to force a call: a ``format`` schema of the call (what Haystack sends).
CALL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": WEATHER["function"]["parameters"],
    },
    "required": ["name", "arguments"],
}
GREEDY = {"temperature": 0, "num_predict": 48}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("protocol")
    d = start_daemon(base / "models", base / "daemon.log", {"MODELHUB_KEEP_ALIVE": "10m"})
    head = f"FROM {smollm2_q8_0()}\nPARAMETER num_ctx 2048\nPARAMETER num_parallel 1\n"
    for name, body in (
        ("tooly", f'TEMPLATE """{TOOLS_TEMPLATE}"""\n'),
        ("thinker", f'TEMPLATE """{THINK_TEMPLATE}"""\n'),
        ("plain", ""),  # SmolLM2's own template: no place for tools
    ):
        path = base / f"{name}.Modelfile"
        path.write_text(head + body)
        d.create(name, path)
    yield d
    d.stop()


def _lines(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def _sse(r: httpx.Response) -> list[dict[str, Any]]:
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: ") :]))
    return out


# ---- 1. whitespace beside a call -----------------------------------------------------------
def test_whitespace_beside_a_call_is_content_on_no_api(served: Daemon) -> None:
    """The model writes the forced call and then blank lines: no API shows them as content."""
    body = {"model": "tooly", "messages": QUESTION, "tools": [WEATHER], "format": CALL_SCHEMA}
    with served.client(timeout=300) as c:
        r = c.post("/api/chat", json={**body, "stream": False, "options": GREEDY})
        message = r.json()["message"]
        assert message["content"] == "" and len(message["tool_calls"]) == 1, message
        chunks = _lines(c.post("/api/chat", json={**body, "stream": True, "options": GREEDY}))
        with_calls = [ch for ch in chunks if ch["message"].get("tool_calls")]
        assert len(with_calls) == 1 and with_calls[0]["message"]["content"] == ""
        assert "".join(ch["message"]["content"] for ch in chunks) == ""

        fmt = {"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}}
        v1 = {"model": "tooly", "messages": QUESTION, "tools": [WEATHER], "temperature": 0}
        r = c.post("/v1/chat/completions", json={**v1, "response_format": fmt, "max_tokens": 48})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] is None, choice  # as OpenAI answers

        tool = {"type": "function", **WEATHER["function"]}
        text = {"format": {"type": "json_schema", "name": "call", "schema": CALL_SCHEMA}}
        r = c.post(
            "/v1/responses",
            json={
                "model": "tooly",
                "input": QUESTION[0]["content"],
                "tools": [tool],
                "text": text,
                "temperature": 0,
                "max_output_tokens": 48,
            },
        )
        assert [item["type"] for item in r.json()["output"]] == ["function_call"], r.text


def test_haystack_streams_a_call_with_tools(
    served: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Haystack's Ollama generator refuses a chunk that carries content and a call at once."""
    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")
    from haystack.dataclasses import ChatMessage, StreamingChunk
    from haystack.tools import Tool
    from haystack_integrations.components.generators.ollama import OllamaChatGenerator

    chunks: list[StreamingChunk] = []
    weather = Tool(
        name="get_weather",
        description=WEATHER["function"]["description"],
        parameters=WEATHER["function"]["parameters"],
        function=lambda city: f"sunny in {city}",
    )
    generator = OllamaChatGenerator(
        model="tooly",
        url=served.url,
        generation_kwargs=GREEDY,
        timeout=300,
        streaming_callback=chunks.append,
        tools=[weather],
        response_format=CALL_SCHEMA,
    )
    reply = generator.run(messages=[ChatMessage.from_user(QUESTION[0]["content"])])["replies"][0]
    assert [call.tool_name for call in reply.tool_calls] == ["get_weather"]
    assert not reply.text
    assert any(chunk.tool_calls for chunk in chunks)


# ---- 2. tools on a model that cannot show them ---------------------------------------------
def test_tools_on_a_model_without_a_place_for_them_are_refused_everywhere(
    fake: FakeDaemon,
) -> None:
    """``plain``: the tiny model's own chat template (Jinja, as SmolLM2's) has no place for
    tools."""
    fake.add_model("plain")
    words = '"plain:latest" does not support tools'
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=BASE_URL, transport=fake.httpx_transport()).chat(
            "plain", messages=QUESTION, tools=[WEATHER]
        )
    assert caught.value.status_code == 400 and words in caught.value.error
    client = openai.OpenAI(
        base_url=BASE_URL + "/v1", api_key="unused", http_client=fake.http_client()
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="plain", messages=QUESTION, tools=[WEATHER])
    assert words in str(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="plain",
            input=QUESTION[0]["content"],
            tools=[{"type": "function", **WEATHER["function"]}],  # type: ignore[list-item]
        )
    assert words in str(refused.value)
    # tool_choice "none" shows no tools: nothing to refuse
    r = client.chat.completions.create(
        model="plain", messages=QUESTION, tools=[WEATHER], tool_choice="none", max_tokens=2
    )
    assert r.choices[0].message.tool_calls is None


# ---- 3. tool_choice shapes -----------------------------------------------------------------
def test_every_tool_choice_shape_is_accepted_on_every_api(served: Daemon) -> None:
    responses_shape = {"type": "function", "name": "get_time"}
    chat_shape = {"type": "function", "function": {"name": "get_time"}}
    with served.client(timeout=300) as c:
        # what the Vercel AI SDK's Ollama provider sends to /api/chat
        body = {"model": "tooly", "messages": QUESTION, "tools": [WEATHER, TIME], "stream": False}
        r = c.post("/api/chat", json={**body, "tool_choice": responses_shape, "options": GREEDY})
        assert r.status_code == 200, r.text
        assert [t["function"]["name"] for t in r.json()["message"]["tool_calls"]] == ["get_time"]
        v1 = {"model": "tooly", "messages": QUESTION, "tools": [WEATHER, TIME], "temperature": 0}
        r = c.post("/v1/chat/completions", json={**v1, "tool_choice": responses_shape})
        assert r.status_code == 200, r.text
        calls = r.json()["choices"][0]["message"]["tool_calls"]
        assert [t["function"]["name"] for t in calls] == ["get_time"]
        tools = [{"type": "function", **t["function"]} for t in (WEATHER, TIME)]
        r = c.post(
            "/v1/responses",
            json={
                "model": "tooly",
                "input": QUESTION[0]["content"],
                "tools": tools,
                "tool_choice": chat_shape,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        assert [i["name"] for i in r.json()["output"] if i["type"] == "function_call"] == [
            "get_time"
        ]
        r = c.post("/api/chat", json={**body, "tool_choice": {"type": "function"}})
        assert r.status_code == 400 and '{"type": "function", "name": ...}' in r.json()["error"]


# ---- 4. both thinking fields ---------------------------------------------------------------
def _openai_thinking_history(field: str) -> list[dict[str, Any]]:
    return [
        {
            "role": m["role"],
            "content": m["content"],
            **({field: m["thinking"]} if "thinking" in m else {}),
        }
        for m in THINK_FEWSHOT
    ]


def test_thinking_is_written_under_both_names_and_read_from_either(served: Daemon) -> None:
    thought = "Three plus five is eight."
    with served.client(timeout=300) as c:
        body = {
            "model": "thinker",
            "messages": _openai_thinking_history("reasoning"),
            "temperature": 0,
        }
        r = c.post("/v1/chat/completions", json=body)
        message = r.json()["choices"][0]["message"]
        assert message["reasoning"] == message["reasoning_content"] == thought, message
        assert message["content"] == "8"
        deltas = [
            ch["choices"][0]["delta"]
            for ch in _sse(c.post("/v1/chat/completions", json={**body, "stream": True}))
            if ch["choices"]
        ]
        assert "".join(d.get("reasoning", "") for d in deltas) == thought
        assert "".join(d.get("reasoning_content", "") for d in deltas) == thought
        assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
        for field in ("reasoning", "reasoning_content"):
            history = {"model": "thinker", "messages": _openai_thinking_history(field)}
            r = c.post("/v1/chat/completions", json={**history, "_debug_render_only": True})
            rendered = r.json()["_debug_info"]["rendered_template"]
            assert "<think>Two plus two is four.</think>4<|im_end|>" in rendered, (field, r.text)


def test_pydantic_ai_keeps_its_history_thinking(served: Daemon) -> None:
    """pydantic-ai's Ollama provider reads ``reasoning`` and sends it back under that name."""
    import httpx2
    from pydantic_ai import Agent, UnexpectedModelBehavior
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        TextPart,
        ThinkingPart,
        UserPromptPart,
    )
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.ollama import OllamaProvider

    sent: list[dict[str, Any]] = []

    async def record(request: httpx2.Request) -> None:
        sent.append(json.loads(request.content))

    http = httpx2.AsyncClient(timeout=300, event_hooks={"request": [record]})
    model = OpenAIChatModel(
        "thinker", provider=OllamaProvider(served.url + "/v1", http_client=http)
    )
    agent = Agent(model, model_settings={"temperature": 0})
    history: list[Any] = []  # the few-shot turns, as the provider had answered them
    for m in THINK_FEWSHOT[:-1]:
        if m["role"] == "user":
            history.append(ModelRequest(parts=[UserPromptPart(m["content"])]))
        else:
            thought = ThinkingPart(m["thinking"], id="reasoning", provider_name=model.system)
            history.append(ModelResponse(parts=[thought, TextPart(m["content"])]))
    first = agent.run_sync(THINK_FEWSHOT[-1]["content"], message_history=history)
    thinking = [
        p
        for m in first.new_messages()
        for p in getattr(m, "parts", [])
        if p.part_kind == "thinking"
    ]
    assert [p.content for p in thinking] == ["Three plus five is eight."]
    # The next turn sends the history back; what the model answers to it does not matter here.
    with contextlib.suppress(UnexpectedModelBehavior):
        agent.run_sync("And 2+2?", message_history=first.all_messages())
    answered = [m for m in sent[-1]["messages"] if m["role"] == "assistant"][-1]
    assert answered.get("reasoning") == "Three plus five is eight.", answered
    with served.client(timeout=300) as c:
        r = c.post("/v1/chat/completions", json={**sent[-1], "_debug_render_only": True})
    rendered = r.json()["_debug_info"]["rendered_template"]
    assert "<think>Three plus five is eight.</think>8<|im_end|>" in rendered


# ---- 5. _debug_render_only on /v1 ----------------------------------------------------------
def test_debug_render_only_on_openai_chat_answers_the_rendered_prompt(served: Daemon) -> None:
    messages = [*_native_fewshot(), *QUESTION]
    with served.client(timeout=300) as c:
        native = c.post(
            "/api/chat",
            json={"model": "tooly", "messages": messages, "_debug_render_only": True},
        ).json()["debug_info"]["rendered_template"]
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": "plain",
                "messages": QUESTION,
                "_debug_render_only": True,
                "max_tokens": 4,  # were it generated
            },
        )
        body = r.json()
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 0
        assert body["choices"][0]["message"]["content"] == ""
        rendered = body["_debug_info"]["rendered_template"]
        assert rendered.endswith(
            "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
        ), rendered
    assert "Madrid" in native  # the native route still answers as before


# ---- 6. whitespace in grammars -------------------------------------------------------------
COLOURS = ["coral", "red", "blue"]
COLOUR = {"type": "object", "properties": {"colour": {"enum": COLOURS}}, "required": ["colour"]}
# The JSON the schema allows, as pieces: literals, or patterns every prefix of whose matches
# also matches (whitespace after "{" and before "}", at most one space after ":").
_INNER = r"(?: |\n[ \t]{0,20})?"
_PIECES: list[str | list[str]] = ["{", _INNER, '"colour":', r" ?", [f'"{c}"' for c in COLOURS]]
_PIECES += [_INNER, "}"]


def _whole(piece: str | list[str]) -> str:
    if isinstance(piece, list):
        return "(?:" + "|".join(re.escape(p) for p in piece) + ")"
    return piece if piece in (_INNER, r" ?") else re.escape(piece)


def _prefix(piece: str | list[str]) -> str:
    if isinstance(piece, str) and piece in (_INNER, r" ?"):
        return piece
    texts = piece if isinstance(piece, list) else [piece]
    return "(?:" + "|".join(re.escape(t[:k]) for t in texts for k in range(len(t))) + ")"


LAID_OUT = re.compile("".join(_whole(p) for p in _PIECES))
STARTS_LAID_OUT = re.compile(
    "|".join("".join(map(_whole, _PIECES[:i])) + _prefix(_PIECES[i]) for i in range(len(_PIECES)))
)


def test_a_schema_grammar_allows_whitespace_only_where_pretty_json_has_it(served: Daemon) -> None:
    """``top_logprobs`` lists what the grammar left at each step (tokens it forbids are not
    listed): every alternative keeps the answer a beginning of the JSON laid out as
    pretty-printed JSON is, so no step could have spent a token on other whitespace."""
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": COLOUR}}
    body = {
        "model": "plain",
        "messages": [{"role": "user", "content": "What colour is coral? Answer in JSON."}],
        "response_format": fmt,
        "temperature": 0,
        "max_tokens": 16,
        "logprobs": True,
        "top_logprobs": 20,
    }
    with served.client(timeout=300) as c:
        r = c.post("/v1/chat/completions", json=body)
    choice = r.json()["choices"][0]
    text = choice["message"]["content"]
    assert LAID_OUT.fullmatch(text) and json.loads(text)["colour"] in COLOURS, text
    written = ""
    for entry in choice["logprobs"]["content"]:
        for alternative in entry["top_logprobs"]:
            candidate = written + alternative["token"]
            assert STARTS_LAID_OUT.fullmatch(candidate) or LAID_OUT.fullmatch(candidate), candidate
        written += entry["token"]
    assert written == text


def test_a_forced_call_is_compact_and_arrives_within_its_own_length(served: Daemon) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"model": "tooly", "messages": QUESTION, "tools": [WEATHER, TIME], "tool_choice": named}
    with served.client(timeout=300) as c:
        r = c.post(
            "/v1/chat/completions",
            json={**body, "temperature": 0, "logprobs": True, "top_logprobs": 20},
        )
        greedy = r.json()
        entries = greedy["choices"][0]["logprobs"]["content"]
        written = "".join(e["token"] for e in entries)
        assert re.fullmatch(
            r'<tool_call>\n\{"name": ?"get_weather", ?"arguments": ?\{"city": ?'
            r'"[^"]*"\}\}\n</tool_call>',
            written,
        ), written
        alternatives = [a["token"] for e in entries for a in e["top_logprobs"]]
        assert not [a for a in alternatives if "\t" in a or "  " in a or "\n\n" in a]
        own = greedy["usage"]["completion_tokens"]
        # the same call within exactly its own length, and sampled calls just above it
        r = c.post("/v1/chat/completions", json={**body, "temperature": 0, "max_tokens": own})
        assert r.json()["choices"][0]["finish_reason"] == "tool_calls", r.text
        for seed in range(5):
            r = c.post(
                "/v1/chat/completions",
                json={**body, "temperature": 1.5, "seed": seed, "max_tokens": own + 8},
            )
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "tool_calls", (seed, choice)
            assert choice["message"]["content"] is None, (seed, choice)


# ---- 7. docs in step with the code ---------------------------------------------------------
KINDS = [
    views.DRAFT_MODEL,
    views.DRAFT_MTP,
    views.DRAFT_MTP_DRAFTER,
    views.DRAFT_EAGLE3,
    views.DRAFT_DFLASH,
    views.DRAFT_NGRAM,
]


def _paragraphs(doc: str) -> list[str]:
    return re.split(r"\n\s*\n", (ROOT / "docs" / doc).read_text())


def test_every_documented_list_of_draft_kinds_names_them_all() -> None:
    """A paragraph that names ``draft_model`` and ``mtp_drafter`` (a list of kinds) names every
    kind the code records (``library.views``)."""
    checked = 0
    for doc in ("api.md", "cli.md", "modelfile.md", "speculative.md"):
        for paragraph in _paragraphs(doc):
            words = set(re.findall(r"\w+", paragraph))
            if {views.DRAFT_MODEL, views.DRAFT_MTP_DRAFTER} <= words:
                checked += 1
                missing = [k for k in KINDS if k not in words]
                assert not missing, f"docs/{doc} lists draft kinds without {missing}: {paragraph}"
    assert checked >= 3  # api.md's show, cli.md's show and ps


def test_modelhub_info_prints_the_lines_docs_show(fake: FakeDaemon) -> None:
    """docs/cli.md's ``modelhub info`` example has the labels the command prints, in order."""
    example = re.search(r"\$ modelhub info\n(.*?)\n\n", (ROOT / "docs/cli.md").read_text(), re.S)
    assert example is not None
    documented = [line.split(":")[0] for line in example.group(1).splitlines()]
    r = fake.cli("info")
    assert r.returncode == 0, r.stderr
    printed = [line.split(":")[0] for line in r.stdout.split("\n\n")[0].splitlines()]
    assert printed == documented


def test_ps_names_an_assistant_by_the_kind_show_uses(fake: FakeDaemon, tmp_path: Path) -> None:
    target = write_tiny_gemma4(tmp_path / "gemma4.gguf")
    assistant = write_tiny_gemma4_assistant(tmp_path / "gemma4-assistant.gguf", target)
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {target}\nDRAFT {assistant}\n")
    r = fake.cli("create", "tiny-assisted", "-f", str(mf))
    assert r.returncode == 0, r.stderr
    with fake.http_client() as c:
        show = c.post("/api/show", json={"model": "tiny-assisted"}).json()
        assert show["details"]["draft"]["kind"] == "mtp_drafter"
        body = {"model": "tiny-assisted", "prompt": "hello", "raw": True, "stream": False}
        assert (
            c.post("/api/generate", json={**body, "options": {"num_predict": 2}}).status_code == 200
        )
        loaded = {m["name"]: m for m in c.get("/api/ps").json()["models"]}
        assert loaded["tiny-assisted:latest"]["draft"]["kind"] == "mtp_drafter"
        ps = fake.cli("ps", "tiny-assisted")
        assert "mtp_drafter" in ps.stdout, ps.stdout
        c.post("/api/generate", json={"model": "tiny-assisted", "keep_alive": 0})


def test_cli_errors_are_the_daemons_words_without_a_status_line(
    fake: FakeDaemon, tmp_path: Path
) -> None:
    """As docs/install.md and docs/cli.md show them: ``Error: <message>``."""
    mf = tmp_path / "Modelfile"
    mf.write_text("FROM nothere-at-all\n")
    r = fake.cli("create", "broken", "-f", str(mf))
    assert r.returncode != 0
    assert r.stderr.startswith("Error: ") and not re.match(r"Error: \d{3} ", r.stderr), r.stderr
