"""Every route parses its body once, into the models of ``server/request_models.py`` (Ollama's
routes), ``server/openai_models.py`` (/v1/chat/completions, /v1/completions, /v1/embeddings),
``server/anthropic_request.py`` (/v1/messages) and ``server/responses_request.py``
(/v1/responses), and the OpenAPI document's request bodies are those models' schemas: one
definition of each shape. Bad input keeps this API's messages (Ollama's where it has them) and
status; unknown fields are ignored and ``null`` counts as absent, as in Ollama and
OpenAI-compatible servers. In-process over fake runners."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from modelhub.config import Settings
from modelhub.errors import InputError, InvalidNameError
from modelhub.server import request_models as rm
from modelhub.server.anthropic_request import CountTokensBody, MessagesBody
from modelhub.server.app import create_app
from modelhub.server.openai_models import (
    ChatCompletionBody,
    ChatFields,
    CompletionBody,
    EmbeddingsRequestBody,
    chat_fields,
)
from modelhub.server.responses_request import ResponsesBody
from tests.fakes.daemon import FakeDaemon, fake_daemon

ROUTES: dict[str, type[rm.Body]] = {
    "/api/generate": rm.GenerateBody,
    "/api/chat": rm.ChatBody,
    "/api/embed": rm.EmbedBody,
    "/api/embeddings": rm.EmbeddingsBody,
    "/api/show": rm.ShowBody,
    "/api/delete": rm.DeleteBody,
    "/api/verify": rm.VerifyBody,
    "/api/copy": rm.CopyBody,
    "/api/pull": rm.PullBody,
    "/api/create": rm.CreateBody,
    "/v1/chat/completions": ChatCompletionBody,
    "/v1/completions": CompletionBody,
    "/v1/embeddings": EmbeddingsRequestBody,
    "/v1/messages": MessagesBody,
    "/v1/messages/count_tokens": CountTokensBody,
    "/v1/responses": ResponsesBody,
}


def test_the_openapi_bodies_are_the_models_schemas(tmp_path: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = create_app(Settings.from_env({"MODELHUB_MODELS": str(tmp_path)})).openapi()
    for path, model in ROUTES.items():
        (operation,) = [op for op in spec["paths"][path].values() if "requestBody" in op]
        assert operation["requestBody"] == rm.openapi_body(model)["requestBody"], path
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert "$defs" not in str(schema) and "$ref" not in str(schema), path
    generate = rm.openapi_body(rm.GenerateBody)["requestBody"]["content"]["application/json"]
    assert generate["schema"]["required"] == ["model"]
    assert {"model", "prompt", "think", "keep_alive", "format"} <= set(
        generate["schema"]["properties"]
    )
    create = rm.openapi_body(rm.CreateBody)["requestBody"]["content"]["application/json"]
    assert (
        "from" in create["schema"]["properties"]
        and "quantization" not in create["schema"]["properties"]
    )


def parse(body: type[rm.Body], **data: Any) -> Any:
    return rm.parse_body(body, data)


def refused(model: type[rm.Body], data: dict[str, Any]) -> InputError:
    with pytest.raises(InputError) as caught:
        rm.parse_body(model, data)
    return caught.value


Table = dict[type[rm.Body], list[tuple[dict[str, Any], str]]]


def refusals(table: Table) -> list[tuple[type[rm.Body], dict[str, Any], str]]:
    """A table of bad bodies by their model, as parametrize's rows: (model, body, message)."""
    return [(model, data, message) for model, rows in table.items() for data, message in rows]


