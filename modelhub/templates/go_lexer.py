"""Lexer for the Go text/template subset used by Modelfile TEMPLATE.

It turns template text into a flat list of tokens: ``text`` runs and, for each ``{{ ... }}``
action, an ``open`` token, the tokens inside and a ``close`` token. Comments vanish here; the
``{{-`` / ``-}}`` trim markers are applied here too, exactly as Go does (a dash only counts as a
trim marker when whitespace separates it from the action's content).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from modelhub.errors import InputError

KEYWORDS = frozenset(
    {"if", "else", "end", "range", "with", "define", "template", "block", "break", "continue"}
)
_SPACE = " \t\r\n"
_SPACES = re.compile(r"[ \t\r\n]+")
_IDENT = re.compile(r"[^\W\d]\w*")
_NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F_]*(?:\.[0-9a-fA-F_]*)?(?:[pP][+-]?[0-9_]+)?"
    r"|0[bB][01_]+|0[oO][0-7_]+"
    r"|(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9_]+)?)"
)
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
}


@dataclass(frozen=True, slots=True)
class Token:
    """One lexical item. ``value`` is decoded (strings unquoted, numbers converted)."""

    kind: str  # text open close field dot var ident keyword string number bool nil | ( ) := = ,
    value: Any
    offset: int
    space_before: bool = False


class Positions:
    """Turns character offsets into 1-based (line, column) pairs for error messages."""

    def __init__(self, text: str) -> None:
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_col(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._starts, offset) - 1
        return line + 1, offset - self._starts[line] + 1


def template_error(positions: Positions, offset: int, what: str) -> NoReturn:
    line, col = positions.line_col(offset)
    raise InputError(f"template error: {what} at line {line} col {col}")


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.tokens: list[Token] = []
        self.positions = Positions(text)

    def fail(self, offset: int, what: str) -> NoReturn:
        template_error(self.positions, offset, what)

    def run(self) -> list[Token]:
        text = self.text
        trim_next_text = False
        while self.pos < len(text):
            start = text.find("{{", self.pos)
            end = len(text) if start < 0 else start
            chunk = text[self.pos : end]
            if trim_next_text:
                chunk = chunk.lstrip(_SPACE)
            if start >= 0 and text.startswith("-", start + 2) and _is_space(text, start + 3):
                chunk = chunk.rstrip(_SPACE)
            if chunk:
                self.tokens.append(Token("text", chunk, self.pos))
            if start < 0:
                break
            trim_next_text = self.action(start)
        return self.tokens

    def action(self, start: int) -> bool:
        """Lex one action starting at ``{{``; return whether it ends with a trim marker."""
        text = self.text
        self.pos = start + 2
        if text.startswith("-", self.pos) and _is_space(text, self.pos + 1):
            self.pos += 2
        if text.startswith("/*", self.pos):
            return self.comment(start)
        self.tokens.append(Token("open", None, start))
        space = False
        while True:
            blank = _SPACES.match(text, self.pos)
            if blank:
                self.pos = blank.end()
                space = True
                if text.startswith("-}}", self.pos):  # " -}}": close and trim what follows
                    self.tokens.append(Token("close", None, self.pos - 1))
                    self.pos += 3
                    return True
            if self.pos >= len(text):
                self.fail(start, "unclosed action")
            if text.startswith("}}", self.pos):
                self.tokens.append(Token("close", None, self.pos))
                self.pos += 2
                return False
            self.tokens.append(self.token(space))
            space = False

    def at_right_trim(self) -> bool:
        t, p = self.text, self.pos
        return _is_space(t, p) and t.startswith("-}}", p + 1)

    def comment(self, start: int) -> bool:
        close = self.text.find("*/", self.pos + 2)
        if close < 0:
            self.fail(start, "unclosed comment")
        self.pos = close + 2
        trim = self.at_right_trim()
        if not trim and not self.text.startswith("}}", self.pos):
            self.fail(self.pos, "comment ends before closing delimiter")
        self.pos += 4 if trim else 2
        return trim

    def token(self, space: bool) -> Token:
        text, at = self.text, self.pos
        ch = text[at]
        nxt = text[at + 1] if at + 1 < len(text) else ""
        simple = {"|": "|", "(": "(", ")": ")", ",": ","}
        if ch in simple:
            self.pos += 1
            return Token(simple[ch], ch, at, space)
        if text.startswith(":=", at):
            self.pos += 2
            return Token(":=", ":=", at, space)
        if ch == "=":
            self.pos += 1
            return Token("=", "=", at, space)
        if ch == '"':
            return Token("string", self.quoted(at), at, space)
        if ch == "`":
            close = text.find("`", at + 1)
            if close < 0:
                self.fail(at, "unterminated raw quoted string")
            self.pos = close + 1
            return Token("string", text[at + 1 : close].replace("\r", ""), at, space)
        if ch == "'":
            return Token("number", self.char(at), at, space)
        if ch == "$":
            m = _IDENT.match(text, at + 1)
            self.pos = m.end() if m else at + 1
            return Token("var", text[at : self.pos], at, space)
        if ch == "." and not nxt.isdigit():
            m = _IDENT.match(text, at + 1)
            if m is None:
                self.pos += 1
                return Token("dot", ".", at, space)
            self.pos = m.end()
            return Token("field", m.group(), at, space)
        if ch.isdigit() or (ch in "+-." and (nxt.isdigit() or nxt == ".")):
            return Token("number", self.number(at), at, space)
        m = _IDENT.match(text, at)
        if m is None:
            self.fail(at, f"unexpected {ch!r} in action")
        self.pos = m.end()
        word = m.group()
        if word in ("true", "false"):
            return Token("bool", word == "true", at, space)
        if word == "nil":
            return Token("nil", None, at, space)
        return Token("keyword" if word in KEYWORDS else "ident", word, at, space)

    def quoted(self, at: int) -> str:
        text, i = self.text, at + 1
        out: list[str] = []
        while True:
            if i >= len(text) or text[i] == "\n":
                self.fail(at, "unterminated quoted string")
            ch = text[i]
            if ch == '"':
                self.pos = i + 1
                return "".join(out)
            if ch == "\\":
                decoded, i = self.escape(i, '"')
                out.append(decoded)
                continue
            out.append(ch)
            i += 1

    def char(self, at: int) -> int:
        text = self.text
        if text.startswith("\\", at + 1):
            decoded, end = self.escape(at + 1, "'")
        else:
            decoded, end = text[at + 1 : at + 2], at + 2
        if len(decoded) != 1 or not text.startswith("'", end):
            self.fail(at, "bad character constant")
        self.pos = end + 1
        return ord(decoded)

    def escape(self, i: int, quote: str) -> tuple[str, int]:
        """Decode the escape at ``text[i] == '\\'``; return it and the offset after it."""
        text = self.text
        kind = text[i + 1 : i + 2]
        if kind in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[kind], i + 2
        if kind == quote:
            return quote, i + 2
        sizes = {"x": 2, "u": 4, "U": 8}
        if kind in sizes:
            digits = text[i + 2 : i + 2 + sizes[kind]]
            if len(digits) == sizes[kind] and all(c in "0123456789abcdefABCDEF" for c in digits):
                code = int(digits, 16)
                if code <= 0x10FFFF:
                    return chr(code), i + 2 + sizes[kind]
        elif kind in "01234567" and kind:
            digits = text[i + 1 : i + 4]
            if len(digits) == 3 and all(c in "01234567" for c in digits) and int(digits, 8) < 256:
                return chr(int(digits, 8)), i + 4
        self.fail(i, "invalid escape in quoted string")

    def number(self, at: int) -> int | float:
        m = _NUMBER.match(self.text, at)
        end = m.end() if m else at + 1
        if end < len(self.text) and (self.text[end].isalnum() or self.text[end] in "._"):
            self.fail(at, f"bad number syntax: {self.text[at : end + 1]!r}")
        self.pos = end
        return parse_number(self.text[at:end], lambda: self.fail(at, "bad number syntax"))


def parse_number(raw: str, fail: Any) -> int | float:
    """A Go number constant: ints stay ints, anything with a '.', exponent or 'p' is a float."""
    s = raw.replace("_", "")
    body = s.lstrip("+-")
    try:
        if body[:2].lower() == "0x":
            if any(c in body for c in ".pP"):
                return float.fromhex(s)
            return int(s, 16)
        if body[:2].lower() in ("0b", "0o"):
            return int(s, 0)
        if any(c in body for c in ".eE"):
            return float(s)
        if len(body) > 1 and body.startswith("0"):
            return int(s, 8)
        return int(s, 10)
    except ValueError:
        fail()
        raise


def _is_space(text: str, i: int) -> bool:
    return i < len(text) and text[i] in _SPACE


def lex(text: str) -> tuple[list[Token], Positions]:
    lexer = _Lexer(text)
    return lexer.run(), lexer.positions
