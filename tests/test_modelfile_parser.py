"""The Modelfile grammar: Ollama's tricky cases (quoting, continuation, case, comments, unknown
commands), line numbers, fuzzing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelhub.errors import ModelfileError
from modelhub.modelfile import Command, normalize_requires, parse_modelfile
from modelhub.modelfile.parser import INVALID_COMMAND, INVALID_ROLE, _value_of

EXAMPLES = Path(__file__).resolve().parent.parent / "modelfiles"

Pairs = list[tuple[str, str]]


def pairs(source: str | bytes) -> Pairs:
    return [(c.name, c.args) for c in parse_modelfile(source)]


# (case number from §4.10, input, expected (name, args) pairs)
ACCEPTED: list[tuple[str, str, Pairs]] = [
    ("1", "from llama3\nsystem hi", [("model", "llama3"), ("system", "hi")]),
    ("2", "FROM llama3 # note", [("model", "llama3 # note")]),
    ("3", "   # c\n\tFROM x", [("model", "x")]),
    ("4", "FROM x\nPARAMETER  temperature 0.5", [("model", "x"), ("", "temperature 0.5")]),
    ("5", "FROM x\nPARAMETER temperature\t0.5", [("model", "x"), ("temperature", "0.5")]),
    ("7", "FROM x\nPARAMETER Temperature 0.1", [("model", "x"), ("Temperature", "0.1")]),
    ("9", "FROM x\nPARAMETER num_ctx 1.0", [("model", "x"), ("num_ctx", "1.0")]),
    (
        "10",
        'FROM x\nPARAMETER stop <|im_end|>\nPARAMETER stop "User: "',
        [("model", "x"), ("stop", "<|im_end|>"), ("stop", "User: ")],
    ),
    ("11", "FROM x\nPARAMETER stop ### User: ", [("model", "x"), ("stop", "### User:")]),
    ("12", 'FROM x\nPARAMETER stop "\\n"', [("model", "x"), ("stop", "\\n")]),
    (
        "13",
        "FROM x\nPARAMETER penalize_newline true",
        [("model", "x"), ("penalize_newline", "true")],
    ),
    ("14", "FROM x\nPARAMETER numa true", [("model", "x"), ("numa", "true")]),
    ("19", "FROM x\nmEsSaGe assistant ok", [("model", "x"), ("message", "assistant: ok")]),
    (
        "20",
        'FROM x\nMESSAGE user """multi\nline"""',
        [("model", "x"), ("message", "user: multi\nline")],
    ),
    ("23a", "FROM ", [("model", "")]),
    ("23b", "FROM \n", [("model", "")]),
    ("26", "PARAMETER p v\nFROM foo", [("p", "v"), ("model", "foo")]),
    ("27", "FROM a\nFROM b", [("model", "a"), ("model", "b")]),
    ("28", 'FROM "     model 1"', [("model", "     model 1")]),
    ("29", "FROM     FOOO BAR    ", [("model", "FOOO BAR")]),
    ("30", 'FROM x\nSYSTEM "a\\"b"', [("model", "x"), ("system", 'a\\"b')]),
    ("31", "FROM x\nSYSTEM 'single'", [("model", "x"), ("system", "'single'")]),
    ("32", 'FROM x\nSYSTEM "abc"""', [("model", "x"), ("system", 'abc""')]),
    ("35a", 'FROM x\nSYSTEM """"""', [("model", "x"), ("system", "")]),
    ("35b", 'FROM x\nSYSTEM ""', [("model", "x"), ("system", "")]),
    ("35c", "FROM x\nSYSTEM    ", [("model", "x"), ("system", "")]),
    ("36", 'FROM x\nSYSTEM """\n"""', [("model", "x"), ("system", "\n")]),
    ("37", 'FROM x\nSYSTEM """  padded  """', [("model", "x"), ("system", "  padded  ")]),
    (
        "38",
        'FROM x\nSYSTEM """line1\n# not a comment\nline3"""',
        [("model", "x"), ("system", "line1\n# not a comment\nline3")],
    ),
    ("39", 'FROM x\nSYSTEM "first\nsecond"', [("model", "x"), ("system", "first\nsecond")]),
    (
        "40",
        'FROM x\nSYSTEM "hello" world\nFROM y"',
        [("model", "x"), ("system", 'hello" world\nFROM y')],
    ),
    (
        "42",
        'FROM x\nTEMPLATE """x\n"""   \nSYSTEM s',
        [("model", "x"), ("template", "x\n"), ("system", "s")],
    ),
    ("44", 'FROM x\r\nSYSTEM "a\r\nb"', [("model", "x"), ("system", "a\r\nb")]),
    ("45a", "FROM x\nSYSTEM a\tb", [("model", "x"), ("system", "a\tb")]),
    ("45b", "FROM x\nSYSTEM a\u200db", [("model", "x"), ("system", "ab")]),
    ("45c", "FROM x\nSYSTEM \u00a0hi\u00a0", [("model", "x"), ("system", "hi")]),
    (
        "47",
        'FROM x\nDRAFT ./d.gguf\nDRAFT "./my draft.gguf"',
        [("model", "x"), ("draft", "./d.gguf"), ("draft", "./my draft.gguf")],
    ),
    ("49", 'FROM x\nSYSTEM """"quoted""""', [("model", "x"), ("system", '"quoted"')]),
    (
        "50",
        'FROM x\nLICENSE """MIT\n"""\nLICENSE Apache',
        [("model", "x"), ("license", "MIT\n"), ("license", "Apache")],
    ),
]


