"""One streamed reply read into its parts: reasoning, content and tool calls.

Reasoning comes first in a reply, so the text goes through the thinking parser, and what it
calls content goes through the tool-call parser. Either parser is skipped when the request does
not ask for it (no ``think``, no ``tools``), and the text then passes through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelhub.replies.thinking import ThinkingParser, prompt_opens_thinking, template_markers
from modelhub.replies.tool_calls import ToolCall, ToolCallParser, template_marker


@dataclass
class ReplyPart:
    thinking: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.thinking or self.content or self.calls)

    def add(self, later: ReplyPart) -> None:
        """Append a later part (the whole reply, gathered)."""
        self.thinking += later.thinking
        self.content += later.content
        self.calls += later.calls


class ReplyParser:
    def __init__(
        self,
        *,
        template: str | None,
        prompt: str = "",
        think: bool = False,
        tools: list[Any] | None = None,
    ) -> None:
        """``template``: the one the prompt was rendered with (Go or Jinja text); ``think``:
        separate reasoning; ``tools``: the request's tools (parse calls to them)."""
        self._thinking: ThinkingParser | None = None
        if think:
            markers = template_markers(template) or ("<think>", "</think>")
            inside = prompt_opens_thinking(prompt, markers)
            self._thinking = ThinkingParser(markers, inside=inside)
        self._tools = ToolCallParser(tools, template_marker(template)) if tools else None
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> ReplyPart:
        return self._split(text, final=False)

    def finish(self) -> ReplyPart:
        return self._split("", final=True)

    def _split(self, text: str, final: bool) -> ReplyPart:
        part = ReplyPart(content=text)
        if self._thinking is not None:
            step = self._thinking.finish() if final else self._thinking.feed(text)
            part.thinking, part.content = step
        if self._tools is not None:
            step2 = self._tools.feed(part.content)
            if final:
                rest = self._tools.finish()
                step2 = (step2[0] + rest[0], step2[1] + rest[1])
            part.content, part.calls = step2
            self.calls += part.calls
        return part
