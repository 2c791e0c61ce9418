"""GGUF chat templates: HF-compatible rendering, the sandbox, and the time and size bounds."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest

from modelhub.errors import InputError
from modelhub.templates import compile_chat_template, render_chat_template

CASES = Path(__file__).parent / "template_cases"
CONVERSATIONS: dict[str, Any] = json.loads((CASES / "conversations.json").read_text())
USER = [{"role": "user", "content": "Hi"}]


def render(template: str, messages: list[dict[str, Any]] | None = None, **kw: Any) -> str:
    kw.setdefault("bos_token", "<s>")
    kw.setdefault("eos_token", "</s>")
    return render_chat_template(template, USER if messages is None else messages, **kw)


def _family_cases() -> list[Any]:
    params = []
    for path in sorted((CASES / "expected").glob("*.jinja.json")):
        doc = json.loads(path.read_text())
        for conversation, expected in doc["cases"].items():
            params.append(
                pytest.param(doc, conversation, expected, id=f"{path.stem}-{conversation}")
            )
    return params


@pytest.mark.parametrize(("doc", "conversation", "expected"), _family_cases())
def test_family_templates(doc: dict[str, Any], conversation: str, expected: Any) -> None:
    template = (CASES / doc["template"]).read_text()
    conv = CONVERSATIONS[conversation]

    def run() -> str:
        return render_chat_template(
            template,
            conv["messages"],
            tools=conv.get("tools"),
            bos_token=doc["bos_token"],
            eos_token=doc["eos_token"],
        )

    if isinstance(expected, dict):
        with pytest.raises(InputError) as info:
            run()
        assert str(info.value).startswith(f"chat template error: {expected['error']}")
    else:
        assert run() == expected


def test_family_cases_cover_the_brief() -> None:
    names = {p.name for p in (CASES / "jinja").iterdir()}
    assert {"chatml.jinja", "llama3-tools.jinja", "gemma.jinja"} <= names


SMOLLM2_USER = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
)
SMOLLM2_SYSTEM = (
    "<|im_start|>system\nYou are a pirate.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
    "<|im_start|>assistant\nAhoy!<|im_end|>\n<|im_start|>user\nWhere is the treasure?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.mark.slow
def test_smollm2_template_read_from_its_gguf() -> None:
    from devtools import realmodels
    from modelhub.gguf.info import read_gguf_info

    template = read_gguf_info(realmodels.smollm2_q4_1()).chat_template
    assert template is not None
    user = CONVERSATIONS["user"]["messages"]
    pirate = CONVERSATIONS["system-user-assistant-user"]["messages"]
    tokens = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    assert render_chat_template(template, user, **tokens) == SMOLLM2_USER
    assert render_chat_template(template, pirate, **tokens) == SMOLLM2_SYSTEM
    without_prompt = render_chat_template(template, user, add_generation_prompt=False, **tokens)
    assert without_prompt == SMOLLM2_USER.removesuffix("<|im_start|>assistant\n")


# -- the HF environment ------------------------------------------------------------------


def test_trim_blocks_and_lstrip_blocks_as_hf() -> None:
    template = (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n"
        "    {% endif %}\n{% endfor %}"
    )
    assert render(template) == "U:Hi\n"


def test_variables_hf_passes() -> None:
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ extra_flag }}"
    )
    assert render(template, extra={"extra_flag": "on"}) == "<s>|</s>|True|None|on"
    assert (
        render(template, add_generation_prompt=False, tools=[{"a": 1}])
        == "<s>|</s>|False|[{'a': 1}]|"
    )


def test_extra_cannot_override_the_conversation() -> None:
    assert render("{{ messages[0].content }}", extra={"messages": [{"content": "evil"}]}) == "Hi"


def test_tojson_keeps_unicode_and_key_order() -> None:
    value = {"z": "é<&>", "a": [1, None, True]}
    assert render("{{ v|tojson }}", extra={"v": value}) == '{"z": "é<&>", "a": [1, null, true]}'
    assert render("{{ v|tojson(indent=2) }}", extra={"v": {"k": 1}}) == '{\n  "k": 1\n}'
    assert render("{{ v|tojson(sort_keys=true, separators=(',', ':')) }}", extra={"v": value}) == (
        '{"a":[1,null,true],"z":"é<&>"}'
    )


def test_strftime_now() -> None:
    out = render("{{ strftime_now('%Y-%m-%d') }}")
    assert out in {
        dt.date.today().isoformat(),
        (dt.date.today() - dt.timedelta(days=1)).isoformat(),
    }


def test_raise_exception_is_a_bad_request_with_the_templates_message() -> None:
    with pytest.raises(
        InputError, match=r"^chat template error: only user turns, please at line 2$"
    ):
        render("ok\n{{ raise_exception('only user turns, please') }}")


def test_loop_variables_and_loop_controls() -> None:
    template = (
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{% if loop.first %}F{% endif %}"
        "{% if loop.last %}L{% endif %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "[{{ m.role }}]{% if loop.index == 3 %}{% break %}{% endif %} {% endfor %}"
    )
    messages = CONVERSATIONS["system-user-assistant-user"]["messages"]
    assert render(template, messages) == "1/4F2/4[user] 3/4[assistant]"


def test_generation_block_renders_its_body() -> None:
    template = (
        "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}"
    )
    assert render(template) == "<Hi>"


def test_string_methods_templates_use_are_allowed() -> None:
    template = (
        "{{ messages[0].content.upper() }} {{ ' x '.strip() }} {{ 'a,b'.split(',') }} "
        "{{ messages[0].get('role') }}"
    )
    assert render(template) == "HI x ['a', 'b'] user"


def test_undefined_values_work_with_filters_as_in_hf() -> None:
    template = (
        "{{ nope|default('d') }} {{ (nope or 'x')|upper }} {{ messages[0].missing|default('m') }} "
        "{{ nope|string|length }} {{ messages[0].tool_calls is defined }}"
    )
    assert render(template) == "d X m 0 False"


def test_compiled_templates_are_cached_by_text() -> None:
    text = "{{ messages|length }} cached"
    assert compile_chat_template(text) is compile_chat_template(text)
    assert render(text) == "1 cached"


# -- errors ----------------------------------------------------------------------------------


def test_syntax_error_says_where() -> None:
    with pytest.raises(
        InputError, match=r"^chat template error: .*'end of statement block'.* at line 3$"
    ):
        render("a\nb\n{% for x in %}{% endfor %}")
    with pytest.raises(
        InputError, match=r"^chat template error: Encountered unknown tag 'foo'.* at line 1$"
    ):
        render("{% foo %}")


def test_runtime_errors_are_bad_requests_with_a_line() -> None:
    with pytest.raises(
        InputError, match=r"^chat template error: ZeroDivisionError: division by zero at line 2$"
    ):
        render("a\n{{ 1 / 0 }}")
    with pytest.raises(
        InputError, match=r"^chat template error: UndefinedError: 'nope' is undefined"
    ):
        render("{{ nope.attr }}")


# -- the sandbox -----------------------------------------------------------------------------

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__['os'] }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ strftime_now.__globals__ }}",
    "{{ messages[0].content.__class__.__base__ }}",
    "{{ '{0.__class__}'.format(messages) }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ messages[0].clear() }}",
    "{{ messages.pop() }}",
    "{{ lipsum.__globals__ }}",
    "{{ self.__init__ }}",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_sandbox_blocks_internals_and_mutation(template: str) -> None:
    """An unsafe attribute is either refused or an empty undefined: nothing leaks or changes."""
    messages = [{"role": "user", "content": "Hi"}]
    try:
        out = render(template + "{{ messages|length }}", messages)
    except InputError as e:
        assert str(e).startswith("chat template error: blocked by the sandbox: ")
    else:
        assert out == "1"
    assert messages == [{"role": "user", "content": "Hi"}]


def test_sandbox_refuses_to_use_unsafe_attributes() -> None:
    for template in ("{{ messages.__class__.__name__ }}", "{{ cycler.__init__.__globals__ }}"):
        with pytest.raises(InputError, match="blocked by the sandbox: access to attribute '__"):
            render(template)


# -- bounds ----------------------------------------------------------------------------------

SLOW = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{% for m in messages %}{% for i in range(100000) %}{% for c in 'abcdefghij' * 1000 %}"
    "{% endfor %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i + j %}"
    "{% endfor %}{% endfor %}",
]


@pytest.mark.parametrize("template", SLOW)
def test_slow_templates_hit_the_time_bound(template: str) -> None:
    start = time.perf_counter()
    with pytest.raises(InputError, match=r"rendering took longer than 0.3 s"):
        render(template, timeout_s=0.3)
    assert time.perf_counter() - start < 2


DOUBLING = (
    "{{% set ns = namespace({init}) %}}{{% for i in range(80) %}}{{% set {step} %}}{{% endfor %}}"
)
HUGE = [
    (
        "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
        "output exceeds 1000000 characters",
    ),
    ("{{ 'a' * 1000000000 }}", "repetition exceeds"),
    ("{{ [1, 2] * 1000000000 }}", "repetition exceeds"),
    ("{{ 'a'|center(1000000000) }}", "argument 1000000000 exceeds the output limit"),
    ("{{ 'a'.ljust(1000000000) }}", "argument 1000000000 exceeds the output limit"),
    ("{{ '{:>999999999}'.format('a') }}", "format width 999999999 exceeds the output limit"),
    ("{{ '%999999999d' % 1 }}", "format width 999999999 exceeds the output limit"),
    ("{{ '%999999999d'|format(1) }}", "format width 999999999 exceeds the output limit"),
    ("{{ 9 ** 999999999 }}", "power is too large"),
    (
        DOUBLING.format(init="s='ab'", step="ns.s = ns.s + ns.s"),
        "concatenation exceeds 1000000 characters",
    ),
    (
        DOUBLING.format(init="s='ab'", step="ns.s = ns.s ~ ns.s"),
        "concatenation exceeds 1000000 characters",
    ),
    (
        DOUBLING.format(init="l=[1]", step="ns.l = ns.l + ns.l"),
        "concatenation exceeds 1000000 characters",
    ),
    ("{% set s = 'x' * 100000 %}{{ [s] * 1000 }}", "a printed value exceeds"),
    ("{% set s = 'x' * 100000 %}{{ ([s] * 1000)|join }}", "the join filter's result exceeds"),
    ("{% set s = 'x' * 100000 %}{{ ', '.join([s] * 1000) }}", "the result exceeds"),
    ("{% set s = 'x' * 100000 %}{{ s.replace('x', s) }}", "the result exceeds"),
    ("{% set s = 'x' * 100000 %}{{ s|replace('x', s) }}", "the replace filter's result exceeds"),
    ("{% set s = 'x' * 100000 %}{{ ('{0}' * 1000).format(s) }}", "formatted text exceeds"),
    ("{% set s = 'x' * 100000 %}{{ ([s] * 1000)|string }}", "the string filter's result exceeds"),
    ("{% set s = 'x' * 100000 %}{{ ([s] * 1000)|tojson }}", "the tojson filter's result exceeds"),
    ("{% set s = 'x\n' * 100000 %}{{ s|indent(s) }}", "the indent filter's result exceeds"),
    ("{{ ('\t' * 100000).expandtabs(100000) }}", "the result exceeds"),
    ("{{ lipsum(1000000000) }}", "argument 1000000000 exceeds"),
]


@pytest.mark.parametrize(("template", "what"), HUGE)
def test_huge_output_is_refused_before_memory_runs_out(template: str, what: str) -> None:
    start = time.perf_counter()
    with pytest.raises(InputError, match=what):
        render(template, max_output=1_000_000)
    assert time.perf_counter() - start < 3


def test_constant_output_is_not_folded_at_compile_time_outside_the_bounds() -> None:
    start = time.perf_counter()
    with pytest.raises(InputError, match="exceeds the output limit"):
        render("{{ 'b'|center(100000000) }}")
    assert time.perf_counter() - start < 2


def test_recursion_is_an_error_not_a_crash() -> None:
    with pytest.raises(InputError, match="recursion too deep"):
        render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")


def test_normal_templates_stay_fast_on_long_conversations() -> None:
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(2000)
    ]
    template = (CASES / "jinja" / "llama3-tools.jinja").read_text()
    start = time.perf_counter()
    out = render(template, messages, bos_token="", eos_token="")
    assert time.perf_counter() - start < 2
    assert out.count("<|eot_id|>") == 2000
