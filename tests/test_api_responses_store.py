"""Stateful ``/v1/responses`` through a real daemon with the official ``openai`` SDK and
SmolLM2: ``previous_response_id`` over three turns with a tool call in the middle and a daemon
restart between turns (each turn the same answer as the whole conversation sent statelessly),
retrieve, delete, ``input_items``, ``store: false``, OpenAI's 404 shape and ``truncation``.
The store's own rules (eviction at the bound, a damaged record, ``MODELHUB_RESPONSES_STORE=0``,
ids checked before a path is made) run in-process over fake runners (``tests/fakes``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q4_1
from modelhub.server.request_models import parse_body
from modelhub.server.responses_request import ResponsesBody, chat_request
from tests.fakes.daemon import BASE_URL, FakeDaemon, fake_daemon
from tests.test_serving_replies import TOOLS_TEMPLATE, WEATHER

pytestmark = pytest.mark.slow

TOOL = {"type": "function", **WEATHER["function"]}
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 24}


def _create(d: Daemon, tmp: Path, name: str, text: str) -> None:
    mf = tmp / f"{name}.Modelfile"
    mf.write_text(text)
    d.create(name, mf)


def _oai(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _error(exc: openai.APIStatusError) -> Any:
    return exc.response.json()


def test_three_turns_with_a_tool_call_and_a_restart(tmp_path: Path) -> None:
    models = tmp_path / "models"
    d = start_daemon(models, tmp_path / "daemon.log")
    try:
        _create(d, tmp_path, "tooly", f'FROM {smollm2_q4_1()}\nTEMPLATE """{TOOLS_TEMPLATE}"""\n')
        client = _oai(d)
        question = "What is the weather in Paris?"
        first = client.responses.create(
            model="tooly", input=question, tools=[TOOL], tool_choice="required", **GREEDY
        )
        (call,) = [item for item in first.output if item.type == "function_call"]
        assert first.store is True and first.previous_response_id is None
        again = client.responses.retrieve(first.id)
        assert again.id == first.id and again.output == first.output
        items = list(client.responses.input_items.list(first.id))
        assert [(i.type, i.role, i.content[0].text) for i in items] == [  # type: ignore[union-attr]
            ("message", "user", question)
        ]
    finally:
        d.stop()

    d = start_daemon(models, tmp_path / "daemon2.log")  # the same store, a new daemon
    try:
        client = _oai(d)
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}
        second = client.responses.create(
            model="tooly",
            previous_response_id=first.id,
            input=[output],
            tools=[TOOL],
            **GREEDY,  # type: ignore[arg-type]
        )
        assert second.previous_response_id == first.id
        history: list[Any] = [
            {"role": "user", "content": question},
            {"type": "function_call", "call_id": call.call_id, "name": call.name},
            output,
        ]
        history[1]["arguments"] = call.arguments
        whole = client.responses.create(
            model="tooly", input=history, tools=[TOOL], store=False, **GREEDY
        )
        assert second.output_text == whole.output_text and second.output_text
        assert second.usage and whole.usage
        assert second.usage.input_tokens == whole.usage.input_tokens

        third = client.responses.create(
            model="tooly", previous_response_id=second.id, input="And in Rome?", **GREEDY
        )
        history += [
            {"role": "assistant", "content": second.output_text},
            {"role": "user", "content": "And in Rome?"},
        ]
        whole = client.responses.create(model="tooly", input=history, store=False, **GREEDY)
        assert third.output_text == whole.output_text and third.usage and whole.usage
        assert third.usage.input_tokens == whole.usage.input_tokens
        assert whole.store is False
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(whole.id)  # store=False: nothing kept

        client.responses.delete(second.id)
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.retrieve(second.id)
        body = _error(missing.value)["error"]  # OpenAI's 404: a message, no code
        assert {k: v for k, v in body.items() if k != "message"} == {
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        assert body["message"].startswith(f"Response with id '{second.id}' not found.")
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(model="tooly", previous_response_id=second.id, input="hi")
        assert _error(missing.value)["error"]["param"] == "previous_response_id"
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(second.id)
        # the third turn does not need the second's record: it holds its whole conversation
        assert client.responses.retrieve(third.id).output_text == third.output_text
    finally:
        d.stop()


def _fake_oai(d: FakeDaemon) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=BASE_URL + "/v1", api_key="unused", max_retries=0, http_client=d.http_client()
    )


def test_eviction_damage_and_storing_off(tmp_path: Path) -> None:
    """The store of answers is the daemon's: over fake runners, two daemons on one store."""
    models = tmp_path / "models"
    with fake_daemon(tmp_path, env={"MODELHUB_RESPONSES_MAX": "2"}) as d:
        d.add_model("smol")
        client = _fake_oai(d)
        short = {"temperature": 0, "max_output_tokens": 2}
        ids = [
            client.responses.create(model="smol", input=f"Say {n}.", **short).id for n in range(3)
        ]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[0])  # the oldest went at the bound
        assert {client.responses.retrieve(i).id for i in ids[1:]} == set(ids[1:])
        assert sorted(p.name for p in (models / "responses").iterdir()) == sorted(
            f"{i}.json" for i in ids[1:]
        )

        (models / "responses" / f"{ids[1]}.json").write_bytes(b'{"format": 1, "respo')
        with d.http_client() as c:
            r = c.get(f"/v1/responses/{ids[1]}")
            assert r.status_code == 500, r.text
            message = r.json()["error"]["message"]
            assert f"the stored response '{ids[1]}' is damaged" in message and "removed" in message
            assert c.get(f"/v1/responses/{ids[1]}").status_code == 404
            assert c.get(f"/v1/responses/{ids[2]}").status_code == 200  # the daemon goes on

    with fake_daemon(tmp_path, env={"MODELHUB_RESPONSES_STORE": "0"}) as d:
        client = _fake_oai(d)
        r = client.responses.create(model="smol", input="Hi", temperature=0, max_output_tokens=2)
        assert r.store is False
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(r.id)
        with pytest.raises(openai.BadRequestError, match="MODELHUB_RESPONSES_STORE=0"):
            client.responses.create(model="smol", previous_response_id=ids[2], input="Hi")


