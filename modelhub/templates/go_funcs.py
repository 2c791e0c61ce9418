"""The functions a TEMPLATE can call: Go's builtins that templates use, plus Ollama's helpers.

``and`` and ``or`` are evaluated lazily by the executor (Go short-circuits them since 1.18); they
are listed here so the parser knows the names. Lengths and byte indexes of strings count UTF-8
bytes, as in Go.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

from modelhub.templates.go_values import (
    TemplateValueError,
    equal,
    format_float,
    is_list,
    less,
    to_json,
    to_text,
    truth,
    type_name,
)

_VERB = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d*))?(.)?", re.S)
_QUOTE_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}
_TS_TYPES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "array": "any[]",
    "object": "Record<string, any>",
    "null": "null",
}


def go_quote(text: str) -> str:
    """Go's strconv.Quote: double-quoted with Go escapes, printable characters kept."""
    out = ['"']
    for ch in text:
        if ch in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def _pad(text: str, flags: str, width: int | None, numeric: bool) -> str:
    if width is None or len(text) >= width:
        return text
    if "-" in flags:
        return text.ljust(width)
    if "0" in flags and numeric:
        sign = text[0] if text[:1] in ("-", "+", " ") else ""
        return sign + text[len(sign) :].rjust(width - len(sign), "0")
    return text.rjust(width)


def _signed(body: str, negative: bool, flags: str) -> str:
    if negative:
        return "-" + body
    if "+" in flags:
        return "+" + body
    return " " + body if " " in flags else body


def _format_int(value: int, verb: str, flags: str) -> str:
    base = {"d": "d", "x": "x", "X": "X", "o": "o", "b": "b"}[verb]
    body = format(abs(value), base)
    if "#" in flags and verb in "xXo":
        body = {"x": "0x", "X": "0X", "o": "0"}[verb] + body
    return _signed(body, value < 0, flags)


def _format_float(value: float, verb: str, flags: str, prec: int | None) -> str:
    if verb in "gG" and prec is None:
        text = format_float(abs(value))
        body = text.upper() if verb == "G" else text
    else:
        body = format(abs(value), f".{6 if prec is None else prec}{verb}")
    return _signed(body, value < 0 or (value == 0 and str(value).startswith("-")), flags)


def _bad(verb: str, arg: Any) -> str:
    if arg is None:
        return f"%!{verb}(<nil>)"
    return f"%!{verb}({type_name(arg)}={to_text(arg)})"


def _format_one(verb: str, flags: str, width: int | None, prec: int | None, arg: Any) -> str:
    numeric = False
    is_int = isinstance(arg, int) and not isinstance(arg, bool)
    if verb == "v" and is_int:
        verb = "d"
    elif verb == "v" and isinstance(arg, float):
        verb = "g"
    if verb in ("v", "s"):
        if isinstance(arg, str | Mapping) or arg is None or (verb == "v") or is_list(arg):
            text = to_text(arg)
            if prec is not None:
                text = text[:prec]
        else:
            return _bad(verb, arg)
    elif verb in "dxXob" and is_int:
        text, numeric = _format_int(arg, verb, flags), True
    elif verb in "xX" and isinstance(arg, str):
        text = arg.encode().hex()
        text = text.upper() if verb == "X" else text
    elif verb in "feEgGF" and isinstance(arg, float):
        text, numeric = _format_float(arg, verb.lower() if verb == "F" else verb, flags, prec), True
    elif verb == "q" and isinstance(arg, str):
        text = go_quote(arg)
    elif verb == "q" and is_int:
        inner = {'"': '"', "'": "\\'"}.get(chr(arg)) or go_quote(chr(arg))[1:-1]
        text = f"'{inner}'"
    elif verb == "c" and is_int:
        text = chr(arg)
    elif verb == "t" and isinstance(arg, bool):
        text = to_text(arg)
    else:
        return _bad(verb, arg)
    return _pad(text, flags, width, numeric)


