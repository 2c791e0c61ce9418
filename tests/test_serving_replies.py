"""Tool calls, reasoning and log-probabilities through the real daemon, with the official
``ollama`` and ``openai`` clients and SmolLM2: a Modelfile TEMPLATE that advertises tools
(SmolLM2's own does not) and one that reasons in ``<think>`` markers. A short few-shot history
makes the 135M model write the call or the reasoning on its own (greedy), so ``auto`` parsing
is tested on what the model really wrote; ``required`` and named choices are forced by the
grammar built from the tools."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q8_0

pytestmark = pytest.mark.slow

TOOLS_TEMPLATE = """{{- if .Tools }}<|im_start|>system
You are a helpful assistant with tools. To call a tool, reply with only \
<tool_call>{"name": "<function name>", "arguments": {<arguments>}}</tool_call>.
Tools:
{{ range .Tools }}{{ json .Function }}
{{ end }}<|im_end|>
{{ else if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- range .Messages }}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .ToolCalls }}<tool_call>
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}
{{ end }}</tool_call>{{ else }}{{ .Content }}{{ end }}<|im_end|>
{{ else if eq .Role "tool" }}<|im_start|>user
<tool_response>{{ .Content }}</tool_response><|im_end|>
{{ end }}
{{- end }}<|im_start|>assistant
"""

THINK_TEMPLATE = """{{- range .Messages }}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}{{ .Content }}<|im_end|>
{{ end }}
{{- end }}<|im_start|>assistant
{{ if .Think }}<think>{{ end }}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
GREEDY = {"temperature": 0, "num_predict": 48}


def _native_fewshot() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for city in ("Rome", "Madrid"):
        out.append({"role": "user", "content": f"What is the weather in {city}?"})
        call = {"function": {"name": "get_weather", "arguments": {"city": city}}}
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    return out


def _openai_fewshot() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, city in enumerate(("Rome", "Madrid")):
        out.append({"role": "user", "content": f"What is the weather in {city}?"})
        function = {"name": "get_weather", "arguments": json.dumps({"city": city})}
        call = {"id": f"call_{i}", "type": "function", "function": function}
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return out


THINK_FEWSHOT = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "thinking": "Two plus two is four.", "content": "4"},
    {"role": "user", "content": "What is the capital of Italy?"},
    {"role": "assistant", "thinking": "Italy's capital city is Rome.", "content": "Rome"},
    {"role": "user", "content": "What is 3+5?"},
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("replies")
    d = start_daemon(base / "models", base / "daemon.log", {"MODELHUB_KEEP_ALIVE": "10m"})
    head = f"FROM {smollm2_q8_0()}\nPARAMETER num_ctx 2048\nPARAMETER num_parallel 1\n"
    for name, body in (
        ("tooly", f'TEMPLATE """{TOOLS_TEMPLATE}"""\n'),
        ("thinker", f'TEMPLATE """{THINK_TEMPLATE}"""\n'),
        ("plain", ""),
        ("plain-ngram", "DRAFT ngram\nPARAMETER draft_num_predict 6\n"),
    ):
        path = Path(base / f"{name}.Modelfile")
        path.write_text(head + body)
        d.create(name, path)
    yield d
    d.stop()


