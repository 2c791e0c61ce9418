"""Reasoning in a model's reply: the text between the thinking markers, split from the content.

Models that reason write ``<think>...</think>`` (or their template's markers) before the
answer; templates that start the reasoning themselves end the prompt with the opening marker,
so the reply begins inside it. Only a marker at the start of the reply (after whitespace) opens
reasoning, as Ollama does; after the closing marker everything is content. A reply that ends
while still reasoning keeps what it had as thinking.
"""

from __future__ import annotations

import re

DEFAULT_MARKERS = ("<think>", "</think>")
_GO_THINKING = re.compile(r"([^\s{}]+)\s*\{\{-?\s*\.Thinking\s*-?\}\}\s*([^\s{}]+)")


def template_markers(template: str | None) -> tuple[str, str] | None:
    """The markers around ``.Thinking`` in a Go template (``<think>{{ .Thinking }}</think>``),
    ``<think>``/``</think>`` for any template that mentions them, None when it has none."""
    if not template:
        return None
    found = _GO_THINKING.search(template)
    if found:
        return found.group(1), found.group(2)
    if DEFAULT_MARKERS[0] in template or "enable_thinking" in template:
        return DEFAULT_MARKERS
    return None


class ThinkingParser:
    """``feed(text) -> (thinking, content)`` as the reply streams; ``finish()`` at the end."""

    def __init__(self, markers: tuple[str, str] = DEFAULT_MARKERS, *, inside: bool = False):
        """``inside``: the prompt ended with the opening marker (the reply starts reasoning)."""
        self.open, self.close = markers
        self._state = "thinking" if inside else "start"
        self._buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, str]:
        thinking, content = "", ""
        if self._state == "start":
            stripped = self._buf.lstrip()
            if stripped.startswith(self.open):
                self._state, self._buf = "thinking", stripped[len(self.open) :]
            elif not final and self.open.startswith(stripped):
                return "", ""  # whitespace or a partial marker: undecided
            else:
                self._state = "content"
        if self._state == "thinking":
            at = self._buf.find(self.close)
            if at >= 0:
                thinking = self._buf[:at]
                self._state, self._buf = "answer", self._buf[at + len(self.close) :]
            else:
                hold = 0 if final else _partial(self._buf, self.close)
                thinking = self._buf[: len(self._buf) - hold]
                self._buf = self._buf[len(self._buf) - hold :]
                return thinking, ""
        if self._state == "answer":  # the whitespace after the closing marker is not content
            self._buf = self._buf.lstrip()
            if self._buf:
                self._state = "content"
        if self._state == "content":
            content, self._buf = self._buf, ""
        return thinking, content


def _partial(text: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def prompt_opens_thinking(prompt: str, markers: tuple[str, str]) -> bool:
    """True when the rendered prompt leaves the model inside its reasoning."""
    tail = prompt.rstrip()
    return tail.endswith(markers[0])