BAD_FIELDS: Table = {
    rm.GenerateBody: [
        ({"model": "m", "prompt": 3}, 'field "prompt" must be of type string, got integer'),
        ({"model": "m", "stream": "yes"}, 'field "stream" must be of type boolean, got string'),
        ({"model": "m", "options": []}, 'field "options" must be of type object, got array'),
        ({"model": "m", "context": "x"}, 'field "context" must be of type array, got string'),
        ({"model": "m", "context": [1, True]}, 'field "context" must be an array of token ids'),
        (
            {"model": "m", "raw": True, "system": "s"},
            "raw mode does not support template, system, or context",
        ),
        (
            {"model": "m", "format": "xml"},
            "invalid format: 'xml'; expected \"json\" or a valid JSON Schema object",
        ),
        (
            {"model": "m", "think": "ultra"},
            'invalid think value: "ultra" (must be "high", "medium", "low", "max", true, or false)',
        ),
        ({"model": "m", "images": "abc"}, 'field "images" must be an array of base64 strings'),
        ({"model": "m", "images": ["@@@"]}, "images[0]: invalid base64 data"),
        ({"model": "m", "grammar": 1}, 'field "grammar" must be a GBNF string'),
        ({"model": "m", "logprobs": 1}, 'field "logprobs" must be a boolean'),
        ({"model": "m", "top_logprobs": 1.5}, 'field "top_logprobs" must be an integer'),
        (
            {"model": "m", "keep_alive": "5"},
            "keep_alive: invalid duration '5' (missing unit in duration; e.g. '5m', '30s', '-1')",
        ),
    ],
    rm.ChatBody: [
        ({"model": "m", "messages": {"a": 1}}, 'field "messages" must be an array'),
        (
            {"model": "m", "messages": [{"content": 1}]},
            "messages[0] must be an object with a string content",
        ),
        (
            {"model": "m", "messages": [{"role": "bot"}]},
            "messages[0]: role must be system, user, assistant or tool",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "images": [1]}]},
            'field "messages[0].images" must be an array of base64 strings',
        ),
        ({"model": "m", "tools": {}}, 'field "tools" must be of type array, got object'),
    ],
    rm.EmbedBody: [
        ({"model": "m", "input": 3}, "input must be a non-empty string or array of strings"),
        (
            {"model": "m", "dimensions": 1.5},
            'field "dimensions" must be of type integer, got number',
        ),
    ],
    rm.CreateBody: [
        (
            {"model": "m", "files": {"a.gguf": 1}},
            "field \"files\": value for 'a.gguf' must be a string digest",
        ),
        ({"model": "m", "license": [1]}, 'field "license" must be a string or an array of strings'),
        (
            {"model": "m", "messages": "hi"},
            'field "messages" must be an array of {"role","content"} objects',
        ),
        (
            {"model": "m", "parameters": "x"},
            'field "parameters" must be of type object, got string',
        ),
    ],
    rm.CopyBody: [
        ({"source": "a"}, "destination is required"),
    ],
    rm.PullBody: [
        ({"model": "m", "insecure": "no"}, 'field "insecure" must be of type boolean, got string'),
    ],
    rm.VerifyBody: [
        ({"model": 1}, 'field "model" must be of type string, got integer'),
    ],
}


def test_the_model_is_read_first_and_alike() -> None:
    assert str(refused(rm.GenerateBody, {"prompt": 3})) == "model is required"
    assert str(refused(rm.ShowBody, {"model": "", "verbose": "x"})) == "model is required"
    padded = refused(rm.PullBody, {"model": " m"})
    assert type(padded) is InvalidNameError
    assert parse(rm.ChatBody, name="old").model == "old"  # Ollama's deprecated alias
    with pytest.raises(InputError, match="model is required"):
        parse(ChatCompletionBody, name="old", messages=[])  # not on OpenAI's routes


def test_unknown_fields_are_ignored_and_null_is_absent() -> None:
    body = parse(
        rm.GenerateBody,
        model="m",
        prompt=None,
        stream=None,
        shift=None,
        think=None,
        whatever={"x": 1},
    )
    assert (body.prompt, body.stream, body.shift, body.think) == ("", True, True, None)
    assert not hasattr(body, "whatever")


