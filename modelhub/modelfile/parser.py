"""Modelfile text -> a list of commands, following Ollama's grammar to the character.

The scanner is a small state machine over characters. Its quirks are deliberate, because a
Modelfile that Ollama accepts must mean the same thing here:

- ``\\r`` and ``\\n`` each count as a line break (a CRLF file counts every line twice);
- ``#`` starts a comment only as the first non-blank character of a line;
- exactly one space or tab separates ``PARAMETER``/``MESSAGE`` from the name/role;
- a value ends at the first line break where the trimmed text so far is "complete" (bare, or
  closed by ``"`` / ``\"\"\"``), so quoted values may span lines; there are no escapes;
- characters that are not printable (controls, format characters, spaces other than the ASCII
  space) are dropped from values, except tabs and the line breaks inside a quoted value.
"""

from __future__ import annotations

import enum
import unicodedata
from dataclasses import dataclass

from modelhub.errors import ModelfileError

# Instruction keywords (matched case-insensitively). DRAFT is the one this project extends.
KEYWORDS: frozenset[str] = frozenset(
    {
        "from",
        "license",
        "template",
        "system",
        "adapter",
        "draft",
        "renderer",
        "parser",
        "parameter",
        "message",
        "requires",
    }
)

# Command names produced for instructions other than PARAMETER (FROM becomes "model").
INSTRUCTION_NAMES: frozenset[str] = (KEYWORDS - {"from", "parameter"}) | {"model"}

MESSAGE_ROLES: tuple[str, ...] = ("system", "user", "assistant")

INVALID_COMMAND = (
    'command must be one of "from", "license", "template", "system", "adapter", "draft", '
    '"renderer", "parser", "parameter", "message", or "requires"'
)
INVALID_ROLE = 'message role must be one of "system", "user", or "assistant"'
UNEXPECTED_EOF = "unexpected EOF"
NO_FROM = "no FROM line"

_LINE_BREAKS = "\r\n"
_BLANKS = " \t"
_TRIM = " \t\r\n"  # the only whitespace a value buffer can hold (other spaces are dropped)


@dataclass(frozen=True)
class Command:
    """One instruction: ``name`` is "model" for FROM, the parameter's own name for PARAMETER,
    otherwise the lower-cased keyword; ``args`` is the unquoted value ("role: content" for
    MESSAGE); ``line`` is the 1-based line where the instruction starts."""

    name: str
    args: str
    line: int


class _State(enum.Enum):
    BETWEEN = enum.auto()  # start of a line, outside any instruction
    KEYWORD = enum.auto()
    PARAM_NAME = enum.auto()
    ROLE = enum.auto()
    VALUE = enum.auto()
    COMMENT = enum.auto()


