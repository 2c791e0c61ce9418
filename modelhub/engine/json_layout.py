"""Where a JSON grammar lets whitespace go.

llama-cpp-python's schema converter writes an optional ``space`` after every JSON token. What
that rule allows decides how much a model can write that is not JSON: with llama.cpp's own
``space`` (up to two newlines and twenty spaces or tabs) a small model spends its tokens on
blank lines between a key and its colon, and after the last ``}``. This module rewrites the
converter's output so that whitespace can go only where a layout puts it:

- ``PRETTY`` (``format`` and ``response_format`` schemas, ``format: "json"``): after ``{``,
  ``[`` and ``,`` and before ``}`` and ``]``, nothing, one space, or one newline with up to 20
  spaces or tabs of indentation (how pretty-printed JSON is laid out, which models write and
  drafts copy from the prompt); after ``:`` at most one space; nowhere else (not before ``:``
  or ``,``, not after the value's end).
- ``COMPACT`` (a forced tool call): at most one space after ``:`` and ``,``; nothing else, so
  the call costs hardly more tokens than its own text.

Either way a string holds no raw control characters (JSON forbids them; escapes stay).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NEWLINE = '"\\n" [ \\t]{0,20}'


@dataclass(frozen=True)
class Layout:
    """GBNF for the whitespace each place allows ("" for none)."""

    inner: str  # after an opening bracket and before a closing one
    separator: str  # after ","
    colon: str  # after ":"


PRETTY = Layout(inner=f'( " " | {_NEWLINE} )?', separator=f'( " " | {_NEWLINE} )?', colon='" "?')
COMPACT = Layout(inner="", separator='" "?', colon='" "?')

_SPACE = r"(?<![\w-])space(?![\w-])"
_CONTAINER = re.compile(r'^"([{\[])" ' + _SPACE + r'\s*(.*?)\s*"([}\]])" ' + _SPACE + "$")
_COLON = re.compile(r"(?:" + _SPACE + r'\s+)?":"\s+' + _SPACE)
_COMMA = re.compile(r'","\s+' + _SPACE)
_TRAILING = re.compile(r"\s*" + _SPACE)
# The converter's string character: anything but a quote or a backslash (raw newlines too).
_CHAR_ANY = '[^"\\\\]'
_CHAR_JSON = '[^"\\\\\\x7F\\x00-\\x1F]'


def relayout(gbnf: str, layout: Layout) -> str:
    """The converter's grammar ``gbnf`` (one rule per line, ``space`` after tokens) with
    whitespace only where ``layout`` allows it."""
    colon, comma = _join('":"', layout.colon), _join('","', layout.separator)
    rules = []
    for line in gbnf.splitlines():
        name, sep, body = line.partition(" ::= ")
        if not sep:
            rules.append(line)
            continue
        if name == "space":
            continue
        if name == "char":
            body = body.replace(_CHAR_ANY, _CHAR_JSON, 1)
        body = _container(body, layout)
        body = _COLON.sub(lambda _: colon, body)
        body = _COMMA.sub(lambda _: comma, body)
        body = _TRAILING.sub("", body)  # what is left follows a value: nothing there
        rules.append(f"{name} ::= {body}")
    return "\n".join(rules)


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _container(body: str, layout: Layout) -> str:
    """``"{" space INNER "}" space`` -> the brackets with ``layout.inner`` just inside them
    (around the members only: an empty object or array stays ``{}`` / ``[]``)."""
    found = _CONTAINER.match(body)
    if found is None:
        return body
    opener, inner, closer = found.groups()
    open_, close = f'"{opener}"', f'"{closer}"'
    if not inner:
        return f"{open_} {close}"
    if not layout.inner:
        return f"{open_} {inner} {close}"
    group = _optional_group(inner)
    if group is not None:  # the members may be absent: whitespace goes with them
        return f"{open_} ( {layout.inner} ( {group} ) {layout.inner} )? {close}"
    return f"{open_} {layout.inner} {inner} {layout.inner} {close}"


def _optional_group(text: str) -> str | None:
    """The inside of ``text`` when all of it is one ``( ... )?`` group, else None."""
    if not (text.startswith("(") and text.endswith(")?")):
        return None
    depth, i = 0, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':  # a literal: skip to its closing quote
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "[":  # a character class
            i += 1
            while i < len(text) and text[i] != "]":
                i += 2 if text[i] == "\\" else 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[1:i].strip() if i == len(text) - 2 else None
        i += 1
    return None
