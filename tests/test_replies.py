"""Reading replies: tool calls in each format models write, and reasoning, fed whole and split
into every piece size (as tokens stream), with malformed output staying content."""

from __future__ import annotations

import json

import pytest

from modelhub.replies.reply import ReplyParser
from modelhub.replies.thinking import ThinkingParser, template_markers
from modelhub.replies.tool_calls import (
    ToolCall,
    ToolCallParser,
    forced_call_grammar,
    json_end,
    template_marker,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


def _run(text: str, size: int, marker: str | None = None) -> tuple[str, list[ToolCall]]:
    parser = ToolCallParser(TOOLS, marker)
    content, calls = [], []
    for i in range(0, len(text), size):
        c, k = parser.feed(text[i : i + size])
        content.append(c)
        calls += k
    c, k = parser.finish()
    return "".join(content) + c, calls + k


def _all_sizes(text: str, marker: str | None = None) -> tuple[str, list[tuple[str, dict]]]:
    """The result, checked to be the same whatever size the streamed pieces have."""
    results = set()
    for size in (1, 2, 3, 7, len(text) or 1):
        content, calls = _run(text, size, marker)
        results.add((content, json.dumps([(c.name, c.arguments, c.index) for c in calls])))
    assert len(results) == 1, results
    content, calls_json = results.pop()
    return content, [(name, args) for name, args, _ in json.loads(calls_json)]


RECORDED = [
    # (what a model wrote, content expected, calls expected)
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (  # Qwen/Hermes: two calls, text before them
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check.",  # the whitespace beside the calls is not content
        [("get_weather", {"city": "Oslo"}), ("get_time", {})],
    ),
    (  # Llama 3.x: bare JSON with "parameters", two calls separated by ";"
        '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "c"}}; '
        '{"name": "get_time", "parameters": {}}',
        "",
        [("get_weather", {"city": "Rome", "unit": "c"}), ("get_time", {})],
    ),
    (  # Llama 3.1 with the python tag rendered as text
        '<|python_tag|>{"name": "get_time", "parameters": {}}',
        "",
        [("get_time", {})],
    ),
    (  # Mistral v3: an array after [TOOL_CALLS]
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Lima"}}, '
        '{"name": "get_time", "arguments": {}}]',
        "",
        [("get_weather", {"city": "Lima"}), ("get_time", {})],
    ),
    (  # Mistral v11: name[ARGS]{...}
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Kyiv"}',
        "",
        [("get_weather", {"city": "Kyiv"})],
    ),
    (  # arguments as a JSON string, OpenAI's "function" wrapper
        '<tool_call>{"type": "function", "function": {"name": "get_weather", '
        '"arguments": "{\\"city\\": \\"Bern\\"}"}}</tool_call>',
        "",
        [("get_weather", {"city": "Bern"})],
    ),
    (  # braces and a closing tag inside strings do not end the payload
        '<tool_call>{"name": "get_weather", "arguments": {"city": "a}b</tool_call>{"}}'
        "</tool_call> done",
        "done",
        [("get_weather", {"city": "a}b</tool_call>{"})],
    ),
]


@pytest.mark.parametrize(("text", "content", "calls"), RECORDED)
def test_recorded_outputs_of_each_format(text: str, content: str, calls: list) -> None:
    assert _all_sizes(text) == (content, calls)


CALL = '{"name": "get_time", "arguments": {}}'


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (CALL + "\n\n", ""),  # a forced call, then blank lines
        ("\n\n  \t\t" + CALL + "\n \t", ""),
        ("<tool_call>" + CALL + "</tool_call>\n\n<tool_call>" + CALL + "</tool_call>\n", ""),
        ("Sure.\n\n<tool_call>" + CALL + "</tool_call>\n\nDone.\n", "Sure.Done.\n"),
        ("No call here.\n\n", "No call here.\n\n"),  # whitespace is content without calls
        ("  No call.\n\nTwo lines.", "  No call.\n\nTwo lines."),
    ],
)
def test_whitespace_beside_a_call_is_never_content(text: str, content: str) -> None:
    got, calls = _all_sizes(text, "<tool_call>")
    assert got == content
    assert len(calls) == text.count(CALL)


MALFORMED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>',  # no }
    '<tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>',  # bad JSON
    '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>',  # unknown tool
    '<tool_call>{"name": "get_weather", "arguments": [1, 2]}</tool_call>',  # not an object
    '{"answer": 42, "why": "because"}',  # JSON that is not a call
    "[1, 2, 3]",
    "I would call <tool_call> but I will not.",
    '{"name": "get_weather", "arguments": {"city": "Pa',  # cut off by num_predict
]


@pytest.mark.parametrize("text", MALFORMED)
def test_what_is_not_a_call_stays_content_word_for_word(text: str) -> None:
    assert _all_sizes(text) == (text, [])


def test_plain_text_streams_without_delay_and_marker_starts_are_held() -> None:
    parser = ToolCallParser(TOOLS)
    assert parser.feed("Hello") == ("Hello", [])
    assert parser.feed(" wor") == (" wor", [])
    assert parser.feed("ld <tool") == ("ld", [])  # might be a marker (and the space beside it)
    assert parser.feed("s are fun") == (" <tools are fun", [])
    assert parser.finish() == ("", [])