def test_values_come_out_typed() -> None:
    body = parse(
        rm.GenerateBody,
        model="m",
        keep_alive="5m",
        format="",
        think="high",
        prediction=7,  # anything but text is ignored, as before
        context=[1, 2],
    )
    assert (body.keep_alive, body.format, body.think, body.prediction) == (
        300.0,
        None,
        "high",
        None,
    )
    chat = parse(rm.ChatBody, model="m", messages=[{"role": "USER"}], _debug_render_only=True)
    assert chat.messages == [{"role": "user", "content": ""}] and chat.debug_render_only
    assert parse(rm.EmbedBody, model="m", input="hi").input == ["hi"]
    create = parse(rm.CreateBody, model="m", license="MIT", quantization="q8_0", **{"from": "b"})
    assert (create.license, create.quantization, create.from_) == (["MIT"], "q8_0", "b")
    assert parse(rm.CopyBody, source="a", destination="b").destination == "b"


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


BAD_OPENAI_FIELDS: Table = {
    ChatCompletionBody: [
        ({"model": "m"}, "messages must be a non-empty array"),
        ({**CHAT, "messages": []}, "messages must be a non-empty array"),
        ({**CHAT, "messages": [1]}, "messages[0] must be an object"),
        ({**CHAT, "messages": [{"role": "bot"}]}, "messages[0].role 'bot' is not supported"),
        (
            {**CHAT, "messages": [{"role": "user", "content": [{"type": "file"}]}]},
            "messages[0]: content part type 'file' is not supported",
        ),
        (
            {**CHAT, "messages": [{"role": "user", "content": 3}]},
            "messages[0]: content must be a string or an array of parts",
        ),
        (
            {
                **CHAT,
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]}
                ],
            },
            "messages[0].content[0]: remote image URLs are not fetched; send the image as a "
            "data: URL (data:image/png;base64,...)",
        ),
        (
            {**CHAT, "messages": [{"role": "assistant", "tool_calls": {}}]},
            "messages[0].tool_calls must be an array of objects",
        ),
        ({**CHAT, "max_tokens": 0}, "max_tokens must be a positive integer"),
        (
            {**CHAT, "max_completion_tokens": "8"},
            "max_completion_tokens must be a positive integer",
        ),
        ({**CHAT, "temperature": "hot"}, 'field "temperature" must be of type number, got string'),
        (
            {**CHAT, "presence_penalty": -(10**400)},
            f'field "presence_penalty" is out of range for a number, got {-(10**400)}',
        ),
        ({**CHAT, "seed": 1.5}, 'field "seed" must be of type integer, got number'),
        ({**CHAT, "stop": [1]}, "stop must be a string or an array of strings"),
        ({**CHAT, "response_format": "json"}, "response_format must be an object"),
        (
            {**CHAT, "response_format": {"type": "xml"}},
            "response_format type 'xml' is not supported",
        ),
        (
            {**CHAT, "response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema.schema must be a JSON schema object",
        ),
        ({**CHAT, "prediction": "hello"}, 'prediction must be {"type": "content", "content": ...}'),
        (
            {**CHAT, "reasoning_effort": "huge"},
            'reasoning_effort must be "none", "minimal", "low", "medium", "high", "xhigh", '
            '"ultra" or "max"',
        ),
        ({**CHAT, "think": "lots"}, 'think must be true, false, "low", "medium", "high" or "max"'),
        ({**CHAT, "logprobs": 1}, 'field "logprobs" must be a boolean'),
        ({**CHAT, "top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        (
            {**CHAT, "logprobs": True, "top_logprobs": 21},
            "top_logprobs must be between 0 and 20, got 21",
        ),
        ({**CHAT, "grammar": 1}, 'field "grammar" must be a GBNF string'),
        ({**CHAT, "tools": [1]}, 'field "tools[0]" must be of type object, got integer'),
        (
            {**CHAT, "stream_options": []},
            'field "stream_options" must be of type object, got array',
        ),
        (
            {**CHAT, "_debug_render_only": "yes"},
            'field "_debug_render_only" must be of type boolean, got string',
        ),
        (
            {**CHAT, "keep_alive": "5"},
            "keep_alive: invalid duration '5' (missing unit in duration; e.g. '5m', '30s', '-1')",
        ),
    ],
    CompletionBody: [
        ({"model": "m"}, "prompt must be a string"),
        ({"model": "m", "prompt": ["a", "b"]}, "prompt must be a string"),
        (
            {"model": "m", "prompt": "a", "logprobs": True},
            "logprobs must be an integer between 0 and 5 on /v1/completions",
        ),
        (
            {"model": "m", "prompt": "a", "suffix": 1},
            'field "suffix" must be of type string, got integer',
        ),
    ],
    EmbeddingsRequestBody: [
        ({"model": "m"}, "input must be a non-empty string or array of strings"),
        (
            {"model": "m", "input": "a", "dimensions": "8"},
            'field "dimensions" must be of type integer, got string',
        ),
        (
            {"model": "m", "input": "a", "encoding_format": "hex"},
            'encoding_format must be "float" or "base64"',
        ),
    ],
}


