"""Anthropic's Messages API (issue 24) through a real daemon with SmolLM2, driven by the official
``anthropic`` SDK: create, streaming with the SDK's accumulator, forced tools and a tool_result
round trip, thinking blocks, count_tokens, errors; the raw event stream compared field by field
with the documented protocol; greedy output identical to /api/chat; drafts counted in usage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from devtools.daemons import Daemon
from devtools.realmodels import smollm2_q8_0
from tests.test_serving_replies import THINK_TEMPLATE, TOOLS_TEMPLATE

pytestmark = pytest.mark.slow

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {
    "name": "get_time",
    "description": "The time in a timezone",
    "input_schema": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
    },
}
SYSTEM = "You are a concise assistant."
QUESTION = "Name three colours of the rainbow."
GREEDY = {"temperature": 0}  # the SDK has no temperature argument any more; the API reads it
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]


FIXED_LENGTH = "PARAMETER draft_adaptive false\n"


@pytest.fixture(scope="module")
def served(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The session's daemon, with this module's models (names of its own)."""
    base = tmp_path_factory.mktemp("messages")
    head = f"FROM {smollm2_q8_0()}\nPARAMETER num_ctx 2048\nPARAMETER num_parallel 1\n"
    for name, body in (
        ("msg-plain", "DRAFT none\n"),
        # a fixed draft length: the identity test must draft whatever the controller decides
        ("msg-ngram", "DRAFT ngram\nPARAMETER draft_num_predict 6\n" + FIXED_LENGTH),
        ("msg-tooly", f'TEMPLATE """{TOOLS_TEMPLATE}"""\n'),
        ("msg-thinker", f'TEMPLATE """{THINK_TEMPLATE}"""\n'),
    ):
        path = base / f"{name}.Modelfile"
        path.write_text(head + body)
        daemon.create(name, path)
    yield daemon


def _client(d: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.url, api_key="unused", timeout=300, max_retries=0)


def _sdk(body: dict[str, Any]) -> Any:
    """A raw body as the SDK's arguments (temperature goes in ``extra_body``)."""
    out = {k: v for k, v in body.items() if k != "temperature"}
    return (
        {**out, "extra_body": {"temperature": body["temperature"]}}
        if "temperature" in body
        else out
    )