def test_json_only_opens_a_call_at_the_start_of_the_reply() -> None:
    text = 'Here: {"name": "get_time", "arguments": {}}'
    assert _all_sizes(text) == (text, [])


def test_a_template_marker_is_derived_as_ollama_does() -> None:
    qwen = (
        '{{- if .ToolCalls }}<tool_call>\n{{ range .ToolCalls }}{"name": "{{ .Function.Name }}"'
        "}{{ end }}</tool_call>{{ end }}"
    )
    llama = '{{ if .ToolCalls }}\n{{ range .ToolCalls }}{"name": "{{ .Function.Name }}"}{{ end }}'
    mistral = '{{- if .ToolCalls }}[TOOL_CALLS][{{ range .ToolCalls }}{"name": 1}{{ end }}]'
    custom = "{{ if .ToolCalls }}<<CALL>>{{ range .ToolCalls }}{{ json .Function }}{{ end }}"
    assert template_marker(qwen) == "<tool_call>"
    assert template_marker(llama) == ""
    assert template_marker(mistral) == "[TOOL_CALLS]"
    assert template_marker("{% if tools %}<tool_call>{% endif %}") == "<tool_call>"
    assert template_marker("{{ .Prompt }}") is None
    assert template_marker(custom) == "<<CALL>>"
    text = '<<CALL>>{"name": "get_time", "arguments": {}}'
    assert _all_sizes(text, marker="<<CALL>>") == ("", [("get_time", {})])


def test_calls_are_numbered_and_shaped_for_both_api_families() -> None:
    _, calls = _run(RECORDED[1][0], 5)
    assert [c.index for c in calls] == [0, 1]
    ollama = calls[0].ollama()
    assert ollama["function"] == {"index": 0, "name": "get_weather", "arguments": {"city": "Oslo"}}
    openai = calls[0].openai()
    assert openai["type"] == "function" and openai["id"].startswith("call_")
    assert json.loads(openai["function"]["arguments"]) == {"city": "Oslo"}
    assert calls[0].id != calls[1].id


def test_json_end() -> None:
    assert json_end('{"a": "}"} tail') == 10
    assert json_end('[{"a": 1}, 2]') == 13
    assert json_end('{"a": [1, 2') is None
    assert json_end('{"a": 1]') == -1
    assert json_end("x{}") == -1


def test_forced_call_grammar_names_the_tools_and_the_marker() -> None:
    gbnf = forced_call_grammar(TOOLS, "<tool_call>")
    assert gbnf.startswith('root ::= "<tool_call>" "\\n" forced-call "\\n" "</tool_call>"')
    assert "get_weather" in gbnf and "get_time" in gbnf
    named = forced_call_grammar(TOOLS, None, "get_time")
    assert named.startswith("root ::= forced-call\n") and "get_weather" not in named
    with pytest.raises(Exception, match="named 'nope'"):
        forced_call_grammar(TOOLS, None, "nope")


# ---- thinking ------------------------------------------------------------------------------------
def _think(text: str, size: int, inside: bool = False) -> tuple[str, str]:
    parser = ThinkingParser(inside=inside)
    thinking, content = "", ""
    for i in range(0, len(text), size):
        t, c = parser.feed(text[i : i + size])
        thinking, content = thinking + t, content + c
    t, c = parser.finish()
    return thinking + t, content + c


@pytest.mark.parametrize(
    ("text", "inside", "expected"),
    [
        (
            "<think>Let me add 2 and 2.</think>\n\nIt is 4.",
            False,
            ("Let me add 2 and 2.", "It is 4."),
        ),
        ("\n<think>\nhmm\n</think>4", False, ("\nhmm\n", "4")),
        ("It is 4. <think>no</think>", False, ("", "It is 4. <think>no</think>")),
        ("adding...</think>It is 4.", True, ("adding...", "It is 4.")),
        ("<think>cut off while thinking", False, ("cut off while thinking", "")),
        ("<thinking is a word", False, ("", "<thinking is a word")),
    ],
)
def test_thinking_is_split_from_content(text: str, inside: bool, expected: tuple) -> None:
    for size in (1, 2, 5, len(text)):
        assert _think(text, size, inside) == expected


def test_thinking_markers_from_templates() -> None:
    go = "{{ if .Thinking }}<reasoning>{{ .Thinking }}</reasoning>{{ end }}{{ .Content }}"
    assert template_markers(go) == ("<reasoning>", "</reasoning>")
    assert template_markers("{% if enable_thinking %}...{% endif %}") == ("<think>", "</think>")
    assert template_markers("{{ .Prompt }}") is None


def test_reply_parser_thinks_then_calls() -> None:
    parser = ReplyParser(template=None, prompt="...<think>\n", think=True, tools=TOOLS)
    text = (
        "I need the weather.</think>\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Nice"}}</tool_call>'
    )
    parts = [parser.feed(text[i : i + 4]) for i in range(0, len(text), 4)] + [parser.finish()]
    thinking = "".join(p.thinking for p in parts)
    content = "".join(p.content for p in parts)
    calls = [c for p in parts for c in p.calls]
    assert thinking == "I need the weather."
    assert content == ""
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Nice"})]
    assert parser.calls == calls
