"""The Go text/template subset: language, functions, value rules, errors with positions, bounds."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelhub.errors import InputError
from modelhub.templates import Limits, parse_template
from modelhub.templates.go_funcs import go_quote


def render(text: str, data: dict[str, Any] | None = None, **limits: Any) -> str:
    return parse_template(text).execute(data or {}, Limits(**limits) if limits else None)


LANGUAGE = [
    # text, trimming and comments
    ("plain text, no actions", {}, "plain text, no actions"),
    ("a  {{- 1 -}}  b", {}, "a1b"),
    ("a  {{-1}}  b", {}, "a  -1  b"),  # '{{-1' is the number -1, not a trim marker
    ("a \n\t{{- /* note */ -}} \n b", {}, "ab"),
    ("a{{/* a\nmulti-line\ncomment */}}b", {}, "ab"),
    ("x {{- `raw` }}", {}, "xraw"),
    # if / else if / else
    ("{{ if .A }}a{{ else if .B }}b{{ else }}c{{ end }}", {"A": 1}, "a"),
    ("{{ if .A }}a{{ else if .B }}b{{ else }}c{{ end }}", {"B": "x"}, "b"),
    ("{{ if .A }}a{{ else if .B }}b{{ else }}c{{ end }}", {}, "c"),
    ("{{ if $x := .A }}{{ $x }}{{ else }}[{{ $x }}]{{ end }}", {"A": 0}, "[0]"),
    # with / else with / else
    ("{{ with .A }}<{{ . }}>{{ end }}", {"A": "v"}, "<v>"),
    ("{{ with .A }}a{{ else with .B }}b{{ . }}{{ else }}none{{ end }}", {"B": 2}, "b2"),
    ("{{ with .A }}a{{ else }}none{{ end }}", {"A": []}, "none"),
    ("{{ with $v := .A }}{{ $v }}{{ . }}{{ end }}", {"A": "z"}, "zz"),
    # range over lists, maps (in key order), integers; variables; else; break; continue
    ("{{ range .L }}[{{ . }}]{{ end }}", {"L": ["a", "b"]}, "[a][b]"),
    ("{{ range $i, $v := .L }}{{ $i }}={{ $v }} {{ end }}", {"L": ["a", "b"]}, "0=a 1=b "),
    ("{{ range $v := .L }}{{ $v }}{{ end }}", {"L": [1, 2]}, "12"),
    ("{{ range $k, $v := .M }}{{ $k }}:{{ $v }};{{ end }}", {"M": {"b": 2, "a": 1}}, "a:1;b:2;"),
    ("{{ range 3 }}{{ . }}{{ end }}", {}, "012"),
    ("{{ range .L }}x{{ else }}empty{{ end }}", {"L": []}, "empty"),
    ("{{ range .Missing }}x{{ else }}empty{{ end }}", {}, "empty"),
    (
        "{{ range .L }}{{ if eq . 3 }}{{ break }}{{ end }}{{ . }}{{ end }}",
        {"L": [1, 2, 3, 4]},
        "12",
    ),
    (
        "{{ range .L }}{{ if eq . 2 }}{{ continue }}{{ end }}{{ . }}{{ end }}",
        {"L": [1, 2, 3]},
        "13",
    ),
    (
        "{{ range .L }}{{ range .L2 }}{{ break }}{{ end }}{{ . }}{{ end }}",
        {"L": [{"L2": [1]}, {"L2": [2]}]},
        '{"L2":[1]}{"L2":[2]}',
    ),
    ("{{ range .L }}{{ $.Top }}{{ end }}", {"L": [1, 2], "Top": "T"}, "TT"),
    # variables: declaration, assignment reaching outer scope, shadowing
    ("{{ $x := 1 }}{{ range .L }}{{ $x = . }}{{ end }}{{ $x }}", {"L": [7, 8]}, "8"),
    ("{{ $x := 1 }}{{ if true }}{{ $x := 2 }}{{ $x }}{{ end }}{{ $x }}", {}, "21"),
    ("{{ $ := 1 }}{{ $ }}", {}, "1"),
    # fields: chains, parenthesised pipelines, variables, missing keys, JSON spellings
    ("{{ .A.B.C }}", {"A": {"B": {"C": "deep"}}}, "deep"),
    ("{{ (index .L 1).Name }}", {"L": [{"Name": "x"}, {"Name": "y"}]}, "y"),
    ("{{ $m := index .L 0 }}{{ $m.Name }}", {"L": [{"Name": "x"}]}, "x"),
    ("[{{ .Missing }}][{{ .Missing.Deeper }}]", {}, "[][]"),
    (
        "{{ .ToolCalls }}|{{ .ToolCallID }}|{{ .Defs }}",
        {"tool_calls": [], "tool_call_id": "c1", "$defs": 1},
        "[]|c1|1",
    ),
    ("{{ .Role }}", {"Role": "exact", "role": "json"}, "exact"),
    # pipelines
    ('{{ .A | printf "<%s>" }}', {"A": "v"}, "<v>"),
    ('{{ .L | len | printf "%d items" }}', {"L": [1, 2, 3]}, "3 items"),
    ('{{ "x" | printf "%s%s" "y" }}', {}, "yx"),  # the piped value comes last
    ("{{ .A | }}{{ (.A |) }}", {"A": "v"}, "vv"),  # Go accepts a dangling '|'
    # literals
    ('{{ "tab\\tquote\\"e\\u00e9\\x41\\101" }}', {}, 'tab\tquote"eéAA'),
    ("{{ `raw\\n\nline` }}", {}, "raw\\n\nline"),
    ("{{ 'a' }} {{ '\\n' }}", {}, "97 10"),
    (
        "{{ 0x1F }} {{ 0o17 }} {{ 017 }} {{ 0b101 }} {{ 1_000 }} {{ -3 }} {{ +4 }}",
        {},
        "31 15 15 5 1000 -3 4",
    ),
    ("{{ 1.5 }} {{ 1e3 }} {{ 2.0 }} {{ .5 }}", {}, "1.5 1000 2 0.5"),
    ("{{ true }} {{ false }} {{ eq nil nil }}", {}, "true false true"),
]


@pytest.mark.parametrize(("text", "data", "expected"), LANGUAGE)
def test_language(text: str, data: dict[str, Any], expected: str) -> None:
    assert render(text, data) == expected


FUNCTIONS = [
    ('{{ eq .R "a" "b" "c" }} {{ eq .R "x" }}', {"R": "b"}, "true false"),
    (
        "{{ ne 1 2 }} {{ lt 1 2 }} {{ le 2 2 }} {{ gt 1 2 }} {{ ge 2 3 }}",
        {},
        "true true true false false",
    ),
    ('{{ lt "a" "b" }} {{ eq 1 1.0 }}', {}, "true true"),
    ('{{ and 1 0 2 }}|{{ and 1 2 }}|{{ or 0 "" }}|{{ or 0 "x" 3 }}', {}, "0|2||x"),
    ('{{ not 0 }} {{ not .L }} {{ not "x" }}', {"L": []}, "true true false"),
    # and/or short-circuit: the failing index is never evaluated
    ("{{ or .A (index .L 5) }} {{ and .Z (index .L 5) }}", {"A": "a", "Z": 0, "L": []}, "a 0"),
    ("{{ len .S }} {{ len .L }} {{ len .M }}", {"S": "héllo", "L": [1, 2], "M": {"a": 1}}, "6 2 1"),
    (
        '{{ index .L 1 }} {{ index .M "k" }} {{ index .N 0 "k" 1 }}',
        {"L": [1, 2], "M": {"k": "v"}, "N": [{"k": [0, 9]}]},
        "2 v 9",
    ),
    ('[{{ index .M "missing" }}] {{ index .S 1 }}', {"M": {}, "S": "ab"}, "[] 98"),
    (
        "{{ slice .L 1 }} {{ slice .L 1 2 }} {{ slice .L }} {{ slice .S 1 3 }} "
        "{{ slice .L 1 2 3 }}",
        {"L": [1, 2, 3], "S": "abcd"},
        "[2 3] [2] [1 2 3] bc [2]",
    ),
    ('{{ print 1 2 "a" "b" 3 }}', {}, "1 2ab3"),
    ('{{ println 1 "a" }}', {}, "1 a\n"),
    (
        "{{ json .V }}",
        {"V": {"a": [1, "é", None, True], "h": "<b>&"}},
        '{"a":[1,"é",null,true],"h":"<b>&"}',
    ),
    ('{{ json "s" }} {{ json 1.5 }}', {}, '"s" 1.5'),
    ("{{ toTypeScriptType .P }}", {"P": {"type": "integer"}}, "number"),
    ("{{ toTypeScriptType .P }}", {"P": {"type": ["string", "null"]}}, "string | null"),
    (
        "{{ toTypeScriptType .P }}",
        {"P": {"anyOf": [{"type": "array"}, {"type": "object"}]}},
        "any[] | Record<string, any>",
    ),
    ("{{ toTypeScriptType .P }} {{ toTypeScriptType 3 }}", {"P": {}}, "any any"),
]


@pytest.mark.parametrize(("text", "data", "expected"), FUNCTIONS)
def test_functions(text: str, data: dict[str, Any], expected: str) -> None:
    assert render(text, data) == expected


PRINTF = [
    ("%s|%d|%v|%q", ["a", 3, 1.5, 'x"\n'], 'a|3|1.5|"x\\"\\n"'),
    (
        "%5d|%-5d|%05d|%+d|%x|%X|%#x|%o|%b",
        [42, 42, 42, 42, 255, 255, 255, 8, 5],
        "   42|42   |00042|+42|ff|FF|0xff|10|101",
    ),
    (
        "%.2f|%8.3f|%e|%g|%g",
        [3.14159, 2.5, 1234.5, 0.000012, 100000.0],
        "3.14|   2.500|1.234500e+03|1.2e-05|100000",
    ),
    ("%t|%v|%c|%q|%s", [True, None, 65, 97, ["a", "b"]], "true||A|'a'|[a b]"),
    ("%6s|%-6s|%.2s|%%", ["ab", "ab", "abc"], "    ab|ab    |ab|%"),
    ("%d %d", [1], "1 %!d(MISSING)"),
    ("%d", [1, "x"], "1%!(EXTRA string=x)"),
    ("%d|%s|%z", ["x", 5, 1], "%!d(string=x)|%!s(int=5)|%!z(int=1)"),
    ("end%", [], "end%!(NOVERB)"),
    ("%v", [{"k": [1]}], '{"k":[1]}'),
]


@pytest.mark.parametrize(("fmt", "args", "expected"), PRINTF)
def test_printf(fmt: str, args: list[Any], expected: str) -> None:
    text = "{{ printf .F " + " ".join(f"(index .A {i})" for i in range(len(args))) + " }}"
    assert render(text, {"F": fmt, "A": args}) == expected


def test_dates() -> None:
    today = dt.date.today()
    out = render('{{ currentDate }} {{ yesterdayDate }} {{ currentDate "ignored" }}')
    allowed = {(today - dt.timedelta(days=d)).isoformat() for d in (0, 1, 2)}
    parts = out.split()
    assert len(parts) == 3 and all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", p) for p in parts)
    assert set(parts) <= allowed
    assert dt.date.fromisoformat(parts[0]) - dt.date.fromisoformat(parts[1]) == dt.timedelta(days=1)


FALSY: list[Any] = ["", 0, 0.0, [], {}, None, False]
TRUTHY: list[Any] = [" ", 1, -1, 0.5, [0], {"a": 0}, True, "false"]


@pytest.mark.parametrize("value", FALSY)
def test_falsy_values(value: Any) -> None:
    assert render("{{ if .V }}T{{ else }}F{{ end }}", {"V": value}) == "F"


@pytest.mark.parametrize("value", TRUTHY)
def test_truthy_values(value: Any) -> None:
    assert render("{{ if .V }}T{{ else }}F{{ end }}", {"V": value}) == "T"


PRINTING = [
    (None, ""),
    (True, "true"),
    (3, "3"),
    (1.0, "1"),
    (-2.5, "-2.5"),
    (1e6, "1e+06"),
    (123456.0, "123456"),
    (0.0001, "0.0001"),
    (0.00001, "1e-05"),
    (1.5e300, "1.5e+300"),
    (["a", 1, True], "[a 1 true]"),
    ({"b": 1, "a": "é"}, '{"b":1,"a":"é"}'),
    ([{"a": 1}], '[{"a":1}]'),
]


@pytest.mark.parametrize(("value", "expected"), PRINTING)
def test_printing(value: Any, expected: str) -> None:
    assert render("{{ .V }}", {"V": value}) == expected


def test_references_finds_fields_anywhere_case_insensitively() -> None:
    t = parse_template(
        "{{ if .System }}{{ end }}{{ range $m := .Messages }}{{ $m.Content }}{{ end }}"
        '{{ with $.Tools }}{{ end }}{{ (index .Items 0).Suffix }}{{ printf "%s" .Response }}'
    )
    for name in (
        "System",
        "Messages",
        "Content",
        "Tools",
        "Items",
        "Suffix",
        "Response",
        "messages",
    ):
        assert t.references(name), name
    assert not t.references("Prompt")


def test_references_ignores_text_and_strings() -> None:
    t = parse_template('.Messages {{ ".Suffix" }} {{/* .Tools */}}')
    assert not t.references("Messages")
    assert not t.references("Suffix")
    assert not t.references("Tools")


def test_execute_until_cuts_after_the_first_action_reading_the_field() -> None:
    t = parse_template(
        "{{ if .S }}<s>{{ .S }}</s>{{ end }}[{{ .P }}] {{ .Response }}<end>{{ .More }}"
    )
    data = {"S": "sys", "P": "p", "Response": "r", "More": "m"}
    assert t.execute(data) == "<s>sys</s>[p] r<end>m"
    assert t.execute_until(data, "Response") == "<s>sys</s>[p] r"


def test_execute_until_inside_a_branch_drops_the_rest_of_it() -> None:
    t = parse_template("{{ if .Response }}A:{{ .Response }}!{{ else }}E{{ end }}tail")
    # The condition does not start the cut; the action in the body does.
    assert t.execute_until({"Response": "r"}, "Response") == "A:r"
    assert t.execute_until({"Response": ""}, "Response") == ""


ERRORS = [
    ("abc {{ .A", "unclosed action", 1, 5),
    ("x\n  {{/* never closed", "unclosed comment", 2, 3),
    ("{{/* c */ x}}", "comment ends before closing delimiter", 1, 10),
    ("{{ foo .A }}", 'function "foo" not defined', 1, 4),
    ("line one\nline two {{ .A | | .B }}", "missing command after '|'", 2, 16),
    ("{{ .A | .B }}", "non-executable command in pipeline stage 2", 1, 9),
    ('{{ .A | "x" }}', "non-executable command in pipeline stage 2", 1, 9),
    ("{{ .A .B }}", "can't give argument to non-function", 1, 7),
    ('{{ "abc }}', "unterminated quoted string", 1, 4),
    ("{{ `abc }}", "unterminated raw quoted string", 1, 4),
    ("a\nb\n  {{ if .A }}x", "{{if}} is not closed with {{end}}", 3, 6),
    ("{{ end }}", "unexpected {{end}}", 1, 4),
    ("{{ else }}", "unexpected {{else}}", 1, 4),
    ("{{ if 1 }}{{ else }}{{ else }}{{ end }}", "more than one {{else}} in {{if}}", 1, 24),
    ("{{ $x }}", 'undefined variable "$x"', 1, 4),
    ("{{ $x = 1 }}", 'undefined variable "$x"', 1, 4),
    ("{{ range .L }}{{ $v := 1 }}{{ end }}{{ $v }}", 'undefined variable "$v"', 1, 40),
    ("{{ break }}", "{{break}} outside {{range}}", 1, 4),
    ('{{ define "x" }}{{ end }}', "{{define}} is not supported", 1, 4),
    ('{{ template "x" }}', "{{template}} is not supported", 1, 4),
    ("{{ nil }}", "nil is not a command", 1, 4),
    ("{{ 12ab }}", "bad number syntax", 1, 4),
    ("{{ .A & .B }}", "unexpected '&' in action", 1, 7),
    ("{{ }}", "missing value for command", 1, 4),
    ("{{ if }}{{ end }}", "missing value for if", 1, 7),
    ("{{ (1 }}", "unclosed left paren", 1, 4),
    ("{{ ) }}", "unexpected ')' in operand", 1, 4),
    ("{{ $a, $b := .L }}", "too many declarations", 1, 4),
    ('{{ "\\q" }}', "invalid escape", 1, 5),
    ("{{ if .A }}{{ else if }}{{ end }}", "missing value for if", 1, 23),
]


@pytest.mark.parametrize(("text", "what", "line", "col"), ERRORS)
def test_parse_errors_say_what_and_where(text: str, what: str, line: int, col: int) -> None:
    with pytest.raises(InputError) as info:
        parse_template(text)
    message = str(info.value)
    assert message.startswith("template error: ")
    assert what in message
    assert message.endswith(f"at line {line} col {col}"), message
    assert info.value.status == 400


EXEC_ERRORS = [
    ("{{ index .L 3 }}", {"L": [1]}, "error calling index: index out of range: 3", 1, 4),
    ("x\n{{ eq .A 1 }}", {"A": "s"}, "incompatible types for comparison: string and int", 2, 4),
    ("{{ len 3 }}", {}, "len of type int", 1, 4),
    ("{{ ne 1 }}", {}, "wrong number of args for ne: want 2 got 1", 1, 4),
    ("{{ json }}", {}, "wrong number of args for json: want 1 got 0", 1, 4),
    ("{{ range .S }}{{ end }}", {"S": "abc"}, "range can't iterate over string", 1, 10),
    ("{{ .S.Field }}", {"S": "abc"}, "can't evaluate field Field in type string", 1, 4),
    ("{{ slice .L 2 1 }}", {"L": [1, 2]}, "invalid slice index: 2 > 1", 1, 4),
    ("{{ slice .L 0 2 1 }}", {"L": [1, 2]}, "invalid slice index: 2 > 1", 1, 4),
    ("{{ printf 3 }}", {}, "format must be a string", 1, 4),
    (
        "{{ range $i, $v := 3 }}{{ end }}",
        {},
        "can't use two variables when ranging over an integer",
        1,
        10,
    ),
    ("{{ eq .L .L }}", {"L": [1]}, "non-comparable type", 1, 4),
]


@pytest.mark.parametrize(("text", "data", "what", "line", "col"), EXEC_ERRORS)
def test_execution_errors_say_what_and_where(
    text: str, data: dict[str, Any], what: str, line: int, col: int
) -> None:
    t = parse_template(text)
    with pytest.raises(InputError) as info:
        t.execute(data)
    assert what in str(info.value)
    assert str(info.value).endswith(f"at line {line} col {col}"), str(info.value)


HOSTILE = [
    "{{ range 1000000000 }}{{ end }}",
    "{{ range $i := 100000 }}{{ range 100000 }}{{ range 100000 }}{{ end }}{{ end }}{{ end }}",
    "{{ range 1000000000 }}" + "x" * 70 + "{{ end }}",
    '{{ $s := "ab" }}{{ range 200 }}{{ $s = printf "%s%s" $s $s }}{{ end }}{{ $s }}',
    '{{ $s := "ab" }}{{ range 200 }}{{ $s = print $s $s }}{{ end }}',
    "{{ range .L }}{{ range $.L }}{{ range $.L }}{{ range $.L }}{{ . }}"
    "{{ end }}{{ end }}{{ end }}{{ end }}",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_templates_stop_quickly_with_a_clear_error(text: str) -> None:
    t = parse_template(text)
    start = time.perf_counter()
    with pytest.raises(
        InputError,
        match=r"template error: (execution stopped after|output exceeds|\w+ result exceeds)",
    ):
        t.execute({"L": list(range(200))})
    assert time.perf_counter() - start < 6


def test_time_limit_applies_even_with_a_large_step_budget() -> None:
    t = parse_template("{{ range 1000000000 }}{{ end }}")
    start = time.perf_counter()
    with pytest.raises(InputError, match=r"execution took longer than 0\.2 s"):
        t.execute({}, Limits(max_steps=10**12, timeout_s=0.2))
    assert time.perf_counter() - start < 1.5


def test_output_limit_is_exact() -> None:
    t = parse_template("{{ range 10 }}abc{{ end }}")
    assert t.execute({}, Limits(max_output=30)) == "abc" * 10
    with pytest.raises(InputError, match="output exceeds 29 characters"):
        t.execute({}, Limits(max_output=29))


def test_deep_nesting_is_refused_at_parse_time() -> None:
    with pytest.raises(InputError, match="nests deeper than 100 levels"):
        parse_template("{{ if 1 }}" * 150 + "{{ end }}" * 150)
    with pytest.raises(InputError, match="nests deeper than 100 levels"):
        parse_template("{{ " + "(" * 150 + "1" + ")" * 150 + " }}")
    assert render("{{ if 1 }}" * 50 + "x" + "{{ end }}" * 50) == "x"


def test_large_template_parses_fast() -> None:
    text = (
        '{{ range .Messages }}{{ if eq .Role "user" }}U: {{ .Content }}{{ end }}{{ end }}\n' * 5000
    )
    start = time.perf_counter()
    t = parse_template(text)
    assert time.perf_counter() - start < 5
    assert t.execute({"Messages": [{"Role": "user", "Content": "hi"}]}).count("U: hi") == 5000


def test_template_is_reusable_and_executions_do_not_leak_variables() -> None:
    t = parse_template("{{ $x := .A }}{{ range .L }}{{ $x = . }}{{ end }}{{ $x }}")
    assert t.execute({"A": "a", "L": [1]}) == "1"
    assert t.execute({"A": "a", "L": []}) == "a"


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_quoted_strings_round_trip(value: str) -> None:
    """go_quote writes what the lexer reads back, for any text (escapes, control chars, astral)."""
    assert render("{{ " + go_quote(value) + " }}") == value
    assert render('{{ printf "%q" .V }}', {"V": value}) == go_quote(value)


@settings(max_examples=200, deadline=None)
@given(st.text().filter(lambda s: "{{" not in s))
def test_text_without_actions_is_copied_verbatim(value: str) -> None:
    assert render(value) == value