def _oai(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", timeout=120)


# ---- tool calls ----------------------------------------------------------------------------
def test_ollama_client_gets_the_call_the_model_wrote_and_answers_with_its_result(
    served: Daemon,
) -> None:
    client = ollama.Client(host=served.url, timeout=120)
    messages = [*_native_fewshot(), {"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat("tooly", messages=messages, tools=[WEATHER], options=GREEDY)
    calls = r.message.tool_calls or []
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert r.message.content == "" and r.done_reason == "stop"

    # streamed: the call arrives whole in one chunk, no marker text leaks into content
    chunks = list(
        client.chat("tooly", messages=messages, tools=[WEATHER], options=GREEDY, stream=True)
    )
    streamed = [c for chunk in chunks for c in chunk.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert "".join(chunk.message.content or "" for chunk in chunks) == ""

    # the second turn: the call and its result go back as history
    messages += [r.message, {"role": "tool", "content": "sunny, 24 C", "tool_name": "get_weather"}]
    again = client.chat("tooly", messages=messages, tools=[WEATHER], options=GREEDY)
    assert again.message.content or again.message.tool_calls


def test_ollama_format_schema_forces_a_call(served: Daemon) -> None:
    """Ollama has no tool_choice; a ``format`` schema of the call makes the reply one."""
    client = ollama.Client(host=served.url, timeout=120)
    schema = {
        "type": "object",
        "properties": {"name": {"const": "get_time"}, "arguments": TIME["function"]["parameters"]},
        "required": ["name", "arguments"],
    }
    r = client.chat(
        "tooly",
        messages=[{"role": "user", "content": "What time is it in Paris?"}],
        tools=[WEATHER, TIME],
        format=schema,
        options=GREEDY,
    )
    calls = r.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_time"
    assert calls[0].function.arguments["zone"] in ("UTC", "CET")


def test_openai_client_auto_required_named_and_the_second_turn(served: Daemon) -> None:
    client = _oai(served)
    question = {"role": "user", "content": "What is the weather in Paris?"}
    auto = client.chat.completions.create(
        model="tooly", messages=[*_openai_fewshot(), question], tools=[WEATHER], temperature=0
    )
    choice = auto.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_") and not choice.message.content

    # required, streamed: the SDK assembles the call from the deltas
    stream = client.chat.completions.create(
        model="tooly",
        messages=[question],
        tools=[WEATHER, TIME],
        tool_choice="required",
        temperature=0,
        max_tokens=64,
        stream=True,
    )
    names, arguments, finish = {}, {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            if tc.function and tc.function.name:
                names[tc.index] = tc.function.name
            arguments[tc.index] = arguments.get(tc.index, "") + (tc.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(names) == 1
    args = json.loads(arguments[0])
    if names[0] == "get_weather":
        assert isinstance(args["city"], str)
    else:
        assert names[0] == "get_time" and args["zone"] in ("UTC", "CET")

    named = client.chat.completions.create(
        model="tooly",
        messages=[question],
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=64,
    )
    (forced,) = named.choices[0].message.tool_calls or []
    assert forced.function.name == "get_time"
    assert json.loads(forced.function.arguments)["zone"] in ("UTC", "CET")

    second = client.chat.completions.create(
        model="tooly",
        messages=[
            question,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"},
        ],
        tools=[WEATHER],
        temperature=0,
        max_tokens=32,
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_none_and_plain_answers_stay_content(served: Daemon) -> None:
    client = _oai(served)
    messages = [*_openai_fewshot(), {"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model="tooly",
        messages=messages,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=24,
    )
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content


def test_bad_tool_choices_are_clear_400s(served: Daemon) -> None:
    with served.client(timeout=60) as c:
        base = {"model": "tooly", "messages": [{"role": "user", "content": "hi"}]}
        for extra, words in (
            ({"tool_choice": "required"}, "needs tools"),
            ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice must be"),
            (
                {"tools": [WEATHER], "tool_choice": {"function": {"name": "nope"}}},
                "named 'nope'",
            ),
            ({"tools": [WEATHER], "tool_choice": "required", "format": "json"}, "combined"),
        ):
            r = c.post("/api/chat", json={**base, **extra, "stream": False})
            assert r.status_code == 400 and words in r.json()["error"], (extra, r.text)


# ---- thinking ------------------------------------------------------------------------------
def test_thinking_is_separated_native_and_streamed(served: Daemon) -> None:
    client = ollama.Client(host=served.url, timeout=120)
    r = client.chat("thinker", messages=THINK_FEWSHOT, options=GREEDY)  # think unset: on
    assert r.message.thinking == "Three plus five is eight."
    assert r.message.content == "8"
    chunks = list(
        client.chat("thinker", messages=THINK_FEWSHOT, think=True, options=GREEDY, stream=True)
    )
    thinking = "".join(c.message.thinking or "" for c in chunks)
    content = "".join(c.message.content or "" for c in chunks)
    assert (thinking, content) == ("Three plus five is eight.", "8")
    assert sum(1 for c in chunks if c.message.thinking) > 1  # streamed as it came

    off = client.chat("thinker", messages=THINK_FEWSHOT, think=False, options=GREEDY)
    assert off.message.thinking is None and "eight" in (off.message.content or "")

    with httpx.Client(base_url=served.url, timeout=120) as c:
        body = {"model": "thinker", "prompt": "What is 3+5?", "think": True, "stream": False}
        gen = c.post("/api/generate", json={**body, "options": {**GREEDY, "num_predict": 8}})
        assert gen.status_code == 200 and "thinking" in gen.json()  # still inside the reasoning


def test_thinking_on_the_openai_api(served: Daemon) -> None:
    client = _oai(served)
    messages = [
        {
            "role": m["role"],
            "content": m["content"],
            **({"reasoning_content": m["thinking"]} if "thinking" in m else {}),
        }
        for m in THINK_FEWSHOT
    ]
    r = client.chat.completions.create(model="thinker", messages=messages, temperature=0)
    message = r.choices[0].message
    assert message.content == "8"
    assert message.model_extra is not None
    assert message.model_extra.get("reasoning_content") == "Three plus five is eight."
    stream = client.chat.completions.create(
        model="thinker", messages=messages, temperature=0, stream=True
    )
    reasoning, content = "", ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
    assert (reasoning, content) == ("Three plus five is eight.", "8")
    off = client.chat.completions.create(
        model="thinker", messages=messages, temperature=0, reasoning_effort="none"
    )
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})


def test_think_on_a_model_that_cannot_is_refused_and_capabilities_tell_the_truth(
    served: Daemon,
) -> None:
    with served.client(timeout=60) as c:
        r = c.post(
            "/api/chat",
            json={"model": "plain", "messages": [{"role": "user", "content": "hi"}], "think": True},
        )
        assert r.status_code == 400 and "does not support thinking" in r.json()["error"]
        caps = {
            m: c.post("/api/show", json={"model": m}).json()["capabilities"]
            for m in ("tooly", "thinker", "plain")
        }
    assert "tools" in caps["tooly"] and "thinking" not in caps["tooly"]
    assert "thinking" in caps["thinker"]
    assert "vision" not in caps["plain"] and "thinking" not in caps["plain"]


# ---- log-probabilities ---------------------------------------------------------------------
REPEAT = "Count from one to ten in words."


def test_logprobs_on_the_native_api_equal_with_and_without_ngram_drafting(served: Daemon) -> None:
    client = ollama.Client(host=served.url, timeout=120)
    got = {}
    for model in ("plain", "plain-ngram"):
        r = client.generate(model, REPEAT, logprobs=True, top_logprobs=3, options=GREEDY)
        entries = r.logprobs or []
        assert len(entries) == r.eval_count and r.eval_count > 10
        for e in entries:
            top = e.top_logprobs or []
            assert len(top) == 3 and sum(math.exp(t.logprob) for t in top) <= 1.0 + 1e-9
            assert top[0].token == e.token and e.logprob <= 0
        assert "".join(e.token for e in entries) == r.response
        got[model] = [
            (e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs or []])
            for e in entries
        ]
    assert got["plain"] == got["plain-ngram"]
    # ...and from a run that did draft (adaptive drafting may sit a request out: try again)
    with served.client(timeout=120) as c:
        body = {"model": "plain-ngram", "prompt": REPEAT, "stream": False, "options": GREEDY}
        for _ in range(4):
            drafted = c.post("/api/generate", json={**body, "logprobs": True, "top_logprobs": 3})
            if drafted.json().get("draft_accepted_count", 0) > 0:
                break
        assert drafted.json().get("draft_accepted_count", 0) > 0
        entries = drafted.json()["logprobs"]
        again = [
            (e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]])
            for e in entries
        ]
        assert again == got["plain"]

    chunks = list(
        client.chat(
            "plain",
            messages=[{"role": "user", "content": REPEAT}],
            logprobs=True,
            stream=True,
            options=GREEDY,
        )
    )
    streamed = [e for c in chunks for e in c.logprobs or []]
    assert "".join(e.token for e in streamed) == "".join(c.message.content or "" for c in chunks)


def test_logprobs_on_the_openai_api(served: Daemon) -> None:
    client = _oai(served)
    messages = [{"role": "user", "content": REPEAT}]
    runs = {}
    for model in ("plain", "plain-ngram"):
        r = client.chat.completions.create(
            model=model,
            messages=messages,
            temperature=0,
            max_tokens=40,
            logprobs=True,
            top_logprobs=2,
        )
        content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
        assert content and "".join(t.token for t in content) == r.choices[0].message.content
        assert all(len(t.top_logprobs) == 2 and t.bytes for t in content)
        runs[model] = [(t.token, t.logprob) for t in content]
    assert runs["plain"] == runs["plain-ngram"]

    stream = client.chat.completions.create(
        model="plain", messages=messages, temperature=0, max_tokens=40, logprobs=True, stream=True
    )
    streamed = [
        t.token
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for t in chunk.choices[0].logprobs.content or []
    ]
    assert streamed == [t for t, _ in runs["plain"]]

    legacy = client.completions.create(
        model="plain", prompt="One, two, three,", max_tokens=8, temperature=0, logprobs=2
    )
    block = legacy.choices[0].logprobs
    assert block is not None and "".join(block.tokens or []) == legacy.choices[0].text
    assert (
        len(block.token_logprobs or []) == len(block.tokens or []) == len(block.top_logprobs or [])
    )
    assert block.text_offset == [
        sum(len(t) for t in (block.tokens or [])[:i]) for i in range(len(block.tokens or []))
    ]
    assert (
        client.completions.create(model="plain", prompt="x", max_tokens=2).choices[0].logprobs
        is None
    )


def test_bad_logprob_requests_are_clear_400s(served: Daemon) -> None:
    with served.client(timeout=60) as c:
        for body, words in (
            ({"logprobs": True, "top_logprobs": 21}, "between 0 and 20"),
            ({"top_logprobs": 2}, "needs logprobs"),
            ({"logprobs": "yes"}, "must be a boolean"),
        ):
            r = c.post(
                "/api/generate", json={"model": "plain", "prompt": "hi", "stream": False, **body}
            )
            assert r.status_code == 400 and words in r.json()["error"], r.text


# ---- /v1/responses -------------------------------------------------------------------------
RESPONSE_TOOL = {"type": "function", **WEATHER["function"]}


def test_responses_api_text_streaming_and_instructions(served: Daemon) -> None:
    client = _oai(served)
    chat = client.chat.completions.create(
        model="plain",
        messages=[
            {"role": "system", "content": "Answer in one short sentence."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        temperature=0,
        max_tokens=24,
    )
    r = client.responses.create(
        model="plain",
        instructions="Answer in one short sentence.",
        input="What is the capital of France?",
        temperature=0,
        max_output_tokens=24,
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content  # the same request underneath
    assert r.usage is not None and r.usage.output_tokens > 0
    assert r.status in ("completed", "incomplete")

    events = list(
        client.responses.create(
            model="plain",
            instructions="Answer in one short sentence.",
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What is the capital of France?"}],
                }
            ],
            temperature=0,
            max_output_tokens=24,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == r.output_text


def test_responses_api_function_calls_and_their_outputs(served: Daemon) -> None:
    client = _oai(served)
    r = client.responses.create(
        model="tooly",
        input="What is the weather in Paris?",
        tools=[RESPONSE_TOOL],
        tool_choice="required",
        temperature=0,
        max_output_tokens=48,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)

    stream = client.responses.create(
        model="tooly",
        input="What is the weather in Paris?",
        tools=[RESPONSE_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=48,
        stream=True,
    )
    done = [e for e in stream if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == json.loads(calls[0].arguments)

    follow = client.responses.create(
        model="tooly",
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 24 C"},
        ],
        tools=[RESPONSE_TOOL],
        temperature=0,
        max_output_tokens=24,
    )
    assert follow.output


def test_responses_api_refuses_what_it_cannot_do(served: Daemon) -> None:
    with served.client(timeout=60) as c:
        for body, words in (
            ({"input": "hi", "tools": [{"type": "web_search"}]}, "only function tools"),
            (
                {
                    "input": [
                        {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}
                    ]
                },
                "must be a data: URL",
            ),
            ({}, "input is required"),
        ):
            r = c.post("/v1/responses", json={"model": "plain", **body})
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_a_seed_gives_the_same_text_with_and_without_drafting(served: Daemon) -> None:
    """Two identical seeded requests at temperature 0.8 (the report that led to coupled draws),
    on the model with and without DRAFT ngram: one text."""
    texts = set()
    with served.client(timeout=120) as c:
        for model in ("plain", "plain-ngram", "plain-ngram"):
            body = {
                "model": model,
                "prompt": "Write a short story about a fox.",
                "stream": False,
                "options": {"temperature": 0.8, "seed": 42, "num_predict": 48},
            }
            texts.add(c.post("/api/generate", json=body).json()["response"])
        body["options"] = {"temperature": 0.8, "seed": 43, "num_predict": 48}
        other = c.post("/api/generate", json=body).json()["response"]
    assert len(texts) == 1 and other not in texts