USER = [{"role": "user", "content": "hi"}]
MSG = {"model": "m", "messages": USER, "max_tokens": 8}
RESP = {"model": "m", "input": "hi"}

BAD_TRANSLATED_FIELDS: Table = {
    MessagesBody: [
        ({"model": "m", "messages": USER}, "max_tokens: Field required"),
        ({**MSG, "max_tokens": 0}, "max_tokens: must be a positive integer"),
        ({"model": "m", "max_tokens": 8}, "messages: must be a non-empty array"),
        (
            {**MSG, "messages": [{"role": "system", "content": "x"}]},
            ('messages.0.role: must be "user" or "assistant"'),
        ),
        ({**MSG, "system": 3}, "system: must be a string or an array of text blocks"),
        ({**MSG, "stop_sequences": "END"}, "stop_sequences: must be an array of strings"),
        ({**MSG, "top_k": -1}, "top_k: must be a non-negative integer"),
        ({**MSG, "temperature": "hot"}, 'field "temperature" must be of type number, got string'),
        ({**MSG, "tools": {}}, "tools: must be an array of tools"),
        ({**MSG, "tools": [{"name": "f"}]}, "tools.0.input_schema: must be a JSON schema object"),
        (
            {**MSG, "tool_choice": {"type": "tool"}},
            (
                'tool_choice: must be {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
                '{"type": "tool", "name": ...}'
            ),
        ),
        ({**MSG, "thinking": True}, "thinking: must be an object"),
        (
            {**MSG, "thinking": {"type": "enabled", "budget_tokens": 8}},
            ("thinking.budget_tokens: must be less than max_tokens"),
        ),
        (
            {**MSG, "output_config": {"format": {"type": "xml"}}},
            ('output_config.format: must be {"type": "json_schema", "schema": ...}'),
        ),
        ({**MSG, "metadata": []}, "metadata: must be an object"),
    ],
    CountTokensBody: [({"model": "m", "messages": []}, "messages: must be a non-empty array")],
    ResponsesBody: [
        ({"model": "m"}, "input is required: a string or an array of input items"),
        ({**RESP, "input": 3}, "input must be an array"),
        ({**RESP, "input": [1]}, "input[0] must be an object"),
        ({**RESP, "instructions": 3}, "instructions must be a string"),
        ({**RESP, "store": "yes"}, "store must be true or false"),
        (
            {**RESP, "truncation": "middle"},
            ('truncation must be "disabled" (the default) or "auto"'),
        ),
        (
            {**RESP, "previous_response_id": ""},
            ("previous_response_id must be a response id (resp_...)"),
        ),
        ({**RESP, "max_output_tokens": 0}, "max_output_tokens must be a positive integer"),
        (
            {**RESP, "tools": [{"type": "web_search"}]},
            ("tools[0]: only function tools are supported, not 'web_search'"),
        ),
        (
            {**RESP, "text": {"format": {"type": "yaml"}}},
            ('text.format must be {"type": "text"}, "json_object" or "json_schema"'),
        ),
        (
            {**RESP, "background": True},
            (
                "background is not supported: use previous_response_id, or send the whole "
                "conversation in input"
            ),
        ),
        ({**RESP, "reasoning": "high"}, 'field "reasoning" must be of type object, got string'),
    ],
}