def parse_modelfile(source: str | bytes) -> list[Command]:
    """Parse a Modelfile; raise :class:`ModelfileError` (with a line number where one exists)."""
    text = _decode(source)
    commands: list[Command] = []
    state = _State.BETWEEN
    buf: list[str] = []
    name = ""  # command name of the instruction being read
    role = ""  # MESSAGE role of the instruction being read
    start = 1  # line where that instruction started
    line = 1
    content_line = 1  # line of the last character that was not a line break

    for ch in text:
        if ch in _LINE_BREAKS:
            line += 1
        else:
            content_line = line

        if state is _State.BETWEEN:
            if ch == "#":
                state = _State.COMMENT
            elif ch not in _BLANKS and ch not in _LINE_BREAKS:
                state, start = _State.KEYWORD, line
                buf = [ch] if is_printable(ch) else []
        elif state is _State.COMMENT:
            if ch in _LINE_BREAKS:
                state = _State.BETWEEN
        elif state is _State.KEYWORD:
            if _is_ascii_letter(ch):
                buf.append(ch)
            elif ch in _BLANKS:
                keyword = "".join(buf).lower()
                if keyword not in KEYWORDS:
                    raise ModelfileError(INVALID_COMMAND, line)
                buf = []
                if keyword == "parameter":
                    state = _State.PARAM_NAME
                elif keyword == "message":
                    name, state = "message", _State.ROLE
                else:
                    name, state = ("model" if keyword == "from" else keyword), _State.VALUE
            else:
                # A digit, ":", "_", a line break... right after or inside a keyword.
                raise ModelfileError(INVALID_COMMAND, line)
        elif state is _State.PARAM_NAME:
            if _is_ascii_letter(ch) or "0" <= ch <= "9" or ch == "_":
                buf.append(ch)
            elif ch in _BLANKS:
                # One separator only: a second blank ends an empty name (Ollama does the same).
                name, buf, state = "".join(buf), [], _State.VALUE
            else:
                raise ModelfileError(_unexpected_eof(buf), content_line)
        elif state is _State.ROLE:
            if _is_ascii_letter(ch):
                buf.append(ch)
            elif ch in _BLANKS:
                role = "".join(buf)
                if role not in MESSAGE_ROLES:
                    raise ModelfileError(INVALID_ROLE, line)
                buf, state = [], _State.VALUE
            else:
                raise ModelfileError(_unexpected_eof(buf), content_line)
        elif ch in _LINE_BREAKS:  # state is VALUE
            value = _value_of(buf)
            if value is None:
                buf.append(ch)  # an open quote: the value continues on the next line
            else:
                commands.append(Command(name, f"{role}: {value}" if role else value, start))
                buf, role, state = [], "", _State.BETWEEN
        elif ch in _BLANKS or is_printable(ch):
            buf.append(ch)

    if state is _State.VALUE:
        value = _value_of(buf)
        if value is None:
            raise ModelfileError(UNEXPECTED_EOF, content_line)
        commands.append(Command(name, f"{role}: {value}" if role else value, start))
    elif state is not _State.BETWEEN and state is not _State.COMMENT:
        raise ModelfileError(UNEXPECTED_EOF, content_line)

    if not any(command.name == "model" for command in commands):
        raise ModelfileError(NO_FROM)
    return commands


def _value_of(buf: list[str]) -> str | None:
    """The value held by a buffer, or None while a quote is still open.

    The buffer is trimmed; then ``\"\"\"x\"\"\"`` (at least six characters) and ``"x"`` (at
    least two) lose their outer quotes and anything else is taken as it is. Inner quotes and
    backslashes are literal. Works on the list so that a long quoted value is not joined again
    at each of its line breaks.
    """
    start, end = 0, len(buf)
    while start < end and buf[start] in _TRIM:
        start += 1
    while end > start and buf[end - 1] in _TRIM:
        end -= 1
    quotes = (
        3 if buf[start : start + 3] == ['"'] * 3 else 1 if buf[start : start + 1] == ['"'] else 0
    )
    if quotes and (end - start < 2 * quotes or buf[end - quotes : end] != ['"'] * quotes):
        return None
    return "".join(buf[start + quotes : end - quotes])


def _decode(source: str | bytes) -> str:
    """Bytes are UTF-8 unless a UTF-16 byte-order mark says otherwise; a BOM is skipped.

    Invalid sequences become U+FFFD rather than an error, as in Ollama.
    """
    if isinstance(source, str):
        return source.removeprefix("\ufeff")
    if source.startswith(b"\xef\xbb\xbf"):
        return source[3:].decode("utf-8", errors="replace")
    if source.startswith(b"\xff\xfe"):
        return source[2:].decode("utf-16-le", errors="replace")
    if source.startswith(b"\xfe\xff"):
        return source[2:].decode("utf-16-be", errors="replace")
    return source.decode("utf-8", errors="replace")


def _unexpected_eof(buf: list[str]) -> str:
    partial = "".join(buf)
    return f"{UNEXPECTED_EOF}: {partial}" if partial else UNEXPECTED_EOF


def _is_ascii_letter(ch: str) -> bool:
    return "a" <= ch <= "z" or "A" <= ch <= "Z"


def is_printable(ch: str) -> bool:
    """Go's ``strconv.IsPrint``: letters, marks, numbers, punctuation, symbols, ASCII space."""
    if " " <= ch <= "~":
        return True
    if ch < "\xa0":  # C0 controls, DEL, C1 controls
        return False
    return unicodedata.category(ch)[0] in "LMNPS"
