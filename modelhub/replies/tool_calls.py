"""Tool calls in a model's reply: found while it streams, returned as structured calls.

Models write calls in a handful of forms, all a JSON payload after an optional marker:

- Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one per call);
- Llama 3.x: ``<|python_tag|>{"name": ..., "parameters": {...}}`` or the bare JSON object at
  the start of the reply, several separated by ``;``;
- Mistral: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` and the newer
  ``[TOOL_CALLS]name[ARGS]{...}``;
- the marker a model's own template writes before its ``.ToolCalls`` (derived as Ollama does:
  the text between ``{{ if .ToolCalls }}`` and the next action), which covers the rest.

Markers that are control tokens (``<|python_tag|>``, Mistral's) render as nothing, so the bare
JSON form also stands for them. A payload is a call only if it parses, names one of the
request's tools and has object arguments; anything else stays content, word for word, so an
unparseable reply is never an error. Text around calls stays content too, but not the
whitespace between it and a call: whitespace beside a call is never content (a reply of calls
and blank lines has empty content, as Ollama's). While a marker may be starting, a payload is
incomplete or whitespace may turn out to precede a call, the text is held back (at most until
the reply ends).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Markers that open a call, with the text that closes it ("" when the payload ends it).
KNOWN_MARKERS: dict[str, str] = {
    "<tool_call>": "</tool_call>",
    "<|python_tag|>": "",
    "[TOOL_CALLS]": "",
    "<function_call>": "</function_call>",
}
_MISTRAL_ARGS = "[ARGS]"
_GO_TOOL_CALLS = re.compile(r"\{\{-?\s*(?:if|range)\s+[^}]*\.ToolCalls\s*-?\}\}([^{]*)")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    index: int
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(8))

    def ollama(self) -> dict[str, Any]:
        """Ollama's ``message.tool_calls[]`` entry (arguments as an object)."""
        function = {"index": self.index, "name": self.name, "arguments": self.arguments}
        return {"id": self.id, "function": function}

    def openai(self) -> dict[str, Any]:
        """OpenAI's ``tool_calls[]`` entry (arguments as a JSON string)."""
        arguments = json.dumps(self.arguments, ensure_ascii=False)
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }


def tool_names(tools: Iterable[Any]) -> list[str]:
    """The function names a request offers (OpenAI/Ollama ``tools`` entries)."""
    names = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            names.append(function["name"])
    return names


def template_marker(template: str | None) -> str | None:
    """The marker a template writes before its tool calls: the literal text after a Go
    ``{{ if .ToolCalls }}`` up to the next action (without the JSON it opens), or a known
    marker a Jinja template mentions; "" when calls are bare JSON; None when unknown."""
    if not template:
        return None
    found = _GO_TOOL_CALLS.search(template)
    if found:
        return found.group(1).strip().rstrip("[{").strip()
    for marker in KNOWN_MARKERS:
        if marker in template:
            return marker
    return None