def sprintf(fmt: str, args: list[Any]) -> str:
    """Go's fmt.Sprintf for the verbs templates use, with Go's in-band error notes."""
    out: list[str] = []
    i = used = 0
    while i < len(fmt):
        j = fmt.find("%", i)
        if j < 0:
            out.append(fmt[i:])
            break
        out.append(fmt[i:j])
        m = _VERB.match(fmt, j)
        assert m is not None  # the pattern matches any '%'
        flags, width, prec, verb = m.groups()
        i = m.end()
        if verb is None:
            out.append("%!(NOVERB)")
            break
        if verb == "%":
            out.append("%")
            continue
        if used >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        precision = None if prec is None else int(prec or 0)
        out.append(
            _format_one(verb, flags, None if width is None else int(width), precision, args[used])
        )
        used += 1
    if used < len(args):
        extra = ", ".join(f"{type_name(a)}={to_text(a)}" for a in args[used:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _print(*args: Any) -> str:
    out: list[str] = []
    for n, arg in enumerate(args):
        if n and not isinstance(arg, str) and not isinstance(args[n - 1], str):
            out.append(" ")
        out.append(to_text(arg))
    return "".join(out)


def _println(*args: Any) -> str:
    return " ".join(to_text(a) for a in args) + "\n"


def _printf(fmt: Any, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise TemplateValueError(f"printf: format must be a string, not {type_name(fmt)}")
    return sprintf(fmt, list(args))


def _len(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, Mapping) or is_list(value):
        return len(value)
    raise TemplateValueError(f"len of type {type_name(value)}")


def _int_index(idx: Any, size: int, allow_end: bool) -> int:
    if not isinstance(idx, int) or isinstance(idx, bool):
        raise TemplateValueError(f"cannot index slice/array with type {type_name(idx)}")
    if idx < 0 or idx > size or (idx == size and not allow_end):
        raise TemplateValueError(f"index out of range: {idx}")
    return idx


def _index(item: Any, *indexes: Any) -> Any:
    for idx in indexes:
        if item is None:
            raise TemplateValueError("index of untyped nil")
        if isinstance(item, Mapping):
            item = item.get(idx) if isinstance(idx, str) else None
        elif isinstance(item, str):
            data = item.encode()
            item = data[_int_index(idx, len(data), False)]
        elif is_list(item):
            item = item[_int_index(idx, len(item), False)]
        else:
            raise TemplateValueError(f"can't index item of type {type_name(item)}")
    return item


def _slice(item: Any, *indexes: Any) -> Any:
    if isinstance(item, str):
        if len(indexes) > 2:
            raise TemplateValueError("cannot 3-index slice a string")
        data = item.encode()
        bounds = [_int_index(i, len(data), True) for i in indexes]
        lo, hi = (bounds + [0, len(data)][len(bounds) :])[:2]
        if lo > hi:
            raise TemplateValueError(f"invalid slice index: {lo} > {hi}")
        return data[lo:hi].decode(errors="replace")
    if not is_list(item):
        raise TemplateValueError(f"can't slice item of type {type_name(item)}")
    if len(indexes) > 3:
        raise TemplateValueError(f"too many slice indexes: {len(indexes)}")
    bounds = [_int_index(i, len(item), True) for i in indexes]
    lo, hi = (bounds + [0, len(item)][len(bounds) :])[:2]
    for a, b in itertools.pairwise(bounds):
        if a > b:
            raise TemplateValueError(f"invalid slice index: {a} > {b}")
    return list(item[lo:hi])


def _eq(first: Any, *others: Any) -> bool:
    if not others:
        raise TemplateValueError("missing argument for comparison")
    return any(equal(first, other) for other in others)


def _date(days_ago: int) -> Callable[..., str]:
    def date(*_format: Any) -> str:  # Ollama accepts and ignores a format argument
        return (dt.date.today() - dt.timedelta(days=days_ago)).isoformat()

    return date


def to_typescript_type(prop: Any) -> str:
    """Ollama's toTypeScriptType: a JSON-schema property's type as TypeScript."""
    if not isinstance(prop, Mapping):
        return "any"
    any_of = prop.get("anyOf")
    if is_list(any_of) and any_of:
        return " | ".join(to_typescript_type(p) for p in any_of)
    kind = prop.get("type")
    kinds: list[Any] = (
        [kind] if isinstance(kind, str) else list(kind or ()) if is_list(kind) else []
    )
    if not kinds:
        return "any"
    return " | ".join(_TS_TYPES.get(k, "any") if isinstance(k, str) else "any" for k in kinds)


# name -> (function, minimum args, maximum args or None)
FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int | None]] = {
    "and": (lambda *a: a[-1], 1, None),
    "or": (lambda *a: a[-1], 1, None),
    "not": (lambda a: not truth(a), 1, 1),
    "eq": (_eq, 1, None),
    "ne": (lambda a, b: not equal(a, b), 2, 2),
    "lt": (less, 2, 2),
    "le": (lambda a, b: less(a, b) or equal(a, b), 2, 2),
    "gt": (lambda a, b: less(b, a), 2, 2),
    "ge": (lambda a, b: less(b, a) or equal(a, b), 2, 2),
    "len": (_len, 1, 1),
    "index": (_index, 1, None),
    "slice": (_slice, 1, None),
    "print": (_print, 0, None),
    "println": (_println, 0, None),
    "printf": (_printf, 1, None),
    "json": (to_json, 1, 1),
    "currentDate": (_date(0), 0, None),
    "yesterdayDate": (_date(1), 0, None),
    "toTypeScriptType": (to_typescript_type, 1, 1),
}
FUNCTION_NAMES = frozenset(FUNCTIONS)