def test_truncation(tmp_path: Path) -> None:
    """``truncation``: "disabled" (the default) refuses what does not fit; "auto" cuts as chat
    does (a real runner counts SmolLM2's tokens)."""
    models = tmp_path / "models"
    d = start_daemon(models, tmp_path / "daemon.log")
    try:
        _create(d, tmp_path, "smol", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 256\n")
        client = _oai(d)
        short = {"temperature": 0, "max_output_tokens": 2}
        turns: list[dict[str, Any]] = []
        for n in range(12):
            turns += [
                {"role": "user", "content": f"Tell me a fact about the number {n}, please."},
                {"role": "assistant", "content": f"The number {n} is a number. " * 3},
            ]
        turns.append({"role": "user", "content": "Thanks. What is 2+2?"})
        with pytest.raises(openai.BadRequestError, match="context holds 256"):
            client.responses.create(model="smol", input=turns, **short)  # type: ignore[arg-type]
        cut = client.responses.create(model="smol", input=turns, truncation="auto", **short)  # type: ignore[arg-type]
        chat = client.chat.completions.create(
            model="smol", messages=turns, max_tokens=2, temperature=0
        )  # type: ignore[arg-type]
        assert cut.truncation == "auto" and cut.usage and chat.usage
        assert cut.usage.input_tokens == chat.usage.prompt_tokens < 256
    finally:
        d.stop()


def test_stored_reasoning_goes_back_with_the_turn_it_led_to() -> None:
    """A reasoning item (as a stored response's output holds it) becomes the thinking of the
    assistant turn after it, with its call; ``instructions`` are the request's own."""
    context = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Greet back."}]},
        {"type": "function_call", "call_id": "c1", "name": "wave", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "waved"},
    ]
    body = {"model": "m", "instructions": "Be brief.", "input": "Again"}
    chat = chat_request(parse_body(ResponsesBody, body), context)
    messages = chat["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[2]["reasoning_content"] == "Greet back."
    assert messages[2]["tool_calls"][0]["function"]["name"] == "wave"
    assert json.loads(json.dumps(chat))["truncate"] is False


def test_response_ids_never_reach_the_disk_unchecked(fake: FakeDaemon) -> None:
    with fake.http_client() as c:
        assert c.get("/v1/responses/resp_..%2F..%2Fmanifests").status_code == 404
        for ident in ("resp_..", "resp_XYZ", "nope"):
            r = c.get(f"/v1/responses/{ident}")
            assert r.status_code == 404 and r.json()["error"]["code"] is None, r.text