class ToolCallParser:
    """Splits a streamed reply into content and tool calls.

    ``feed`` takes the next piece of text and returns the content now safe to show and the
    calls completed; ``finish`` returns what was held back at the end."""

    def __init__(self, tools: Iterable[Any], marker: str | None = None) -> None:
        self.names = set(tool_names(tools))
        self.closers = dict(KNOWN_MARKERS)
        if marker:
            opener = marker
            self.closers.setdefault(opener, _closer(opener))
        self._buf = ""
        self._started = False  # the reply has shown something other than whitespace
        self._after_call = False  # a call just ended: whitespace that follows is not content
        self._gap = ""  # the whitespace between content and the marker being read
        self._marker: str | None = None  # inside a call: the text that opened it
        self.count = 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        return self._drain(final=True)

    # ---- the scanner ---------------------------------------------------------------------------
    def _drain(self, final: bool) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self._marker is None:
                if not self._find_marker(content, final):
                    break
                continue
            parsed = self._payload(final)
            if parsed is None:  # incomplete: wait for more text
                break
            if parsed is False:  # not a call after all: the marker is content
                content.append(self._gap + self._marker)
                self._gap = ""
                self._marker = None
                self._started = True
                continue
            calls.extend(parsed)
        if final and self._buf:
            content.append(self._buf)
            self._buf = ""
        return "".join(content), calls

    def _find_marker(self, content: list[str], final: bool) -> bool:
        """In text: move content out of the buffer up to a marker (True: one was found).
        Whitespace that ends the buffer is held: it is content only if text follows it."""
        if self._after_call:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._after_call = False
        buf = self._buf
        if not self._started:
            stripped = buf.lstrip()
            if not stripped:
                return False  # only whitespace so far: undecided
            if stripped[0] in "{[":  # a bare JSON call can only open the reply
                self._marker, self._buf = buf[: len(buf) - len(stripped)], stripped
                return True
            self._started = True
        at, marker = _earliest(buf, self.closers)
        if marker is not None:
            before = buf[:at].rstrip()
            content.append(before)
            self._gap = buf[len(before) : at]  # content again if no call follows
            self._marker, self._buf = marker, buf[at + len(marker) :]
            return True
        hold = 0 if final else _partial_length(buf, self.closers)
        hold += len(buf[: len(buf) - hold]) - len(buf[: len(buf) - hold].rstrip())
        content.append(buf[: len(buf) - hold])
        self._buf = buf[len(buf) - hold :]
        return False

    def _payload(self, final: bool) -> list[ToolCall] | Literal[False] | None:
        """After a marker: the calls (consumed from the buffer), None to wait, False if not."""
        assert self._marker is not None
        text = self._buf.lstrip()
        if not text:
            return False if final else None
        name: str | None = None
        if text[0] not in "{[":
            if self._marker.strip() != "[TOOL_CALLS]":
                return False
            at = text.find(_MISTRAL_ARGS)  # [TOOL_CALLS]name[ARGS]{...}
            if at < 0:
                return False if final or len(text) > 256 else None
            name, text = text[:at].strip(), text[at + len(_MISTRAL_ARGS) :].lstrip()
            if not text:
                return False if final else None
        end = json_end(text)
        if end is None:
            return False if final else None
        if end < 0:
            return False
        try:
            value = json.loads(text[:end])
        except ValueError:
            return False
        if name is not None:
            value = {"name": name, "arguments": value}
        calls = self._calls(value)
        if calls is None:
            return False
        rest = text[end:]
        closer = self.closers.get(self._marker.strip(), "")
        stripped = rest.lstrip()
        if closer:
            if stripped.startswith(closer):
                rest = stripped[len(closer) :]
            elif not final and closer.startswith(stripped):
                return None  # the closer may be arriving
        elif not final and not stripped:
            return None  # a ";" and another call may follow
        next_marker: str | None = None
        if stripped.startswith(";"):  # Llama's separator between calls
            next_marker, rest = self._marker, stripped[1:]
        self._buf = rest
        self._marker = next_marker
        self._started = self._after_call = True
        self._gap = ""
        self.count += len(calls)
        return calls

    def _calls(self, value: Any) -> list[ToolCall] | None:
        items = value if isinstance(value, list) else [value]
        out: list[ToolCall] = []
        for item in items:
            call = _one_call(item)
            if call is None or (self.names and call[0] not in self.names):
                return None
            out.append(ToolCall(call[0], call[1], self.count + len(out)))
        return out or None


def _one_call(item: Any) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) of one call object in any of the forms models write."""
    if not isinstance(item, Mapping):
        return None
    if isinstance(item.get("function"), Mapping):
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    return (name, dict(arguments)) if isinstance(arguments, Mapping) else None


def json_end(text: str) -> int | None:
    """The index just after the JSON object or array that opens ``text``; None when it is not
    complete yet, -1 when its brackets do not match."""
    stack: list[str] = []
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return -1
            if not stack:
                return i + 1
        elif not stack:
            return -1
    return None


def _closer(marker: str) -> str:
    """``<tag>`` closes with ``</tag>``; other markers have no closer."""
    if marker.startswith("<") and marker.endswith(">") and not marker.startswith("</"):
        return "</" + marker[1:]
    return ""


def _earliest(text: str, markers: Iterable[str]) -> tuple[int, str | None]:
    best, found = len(text), None
    for marker in markers:
        at = text.find(marker)
        if at != -1 and at < best:
            best, found = at, marker
    return best, found


def _partial_length(text: str, markers: Iterable[str]) -> int:
    """The longest end of ``text`` that could be the start of a marker."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:n]):
                longest = n
                break
    return longest


def forced_call_grammar(tools: Iterable[Any], marker: str | None, name: str | None = None) -> str:
    """GBNF admitting exactly one call of one of ``tools`` (of ``name`` only, when given) in
    the form ``marker`` implies, with arguments that match the tool's JSON schema: what
    ``tool_choice`` "required" or a named function guarantees. The JSON is compact (at most
    one space after ``:`` and ``,``) and nothing follows the call, so it arrives within a
    budget just above its own length."""
    from modelhub.engine.gbnf import schema_grammar
    from modelhub.engine.json_layout import COMPACT

    choices = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        if name is not None and function["name"] != name:
            continue
        parameters = function.get("parameters") or {"type": "object"}
        choices.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not choices:
        from modelhub.errors import InputError

        wanted = f"a function named {name!r}" if name else "a function"
        raise InputError(f"tool_choice asks for {wanted}, but the request's tools have none")
    schema = choices[0] if len(choices) == 1 else {"anyOf": choices}
    rules = re.sub(r"^root ::=", "forced-call ::=", schema_grammar(schema, COMPACT), flags=re.M)
    opener = (marker or "").strip()
    closer = KNOWN_MARKERS.get(opener, _closer(opener)) if opener else ""
    parts = [_literal(opener), '"\\n"'] if opener else []
    parts.append("forced-call")
    if closer:
        parts += ['"\\n"', _literal(closer)]
    return f"root ::= {' '.join(parts)}\n{rules}"


def _literal(text: str) -> str:
    return json.dumps(text)  # a GBNF string literal: the same escapes as JSON for these