@pytest.mark.parametrize(("case", "source", "expected"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_cases(case: str, source: str, expected: Pairs) -> None:
    assert pairs(source) == expected


EOF_MESSAGE = "unexpected EOF"

# (case, input, message, line)
REJECTED: list[tuple[str, str, str, int | None]] = [
    ("6", "FROM x\nPARAMETER top-k 5", "unexpected EOF: top", 2),
    ("8", "FROM x\nPARAMETER num_ctx\n", "unexpected EOF: num_ctx", 2),
    ("15", "FROM x\nMESSAGE User hi", INVALID_ROLE, 2),
    ("16", "FROM x\nMESSAGE tool result", INVALID_ROLE, 2),
    ("17", "FROM x\nMESSAGE  user hi", INVALID_ROLE, 2),
    ("18", "FROM x\nMESSAGE system", EOF_MESSAGE, 2),
    ("21", "FROM\nSYSTEM x", INVALID_COMMAND, 2),
    ("22", "FROM", EOF_MESSAGE, 1),
    ("24a", "1FROM x", INVALID_COMMAND, 1),
    ("24b", "FROM: x", INVALID_COMMAND, 1),
    ("24c", "FOO bar", INVALID_COMMAND, 1),
    ("25", "PARAMETER temperature 1", "no FROM line", None),
    ("33", 'FROM x\nSYSTEM """"', EOF_MESSAGE, 2),
    ("34", 'FROM x\nSYSTEM """This is.""', EOF_MESSAGE, 2),
    ("41", 'FROM x\nSYSTEM """a""" b', EOF_MESSAGE, 2),
    ("43", "FROM x\r\nBAD y", INVALID_COMMAND, 3),
]


@pytest.mark.parametrize(
    ("case", "source", "message", "line"), REJECTED, ids=[c[0] for c in REJECTED]
)
def test_rejected_cases(case: str, source: str, message: str, line: int | None) -> None:
    with pytest.raises(ModelfileError) as caught:
        parse_modelfile(source)
    assert caught.value.line == line
    assert caught.value.message == (message if line is None else f"(line {line}): {message}")
    assert caught.value.status == 400


def test_invalid_command_message_is_ollamas() -> None:
    assert INVALID_COMMAND == (
        'command must be one of "from", "license", "template", "system", "adapter", "draft", '
        '"renderer", "parser", "parameter", "message", or "requires"'
    )
    assert INVALID_ROLE == 'message role must be one of "system", "user", or "assistant"'


@pytest.mark.parametrize(
    "encoded",
    [
        b"\xef\xbb\xbfFROM x\nSYSTEM h\xc3\xa9",
        "\ufeffFROM x\nSYSTEM hé".encode("utf-16-le"),
        "\ufeffFROM x\nSYSTEM hé".encode("utf-16-be"),
        "\ufeffFROM x\nSYSTEM hé",
        "FROM x\nSYSTEM hé".encode(),
    ],
    ids=["utf8-bom", "utf16le", "utf16be", "str-bom", "utf8"],
)
def test_case46_byte_order_marks(encoded: str | bytes) -> None:
    assert pairs(encoded) == [("model", "x"), ("system", "hé")]


def test_bom_before_a_comment_is_skipped() -> None:
    assert pairs(b"\xef\xbb\xbf# comment\nFROM x") == [("model", "x")]


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert pairs(b"FROM x\nSYSTEM a\xffb") == [("model", "x"), ("system", "a\ufffdb")]


@pytest.mark.parametrize(
    ("value", "stored"),
    [("0.14", "0.14"), ("v1", "1"), ("1.2.3-rc.1+build.5", "1.2.3-rc.1+build.5")],
)
def test_case48_requires_accepted(value: str, stored: str) -> None:
    command = parse_modelfile(f"FROM x\nREQUIRES {value}")[1]
    assert command == Command("requires", value, 2)
    assert normalize_requires(command.args) == stored


@pytest.mark.parametrize("value", ["latest", "1.2.3.4", "01.2", "1.2-rc1", "v", "1.0.0-01", ""])
def test_case48_requires_rejected(value: str) -> None:
    with pytest.raises(ModelfileError, match=r"\(line 4\): requires must be a valid semver"):
        normalize_requires(value, 4)


def test_keywords_are_all_recognised() -> None:
    source = "\n".join(
        [
            "FROM base",
            "ADAPTER ./lora.gguf",
            "DRAFT mtp",
            "TEMPLATE t",
            "SYSTEM s",
            "RENDERER qwen3",
            "PARSER qwen3",
            "LICENSE l",
            "MESSAGE user u",
            "REQUIRES 0.14",
            "PARAMETER seed 1",
        ]
    )
    assert [c.name for c in parse_modelfile(source)] == [
        "model",
        "adapter",
        "draft",
        "template",
        "system",
        "renderer",
        "parser",
        "license",
        "message",
        "requires",
        "seed",
    ]


def test_command_lines_are_where_instructions_start() -> None:
    source = '# header\n\nFROM x\nSYSTEM """a\nb\nc"""\n  PARAMETER seed 3\nDRAFT ngram\n'
    assert [(c.name, c.line) for c in parse_modelfile(source)] == [
        ("model", 3),
        ("system", 4),
        ("seed", 7),
        ("draft", 8),
    ]


def test_crlf_counts_every_line_twice() -> None:
    source = "FROM x\r\nSYSTEM s\r\nPARAMETER seed 1\r\n"
    assert [c.line for c in parse_modelfile(source)] == [1, 3, 5]
    with pytest.raises(ModelfileError) as caught:
        parse_modelfile("FROM x\r\nSYSTEM s\r\nMESSAGE bot hi\r\n")
    assert caught.value.line == 5


def test_lone_carriage_return_is_a_line_break() -> None:
    assert pairs("FROM x\rSYSTEM s") == [("model", "x"), ("system", "s")]


def test_unclosed_quote_reports_the_line_where_input_ended() -> None:
    with pytest.raises(ModelfileError) as caught:
        parse_modelfile('FROM x\nSYSTEM """one\ntwo\nthree\n\n\n')
    # "three" (line 4) is the last text before the input ends.
    assert (caught.value.line, caught.value.message) == (4, "(line 4): unexpected EOF")


def test_one_separator_after_message_and_parameter_then_any_blanks() -> None:
    assert pairs("FROM x\nMESSAGE user \t  hi  ") == [("model", "x"), ("message", "user: hi")]
    assert pairs("FROM x\nPARAMETER seed\t \t7") == [("model", "x"), ("seed", "7")]


def test_comment_only_at_line_start() -> None:
    source = "FROM x\n  # a comment\nSYSTEM a # b\n#SYSTEM c"
    assert pairs(source) == [("model", "x"), ("system", "a # b")]


def test_keyword_must_be_followed_by_blank() -> None:
    # As in Ollama, the line break that ends the keyword already counts: reported as line 3.
    with pytest.raises(ModelfileError, match=r"\(line 3\): command must be one of"):
        parse_modelfile("FROM x\nSYSTEM\n")
    with pytest.raises(ModelfileError, match=r"\(line 2\): command must be one of"):
        parse_modelfile("FROM x\nSYSTEM:x\n")


def test_control_characters_are_dropped_but_tabs_kept() -> None:
    assert pairs("FROM x\nSYSTEM a\x00b\x07c\td\x1b") == [("model", "x"), ("system", "abc\td")]


def test_empty_input_has_no_from() -> None:
    sources: list[str | bytes] = ["", "\n\n", "# only a comment", b""]
    for source in sources:
        with pytest.raises(ModelfileError) as caught:
            parse_modelfile(source)
        assert (caught.value.message, caught.value.line) == ("no FROM line", None)


def test_example_modelfiles_parse() -> None:
    files = sorted(EXAMPLES.glob("*.Modelfile"))
    assert len(files) >= 5, f"expected example Modelfiles in {EXAMPLES}"
    for path in files:
        commands = parse_modelfile(path.read_bytes())
        assert any(c.name == "model" for c in commands), path.name


# Fuzzing: the parser either returns commands or raises ModelfileError with a usable line.

_FRAGMENTS = st.sampled_from(
    [
        "FROM ",
        "from\t",
        "PARAMETER ",
        "MESSAGE ",
        "SYSTEM ",
        "DRAFT ",
        "TEMPLATE ",
        "user ",
        "stop ",
        "seed ",
        '"',
        '"""',
        "\n",
        "\r\n",
        "\r",
        " ",
        "\t",
        "#",
        "x",
        "é",
        "\u200d",
        "\x00",
        "1",
        "-",
        ":",
    ]
)
_MODELFILE_LIKE = st.lists(_FRAGMENTS, max_size=30).map("".join)


def _check_outcome(source: str | bytes) -> None:
    try:
        commands = parse_modelfile(source)
    except ModelfileError as exc:
        if exc.line is None:
            assert exc.message == "no FROM line"
        else:
            assert isinstance(exc.line, int) and exc.line >= 1
            assert exc.message.startswith(f"(line {exc.line}): ")
        return
    assert any(c.name == "model" for c in commands)
    assert all(c.line >= 1 for c in commands)


@settings(max_examples=250, deadline=None)
@given(st.one_of(_MODELFILE_LIKE, st.text(max_size=200)))
def test_fuzz_text_parses_or_raises_modelfile_error(source: str) -> None:
    _check_outcome(source)


@settings(max_examples=150, deadline=None)
@given(st.one_of(_MODELFILE_LIKE.map(lambda s: s.encode("utf-8")), st.binary(max_size=200)))
def test_fuzz_bytes_parses_or_raises_modelfile_error(source: bytes) -> None:
    _check_outcome(source)


def _spec_unquote(buffer: str) -> str | None:
    """§4.3 as written: trim, then the triple-quote rule, the single-quote rule, or as is."""
    text = buffer.strip(" \t\r\n")
    if text.startswith('"""'):
        return text[3:-3] if len(text) >= 6 and text.endswith('"""') else None
    if text.startswith('"'):
        return text[1:-1] if len(text) >= 2 and text.endswith('"') else None
    return text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(['"', '"""', " ", "\t", "\n", "\r", "a"]), max_size=14))
def test_value_completion_follows_the_quoting_rules(parts: list[str]) -> None:
    buffer = "".join(parts)
    assert _value_of(list(buffer)) == _spec_unquote(buffer)