@pytest.mark.parametrize(
    ("model", "data", "message"),
    refusals(BAD_FIELDS) + refusals(BAD_OPENAI_FIELDS) + refusals(BAD_TRANSLATED_FIELDS),
)
def test_bad_fields_get_their_messages(
    model: type[rm.Body], data: dict[str, Any], message: str
) -> None:
    """Ollama's bodies and the OpenAI-compatible ones alike."""
    assert str(refused(model, data)) == message


def test_openai_values_come_out_typed_and_unknown_fields_are_ignored() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    body = parse(
        ChatCompletionBody,
        model="m",
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "be "}, image]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "hmm",
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "4"},
        ],
        stop="END",
        max_completion_tokens=8,
        response_format={"type": "json_object"},
        prediction={"type": "content", "content": [{"type": "text", "text": "guess"}]},
        reasoning_effort="xhigh",
        stream_options={"include_usage": True, "other": 1},
        logprobs=True,
        _debug_render_only=True,
        n=3,  # unknown to this server: ignored, as OpenAI-compatible servers do
        user="someone",
        top_k=None,
    )
    system, assistant, tool = body.messages
    assert system == {"role": "system", "content": "be ", "images": ["iVBORw0KGgo="]}
    assert assistant["thinking"] == "hmm" and assistant["content"] == ""
    assert (tool["tool_call_id"], tool["tool_name"]) == ("c1", "f")
    assert (body.stop, body.max_completion_tokens, body.response_format) == (["END"], 8, "json")
    assert (body.prediction, body.thinking, body.alternatives()) == ("guess", "max", 0)
    assert body.stream_options.include_usage and body.debug_render_only and body.top_k is None
    assert not hasattr(body, "n") and not hasattr(body, "user")
    schema = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    assert parse(ChatCompletionBody, **CHAT, response_format=schema).response_format == {
        "type": "object"
    }
    off = parse(ChatCompletionBody, **CHAT, reasoning_effort="none", think=True)
    assert off.thinking is False  # OpenAI's name wins over Ollama's
    assert parse(CompletionBody, model="m", prompt=["one"], logprobs=2).prompt == "one"
    embed = parse(EmbeddingsRequestBody, model="m", input="a", encoding_format="base64")
    assert (embed.input, embed.encoding_format, embed.dimensions) == (["a"], "base64", 0)


def test_translated_requests_parse_as_chat_fields() -> None:
    """/v1/responses, /v1/messages and transcriptions hand the chat path a ChatFields: their
    messages may come separately, and their fields are checked as a chat body's."""
    fields = chat_fields({"temperature": 0.5, "stop": ["x"], "think": False, "model": "m"})
    assert isinstance(fields, ChatFields) and fields.messages is None
    assert (fields.temperature, fields.stop, fields.thinking) == (0.5, ["x"], False)
    with pytest.raises(InputError, match="messages must be a non-empty array"):
        chat_fields({"messages": []})
    with pytest.raises(InputError, match='field "top_p" must be of type number, got string'):
        chat_fields({"top_p": "high"})


