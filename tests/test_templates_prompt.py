"""Prompt building: which template renders, Ollama's three TEMPLATE modes, BOS handling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelhub.errors import InputError
from modelhub.templates import parse_template
from modelhub.templates.prompt import (
    PromptInput,
    build_chat_prompt,
    build_generate_prompt,
    render_prompt,
)

CASES = Path(__file__).parent / "template_cases"
CONVERSATIONS: dict[str, Any] = json.loads((CASES / "conversations.json").read_text())
PIRATE = CONVERSATIONS["system-user-assistant-user"]["messages"]
ALPACA = (CASES / "go" / "legacy-alpaca.gotmpl").read_text()
CHATML_GO = (CASES / "go" / "chatml.gotmpl").read_text()
CHATML_JINJA = (CASES / "jinja" / "chatml.jinja").read_text()
LLAMA3_JINJA = (CASES / "jinja" / "llama3-tools.jinja").read_text()
LLAMA3_GO = (CASES / "go" / "llama3.1-tools.gotmpl").read_text()


def chat(go: str | None, messages: list[dict[str, Any]], **kw: Any) -> str:
    return build_chat_prompt(
        go_template=go, jinja_template=kw.pop("jinja", None), messages=messages, **kw
    )


def _go_family_cases() -> list[Any]:
    params = []
    for path in sorted((CASES / "expected").glob("*.gotmpl.json")):
        doc = json.loads(path.read_text())
        for conversation, expected in doc["cases"].items():
            params.append(
                pytest.param(
                    doc["template"], conversation, expected, id=f"{path.stem}-{conversation}"
                )
            )
    return params


@pytest.mark.parametrize(("template", "conversation", "expected"), _go_family_cases())
def test_go_family_templates(template: str, conversation: str, expected: str) -> None:
    conv = CONVERSATIONS[conversation]
    text = (CASES / template).read_text()
    assert chat(text, conv["messages"], tools=conv.get("tools")) == expected


def test_go_family_cases_cover_the_brief() -> None:
    names = {p.name for p in (CASES / "go").iterdir()}
    expected = {
        "chatml",
        "qwen2.5-tools",
        "llama3.1-tools",
        "mistral",
        "gemma",
        "phi3",
        "legacy-alpaca",
    }
    assert {f"{n}.gotmpl" for n in expected} <= names


@pytest.mark.parametrize(
    ("name", "tools", "suffix", "messages"),
    [
        ("qwen2.5-tools", True, False, True),
        ("llama3.1-tools", True, False, True),
        ("chatml", False, False, True),
        ("mistral", False, False, True),
        ("legacy-alpaca", False, False, False),
    ],
)
def test_references_drive_modes_and_capabilities(
    name: str, tools: bool, suffix: bool, messages: bool
) -> None:
    t = parse_template((CASES / "go" / f"{name}.gotmpl").read_text())
    assert t.references("Tools") is tools
    assert t.references("Suffix") is suffix
    assert t.references("Messages") is messages


# -- mode selection and the legacy mode ----------------------------------------------------


def test_messages_mode_is_chosen_by_any_reference_to_messages() -> None:
    # Only the condition reads .Messages; that is enough for messages mode (no per-turn runs).
    out = chat("{{ if .Messages }}M{{ end }}[{{ .Prompt }}]", PIRATE)
    assert out == "M[]"


def test_legacy_mode_runs_per_turn_and_cuts_the_last_turn_at_response() -> None:
    assert chat(ALPACA, PIRATE) == (
        "You are a pirate.\n\n### Instruction:\nHello\n\n### Response:\nAhoy!\n\n"
        "### Instruction:\nWhere is the treasure?\n\n### Response:\n"
    )


def test_legacy_template_without_response_gets_the_response_appended() -> None:
    template = "{{ if .System }}<<SYS>>{{ .System }}<</SYS>>{{ end }}[INST] {{ .Prompt }} [/INST]"
    assert chat(template, PIRATE) == (
        "<<SYS>>You are a pirate.<</SYS>>[INST] Hello [/INST]Ahoy!"
        "[INST] Where is the treasure? [/INST]"
    )


def test_legacy_last_assistant_message_is_continued() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    assert chat(ALPACA, messages) == "### Instruction:\nHi\n\n### Response:\nHel"


def test_legacy_system_message_mid_conversation_starts_a_new_turn() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "system", "content": "s"},
        {"role": "tool", "content": "ignored in legacy mode"},
        {"role": "user", "content": "c"},
    ]
    assert chat(ALPACA, messages) == (
        "### Instruction:\na\n\n### Response:\nb\n\ns\n\n### Instruction:\nc\n\n### Response:\n"
    )


def test_without_any_template_the_plain_prompt_is_used() -> None:
    out = build_generate_prompt(
        go_template=None,
        jinja_template=None,
        prompt="Hi",
        system="The default template has no .System",
        history=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        suffix=None,
    )
    assert out == "abHi"
    assert chat(None, [{"role": "user", "content": "just this"}]) == "just this"


# -- fill-in-the-middle ---------------------------------------------------------------------

FIM = "{{ if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>{{ else }}{{ .Prompt }}{{ end }}"


def generate(go: str | None, prompt: str, **kw: Any) -> str:
    kw.setdefault("system", None)
    kw.setdefault("history", [])
    kw.setdefault("suffix", None)
    return build_generate_prompt(
        go_template=go, jinja_template=kw.pop("jinja", None), prompt=prompt, **kw
    )


def test_fill_in_the_middle_uses_prompt_and_suffix_only() -> None:
    out = generate(FIM, "def f(x):", suffix="    return y", system="ignored", history=PIRATE)
    assert out == "<PRE> def f(x): <SUF>    return y <MID>"


def test_empty_suffix_is_a_normal_prompt() -> None:
    assert generate(FIM, "plain", suffix="") == "plain"


def test_suffix_without_a_template_that_supports_it_is_refused() -> None:
    with pytest.raises(InputError, match="does not support insert"):
        generate(CHATML_GO, "x", suffix="y")
    with pytest.raises(InputError, match="does not support insert"):
        generate(None, "x", suffix="y", jinja=CHATML_JINJA)


# -- which template wins ----------------------------------------------------------------------


def test_go_template_wins_over_jinja_and_jinja_over_plain() -> None:
    messages = [{"role": "user", "content": "x"}]
    assert (
        chat("GO {{ range .Messages }}{{ .Content }}{{ end }}", messages, jinja="JINJA") == "GO x"
    )
    assert chat(None, messages, jinja="JINJA {{ messages[0].content }}") == "JINJA x"
    assert chat("", messages, jinja="JINJA {{ messages[0].content }}") == "JINJA x"
    assert chat(parse_template("{{ range .Messages }}{{ .Content }}!{{ end }}"), messages) == "x!"


def test_jinja_receives_messages_unmerged() -> None:
    out = chat(None, CONVERSATIONS["merge"]["messages"], jinja=CHATML_JINJA)
    assert out.count("<|im_start|>system") == 2
    assert out.count("<|im_start|>user") == 2


def test_jinja_generation_prompt_only_when_the_assistant_is_not_last() -> None:
    open_turn = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert chat(None, open_turn, jinja=CHATML_JINJA).endswith(
        "<|im_start|>assistant\nb<|im_end|>\n"
    )
    assert chat(None, open_turn[:1], jinja=CHATML_JINJA).endswith("<|im_start|>assistant\n")


def test_generate_assembles_system_history_and_prompt_in_order() -> None:
    history = [{"role": "user", "content": "h1"}, {"role": "assistant", "content": "h2"}]
    out = generate(CHATML_GO, "now", system="sys", history=history)
    assert out == (
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nh1<|im_end|>\n"
        "<|im_start|>assistant\nh2<|im_end|>\n<|im_start|>user\nnow<|im_end|>\n<|im_start|>assistant\n"
    )
    assert generate(CHATML_GO, "now", system="") == generate(CHATML_GO, "now", system=None)
    assert "system" not in generate(CHATML_GO, "now", system="")
    jinja = generate(None, "now", system="sys", history=history, jinja=CHATML_JINJA)
    assert jinja == out


# -- BOS --------------------------------------------------------------------------------------

BOS = "<|begin_of_text|>"


def test_leading_bos_from_a_jinja_template_is_stripped_when_the_tokenizer_adds_one() -> None:
    messages = [{"role": "user", "content": "x"}]
    stripped = chat(None, messages, jinja=LLAMA3_JINJA, bos_token=BOS, eos_token="<|eot_id|>")
    assert stripped.startswith("<|start_header_id|>user")
    kept = chat(None, messages, jinja=LLAMA3_JINJA, bos_token=BOS, tokenizer_adds_bos=False)
    assert kept == BOS + stripped


def test_leading_bos_text_in_a_go_template_is_stripped_too() -> None:
    messages = [{"role": "user", "content": "x"}]
    assert chat(LLAMA3_GO, messages).startswith(BOS)  # no bos_token given: nothing to strip
    assert chat(LLAMA3_GO, messages, bos_token=BOS).startswith("<|start_header_id|>user")


def test_only_one_leading_bos_is_stripped_and_only_at_the_start() -> None:
    messages = [{"role": "user", "content": "x"}]
    assert (
        chat("<s><s>{{ range .Messages }}{{ .Content }}<s>{{ end }}", messages, bos_token="<s>")
        == "<s>x<s>"
    )
    assert (
        chat(" <s>{{ range .Messages }}{{ .Content }}{{ end }}", messages, bos_token="<s>")
        == " <s>x"
    )


# -- what Go templates see --------------------------------------------------------------------


def test_messages_are_collated_and_system_joined() -> None:
    template = (
        "[{{ .System }}]{{ range .Messages }}({{ .Role }}:{{ .Content }}:{{ len .ToolCalls }})"
        "{{ end }}"
    )
    messages = [
        {"role": "system", "content": "s1"},
        {"role": "user", "content": "u1"},
        {"role": "user", "content": "u2"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
        },
        {
            "role": "assistant",
            "content": "a2",
            "tool_calls": [{"function": {"name": "g", "arguments": {}}}],
        },
        {"role": "tool", "content": "t1"},
        {"role": "tool", "content": "t2"},
        {"role": "system", "content": "s2"},
    ]
    assert chat(template, messages) == (
        "[s1\n\ns2](system:s1:0)(user:u1\n\nu2:0)(assistant:\n\na2:2)(tool:t1:0)(tool:t2:0)(system:s2:0)"
    )


def test_message_fields_have_zero_values_when_absent() -> None:
    template = (
        "{{ range .Messages }}[{{ .Role }}|{{ .Content }}|{{ .Thinking }}|{{ .ToolName }}|"
        '{{ .ToolCallID }}|{{ len .ToolCalls }}|{{ len .Images }}|{{ eq .Content "" }}]{{ end }}'
    )
    assert chat(template, [{"role": "user"}]) == "[user|||||0|0|true]"
    full = {"role": "tool", "content": "r", "thinking": "t", "tool_name": "f", "tool_call_id": "c1"}
    assert chat(template, [full]) == "[tool|r|t|f|c1|0|0|false]"


def test_tool_calls_as_templates_read_them() -> None:
    template = (
        "{{ range .Messages }}{{ range .ToolCalls }}{{ .ID }}:{{ .Function.Index }}:"
        "{{ .Function.Name }}:{{ .Function.Arguments }};{{ end }}{{ end }}"
    )
    calls = [
        {"id": "call_1", "function": {"name": "a", "arguments": {"x": 1, "é": "ü"}}},
        {
            "function": {"name": "b", "arguments": '{"openai": "style"}'}
        },  # JSON text, as OpenAI sends
        {"function": {"name": "c", "arguments": "not json"}},
        {"function": {"name": "d"}},
    ]
    out = chat(template, [{"role": "assistant", "content": "", "tool_calls": calls}])
    assert out == 'call_1:0:a:{"x":1,"é":"ü"};:1:b:{"openai":"style"};:2:c:not json;:3:d:{};'


def test_tools_print_as_json_in_ollamas_key_order() -> None:
    tool = {
        "function": {
            "parameters": {
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
                "type": "object",
            },
            "description": "Search",
            "name": "search",
            "x-extra": True,
        },
        "type": "function",
    }
    out = chat(
        "{{ if .Messages }}{{ range .Tools }}{{ . }}{{ end }}|{{ json .Tools }}{{ end }}",
        [{"role": "user", "content": "q"}],
        tools=[tool],
    )
    one = (
        '{"type":"function","function":{"name":"search","description":"Search","parameters":'
        '{"type":"object","required":["q"],"properties":{"q":{"type":"string"}}},"x-extra":true}}'
    )
    assert out == f"{one}|[{one}]"


def test_no_tools_is_falsy() -> None:
    template = "{{ if .Tools }}T{{ else }}none{{ end }}"
    assert chat(template, [{"role": "user", "content": "q"}]) == "none"
    assert chat(template, [{"role": "user", "content": "q"}], tools=[]) == "none"


@pytest.mark.parametrize(
    ("think", "expected"),
    [
        (None, "unset|"),
        (True, "on|medium"),
        (False, "off|"),
        ("high", "on|high"),
        ("max", "on|max"),
    ],
)
def test_think_variables(think: Any, expected: str) -> None:
    template = (
        "{{ if .IsThinkSet }}{{ if .Think }}on{{ else }}off{{ end }}{{ else }}unset{{ end }}|"
        "{{ .ThinkLevel }}{{ range .Messages }}{{ end }}"
    )
    assert chat(template, [{"role": "user", "content": "q"}], think=think) == expected


def test_think_reaches_jinja_as_enable_thinking() -> None:
    template = "{% if enable_thinking is defined %}{{ enable_thinking }}{% else %}unset{% endif %}"
    messages = [{"role": "user", "content": "q"}]
    assert chat(None, messages, jinja=template) == "unset"
    assert chat(None, messages, jinja=template, think=False) == "False"
    assert chat(None, messages, jinja=template, think="medium") == "True"


def test_render_prompt_takes_a_prompt_input() -> None:
    inp = PromptInput(
        messages=[{"role": "user", "content": "q"}], system=None, tools=None, suffix=None
    )
    assert render_prompt(inp, go_template=CHATML_GO, jinja_template=None) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    )


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "tools", "what"),
    [
        ([{"role": "user", "content": ["parts"]}], None, "message content must be a string"),
        (["not an object"], None, "each message must be an object"),
        ([{"role": "assistant", "tool_calls": ["x"]}], None, "each tool call must be an object"),
        (
            [{"role": "user", "content": "q"}],
            [{"type": "function"}],
            "each tool must be an object with a 'function'",
        ),
    ],
)
def test_bad_input_is_a_clear_bad_request(messages: list[Any], tools: Any, what: str) -> None:
    with pytest.raises(InputError, match=what):
        chat("{{ range .Messages }}{{ end }}{{ .Tools }}", messages, tools=tools)


def test_template_errors_surface_as_bad_requests() -> None:
    with pytest.raises(InputError, match=r"template error: unclosed action at line 1 col 1"):
        chat("{{ .Messages", [])
    with pytest.raises(InputError, match=r"^chat template error: boom"):
        chat(None, [{"role": "user", "content": "q"}], jinja="{{ raise_exception('boom') }}")


# -- against the real tokenizer --------------------------------------------------------------


@pytest.mark.slow
def test_bos_is_not_doubled_with_the_real_tokenizer() -> None:
    from devtools import realmodels
    from modelhub.engine.llama import LlamaModel
    from modelhub.gguf.info import read_gguf_info

    path = realmodels.gemma3_270m()
    info = read_gguf_info(path, with_tokens=True)
    assert info.add_bos and info.bos_id is not None and info.tokens is not None
    bos_text = info.tokens[info.bos_id]
    gemma = (CASES / "jinja" / "gemma.jinja").read_text()
    model = LlamaModel(path, vocab_only=True)
    try:

        def tokens(**kw: Any) -> list[int]:
            text = chat(None, PIRATE, jinja=gemma, bos_token=bos_text, eos_token="<eos>", **kw)
            return model.tokenize(text, add_special=True, parse_special=True)

        ours = tokens(tokenizer_adds_bos=info.add_bos)
        assert ours[0] == info.bos_id and ours[1] != info.bos_id
        assert ours.count(info.bos_id) == 1
        # Without the rule the prompt would start with two BOS tokens.
        assert tokens(tokenizer_adds_bos=False)[:2] == [info.bos_id, info.bos_id]
    finally:
        model.close()


def test_jinja_templates_read_tool_calls_as_objects_and_tool_results() -> None:
    """Hugging Face templates index ``tool_call.function.arguments`` as a mapping; OpenAI
    clients send a JSON string, which is parsed for them."""
    template = (
        "{% for m in messages %}{{ m.role }}:"
        "{% for c in m.tool_calls or [] %}{{ c.type }} {{ c.function.name }}"
        "({{ c.function.arguments.city }});{% endfor %}"
        "{% if m.role == 'tool' %}{{ m.tool_call_id }}={{ m.content }}{% endif %}|{% endfor %}"
        "{% if reasoning_effort is defined %}effort={{ reasoning_effort }}{% endif %}"
        "{% if enable_thinking is defined %} think={{ enable_thinking }}{% endif %}"
    )
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    out = chat(None, messages, jinja=template)
    assert out == "user:|assistant:function get_weather(Oslo);|tool:c1=rain|"
    assert chat(None, messages, jinja=template, think=False).endswith("| think=False")
    assert chat(None, messages, jinja=template, think="high").endswith("effort=high think=True")