def _events(d: Daemon, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The raw SSE stream: (event name, data) pairs, checked to agree with each other."""
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "ignored"}
    with httpx.Client(base_url=d.url, timeout=300) as c:
        r = c.post("/v1/messages", json={**body, "stream": True}, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    out = []
    for chunk in r.text.strip().split("\n\n"):
        name_line, data_line = chunk.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


def test_create_is_the_same_greedy_text_as_api_chat_and_counts_its_tokens(served: Daemon) -> None:
    client = _client(served)
    messages: Any = [{"role": "user", "content": QUESTION}]
    reply = client.messages.create(
        model="msg-plain", system=SYSTEM, messages=messages, max_tokens=24, extra_body=GREEDY
    )
    with httpx.Client(base_url=served.url, timeout=300) as c:
        native = c.post(
            "/api/chat",
            json={
                "model": "msg-plain",
                "messages": [{"role": "system", "content": SYSTEM}, *messages],
                "stream": False,
                "options": {"temperature": 0, "num_predict": 24},
            },
        ).json()
    (block,) = reply.content
    assert block.type == "text" and block.text == native["message"]["content"]
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "msg-plain"
    assert reply.id.startswith("msg_")
    assert reply.stop_reason == ("max_tokens" if native["done_reason"] == "length" else "end_turn")
    assert reply.stop_sequence is None
    assert reply.usage.output_tokens == native["eval_count"]
    counted = client.messages.count_tokens(model="msg-plain", system=SYSTEM, messages=messages)
    assert counted.input_tokens > 10
    cached = reply.usage.cache_read_input_tokens or 0
    assert reply.usage.input_tokens + cached == counted.input_tokens

    # a stop sequence the greedy text reaches ends it there, and is named
    words = block.text.split()
    stop = " " + words[2]
    cut = client.messages.create(
        model="msg-plain",
        system=SYSTEM,
        messages=messages,
        max_tokens=24,
        extra_body=GREEDY,
        stop_sequences=["never-there", stop],
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].type == "text"
    assert cut.content[0].text == block.text[: block.text.index(stop)]


def test_the_stream_is_the_documented_event_sequence(served: Daemon) -> None:
    body = {
        "model": "msg-plain",
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        "max_tokens": 12,
        "temperature": 0,
        "metadata": {"user_id": "someone"},
    }
    events = _events(served, body)
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 2
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_")
    assert {k: start[k] for k in ("type", "role", "model", "content", "stop_reason")} == {
        "type": "message",
        "role": "assistant",
        "model": "msg-plain",
        "content": [],
        "stop_reason": None,
    }
    assert start["stop_sequence"] is None and start["usage"]["input_tokens"] > 10
    assert events[1][1] == {"type": "ping"}
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = ""
    for _, data in events[3 : 3 + deltas]:
        assert data["index"] == 0 and data["delta"]["type"] == "text_delta"
        assert set(data["delta"]) == {"type", "text"}
        text += data["delta"]["text"]
    assert events[3 + deltas][1] == {"type": "content_block_stop", "index": 0}
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 12
    assert events[-1][1] == {"type": "message_stop"}

    # the SDK's accumulator builds the same message as the unstreamed call
    client = _client(served)
    ask = _sdk(body)
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    whole = client.messages.create(**ask)
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.model_dump(exclude={"id", "usage"}) == whole.model_dump(exclude={"id", "usage"})
    assert final.usage.output_tokens == whole.usage.output_tokens == 12


def test_forced_tool_use_and_a_tool_result_round_trip(served: Daemon) -> None:
    client = _client(served)
    forced = client.messages.create(
        model="msg-tooly",
        messages=PARIS,  # type: ignore[arg-type]
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=64,
        extra_body=GREEDY,
    )
    assert forced.stop_reason == "tool_use"
    (call,) = forced.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert isinstance(call.input, dict) and isinstance(call.input.get("city"), str)

    # "any", streamed: the accumulator assembles the input from input_json_delta
    with client.messages.stream(
        model="msg-tooly",
        messages=PARIS,  # type: ignore[arg-type]
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "any"},
        max_tokens=64,
        extra_body=GREEDY,
    ) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and "input_json" in kinds
    (any_call,) = streamed.content
    assert any_call.type == "tool_use" and any_call.name in ("get_weather", "get_time")
    assert isinstance(any_call.input, dict) and any_call.input

    answer = client.messages.create(
        model="msg-tooly",
        messages=[
            *PARIS,
            {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 24 C"}
                ],
            },
        ],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "none"},
        max_tokens=32,
        extra_body=GREEDY,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text  # type: ignore[union-attr]


def test_thinking_blocks_streamed_and_whole_and_sent_back(served: Daemon) -> None:
    client = _client(served)
    history: list[Any] = []
    for question, thinking, answer in (
        ("What is 2+2?", "Two plus two is four.", "4"),
        ("What is the capital of Italy?", "Italy's capital city is Rome.", "Rome"),
    ):
        history.append({"role": "user", "content": question})
        blocks = [
            {"type": "thinking", "thinking": thinking, "signature": "any"},
            {"type": "text", "text": answer},
        ]
        history.append({"role": "assistant", "content": blocks})
    history.append({"role": "user", "content": "What is 3+5?"})
    ask: Any = {
        "model": "msg-thinker",
        "messages": history,
        "max_tokens": 2048,
        "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    whole = client.messages.create(**_sdk(ask))
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking == "Three plus five is eight."  # type: ignore[union-attr]
    assert whole.content[0].signature  # type: ignore[union-attr]
    assert whole.content[1].text == "8" and whole.stop_reason == "end_turn"  # type: ignore[union-attr]

    events = _events(served, ask)
    kinds = [(n, d.get("delta", d.get("content_block", {})).get("type")) for n, d in events]
    first_text = kinds.index(("content_block_start", "text"))
    assert kinds[2] == ("content_block_start", "thinking")
    assert kinds[first_text - 2 : first_text] == [
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
    ]
    assert ("content_block_delta", "thinking_delta") in kinds[3 : first_text - 2]
    with client.messages.stream(**_sdk(ask)) as stream:
        final = stream.get_final_message()
    assert final.model_dump(exclude={"id", "usage"}) == whole.model_dump(exclude={"id", "usage"})

    off = client.messages.create(**_sdk({**ask, "thinking": {"type": "disabled"}}))
    assert [b.type for b in off.content] == ["text"]


def test_errors_have_anthropics_shape_and_status(served: Daemon) -> None:
    client = _client(served)
    user: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", messages=user, max_tokens=8)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    bad: list[tuple[dict[str, Any], str]] = [
        ({"tool_choice": {"type": "tool"}, "tools": [WEATHER]}, "tool_choice"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "not supported"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4}}, "does not support thinking"),
        ({"stop_sequences": "END"}, "stop_sequences"),
    ]
    for extra, words in bad:
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model="msg-plain", messages=user, max_tokens=8, **extra)
        assert words in str(refused.value), extra
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    image["source"]["data"] = "iVBORw0KGgo="  # type: ignore[index]
    with httpx.Client(base_url=served.url, timeout=60) as c:
        r = c.post(
            "/v1/messages",
            json={
                "model": "msg-plain",
                "messages": [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}],
                "max_tokens": 8,
            },
        )
        assert r.status_code == 400
        assert r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert "cannot read images" in r.json()["error"]["message"]
        no_max = c.post("/v1/messages", json={"model": "msg-plain", "messages": user})
        assert no_max.status_code == 400 and "max_tokens" in no_max.json()["error"]["message"]


def test_drafts_are_counted_in_usage_and_change_nothing(served: Daemon) -> None:
    client = _client(served)
    code = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    messages: Any = [
        {"role": "user", "content": f"Repeat this code exactly:\n{code}"},
    ]
    drafted = client.messages.create(
        model="msg-ngram", messages=messages, max_tokens=48, extra_body=GREEDY
    )
    plain = client.messages.create(
        model="msg-ngram",
        messages=messages,
        max_tokens=48,
        extra_body={"temperature": 0, "draft": "off"},
    )
    assert drafted.content == plain.content
    extra = drafted.usage.model_extra or {}
    assert extra["draft_count"] > 0 and 0 <= extra["draft_accepted_count"] <= extra["draft_count"]
    assert (plain.usage.model_extra or {})["draft_count"] == 0