def test_translated_bodies_come_out_in_the_chat_paths_terms() -> None:
    """/v1/messages: Anthropic's blocks, tools and tool_choice in the chat's shapes as parsed;
    /v1/responses: input as items with ids, the echoed fields as sent, the chat request made
    from them."""
    blocks = [
        {"type": "text", "text": "Weather?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
    ]
    body = parse(
        MessagesBody,
        **MSG,
        system=[{"type": "text", "text": "Be brief."}],
        stop_sequences=["END"],
        tools=[{"name": "weather", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any"},
        thinking={"type": "enabled", "budget_tokens": 4},
        keep_alive="1m",
    )
    assert body.chat_messages()[0] == {"role": "system", "content": "Be brief."}
    chat = body.chat()
    assert (chat.max_tokens, chat.stop, chat.tool_choice, chat.think) == (
        8,
        ["END"],
        "required",
        True,
    )
    assert chat.tools[0]["function"]["parameters"] == {"type": "object"}
    assert chat.keep_alive == 60.0
    picture = parse(MessagesBody, **{**MSG, "messages": [{"role": "user", "content": blocks}]})
    assert picture.messages == [{"role": "user", "content": "Weather?", "images": ["AA=="]}]
    assert parse(CountTokensBody, model="m", messages=USER).chat().max_tokens is None

    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    asked = parse(
        ResponsesBody,
        **RESP,
        tools=[tool],
        reasoning={"effort": "low"},
        text={"format": {"type": "json_object"}},
        max_output_tokens=5,
        truncation="auto",
    )
    (item,) = asked.input
    assert item["type"] == "message" and item["id"].startswith("msg_")
    assert asked.tools == [tool]  # as sent: the response repeats them
    request = asked.chat()
    assert request.tools == [
        {"type": "function", "function": {k: tool[k] for k in ("name", "parameters")}}
    ]
    assert (request.max_tokens, request.thinking, request.response_format) == (5, "low", "json")
    assert request.truncate and not parse(ResponsesBody, **RESP).chat().truncate


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    with fake_daemon(tmp_path_factory.mktemp("bodies")) as d:
        d.add_model("tiny")
        yield d


def test_routes_answer_with_the_models_messages(app: FakeDaemon) -> None:
    for path, body, message in [
        (
            "/api/generate",
            {"model": "tiny", "context": [1, "a"]},
            'field "context" must be an array of token ids',
        ),
        (
            "/api/chat",
            {"model": "tiny", "truncate": 1},
            'field "truncate" must be of type boolean, got integer',
        ),
        (
            "/api/show",
            {"model": "tiny", "verbose": "yes"},
            'field "verbose" must be of type boolean, got string',
        ),
        (
            "/api/copy",
            {"source": "tiny", "destination": " x"},
            "invalid model name ' x': remove the spaces around it",
        ),
        (
            "/api/create",
            {"model": "n", "files": {"a.gguf": 1}},
            "field \"files\": value for 'a.gguf' must be a string digest",
        ),
        ("/api/create", {"model": "n", "modelfile": 1}, 'field "modelfile" must be a string'),
        (
            "/api/pull",
            {"model": "x", "no_draft": "yes"},
            'field "no_draft" must be of type boolean, got string',
        ),
    ]:
        r = app.http.post(path, json=body)
        assert (r.status_code, r.json()) == (400, {"error": message}), path
    shown = app.http.post("/api/show", json={"model": "tiny", "verbose": None, "extra": 1})
    assert shown.status_code == 200, shown.text


def test_openai_routes_answer_with_the_models_messages_in_openais_shape(app: FakeDaemon) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    for path, body, message in [
        (
            "/v1/chat/completions",
            {**chat, "stop": 3},
            "stop must be a string or an array of strings",
        ),
        (
            "/v1/chat/completions",
            {**chat, "stream_options": "x"},
            'field "stream_options" must be of type object, got string',
        ),
        ("/v1/completions", {"model": "tiny"}, "prompt must be a string"),
        (
            "/v1/embeddings",
            {"model": "tiny", "input": "a", "dimensions": 1.5},
            'field "dimensions" must be of type integer, got number',
        ),
    ]:
        r = app.http.post(path, json=body)
        assert r.status_code == 400, path
        assert r.json()["error"]["message"] == message, path
        assert r.json()["error"]["type"] == "invalid_request_error", path
    ignored = {"n": 1, "user": "u", "logit_bias": {"1": 2}, "parallel_tool_calls": None}
    r = app.http.post("/v1/chat/completions", json={**chat, **ignored, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_create_reads_the_modelfile_field_into_the_same_model(app: FakeDaemon) -> None:
    r = app.http.post(
        "/api/create",
        json={"model": "child", "modelfile": "FROM tiny\nSYSTEM be brief\n", "stream": False},
    )
    assert (r.status_code, r.json()) == (200, {"status": "success"})
    shown = app.http.post("/api/show", json={"model": "child"}).json()
    assert shown["system"] == "be brief"
