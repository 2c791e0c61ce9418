"""What a chat request asks of the reply: thinking, tools and ``tool_choice``, the same on both
API families, and the parser that splits the reply accordingly (``modelhub.replies``).

- ``think``: true/false or an effort; unset means "think" for a model whose template reasons
  (as Ollama does), asking it of a model that does not is a 400.
- ``tools``: a model whose template cannot show them refuses them (``does not support tools``,
  as Ollama answers), unless ``tool_choice`` is ``none``.
- ``tool_choice``: ``auto`` (the default: calls are parsed from the reply), ``none`` (the tools
  are not shown to the model), ``required`` or a named function in either of OpenAI's shapes
  (Chat Completions' ``{"type": "function", "function": {"name": ...}}``, the Responses API's
  ``{"type": "function", "name": ...}``): a grammar built from the tools' JSON schemas makes the
  reply exactly one call, well-formed and matching its schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelhub.engine.gbnf import format_grammar
from modelhub.errors import InputError
from modelhub.gguf.info import capabilities
from modelhub.library.views import ModelView
from modelhub.replies.reply import ReplyParser
from modelhub.replies.tool_calls import forced_call_grammar, template_marker
from modelhub.server.grammar_limits import check_grammar, check_schema

Think = bool | str | None


def template_text(view: ModelView) -> str | None:
    """The template the model's prompts are rendered with: its TEMPLATE, else the GGUF's."""
    if view.template:
        return view.template
    return view.info.chat_template if view.info is not None else None


def can_think(view: ModelView) -> bool:
    return view.info is not None and "thinking" in capabilities(view.info, view.template)


def thinking(view: ModelView, think: Think) -> Think:
    """The ``think`` value the prompt is rendered with (None: the template decides)."""
    if think is None:
        return True if can_think(view) else None
    if think is not False and not can_think(view):
        raise InputError(
            f'"{view.name.display}" does not support thinking: its template has no reasoning '
            "markers; leave think unset or false"
        )
    return think


@dataclass(frozen=True)
class ToolPlan:
    tools: list[Any] | None  # what the prompt shows
    grammar: str | None  # forces a call (tool_choice required / named)


def tool_plan(view: ModelView, tools: list[Any] | None, choice: Any) -> ToolPlan:
    """``tools`` and ``tool_choice`` (OpenAI's forms) -> what the prompt and sampler get."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise InputError("tool_choice needs tools: the request has none")
        return ToolPlan(None, None)
    if choice == "none":
        return ToolPlan(None, None)
    plan = ToolPlan(tools, None)
    if choice not in (None, "auto"):
        name = None if choice == "required" else forced_name(choice)
        check_schema(tools, "tools")  # their schemas become the forced call's grammar
        marker = template_marker(template_text(view))
        plan = ToolPlan(tools, forced_call_grammar(tools, marker, name))
    if not can_use_tools(view):
        raise InputError(
            f'"{view.name.display}" does not support tools: its template has no place for '
            'them; leave tools out, send tool_choice "none", or create the model with a '
            "TEMPLATE that shows .Tools"
        )
    return plan


def can_use_tools(view: ModelView) -> bool:
    return view.info is not None and "tools" in capabilities(view.info, view.template)


def forced_name(choice: Any) -> str:
    """The function a named ``tool_choice`` forces, in Chat Completions' shape or the
    Responses API's."""
    if isinstance(choice, dict) and choice.get("type", "function") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else choice.get("name")
        if isinstance(name, str) and name:
            return name
    raise InputError(
        'tool_choice must be "none", "auto", "required", '
        '{"type": "function", "function": {"name": ...}} or {"type": "function", "name": ...}'
    )


def reply_parser(
    view: ModelView, prompt: str, think: Think, tools: list[Any] | None
) -> ReplyParser | None:
    """The parser for this reply, or None when the text passes through as it is."""
    separate = think is not None and think is not False
    if not separate and not tools:
        return None
    return ReplyParser(template=template_text(view), prompt=prompt, think=separate, tools=tools)


def request_grammar(
    data: dict[str, Any],
    fmt: str | dict[str, Any] | None,
    tool_gbnf: str | None = None,
    *,
    format_field: str = "format",
) -> str | None:
    """The one grammar a request decodes under: its ``format`` (``"json"`` or a schema, read
    from ``format_field``), a forced tool call, or a raw GBNF ``grammar`` (llama.cpp's server
    extension); two at once cannot both hold. Whichever it is, it is bounded
    (``grammar_limits``) before any runner parses it."""
    raw = data.get("grammar")
    if raw is not None and not isinstance(raw, str):
        raise InputError('field "grammar" must be a GBNF string')
    if isinstance(fmt, dict):
        check_schema(fmt, format_field)
    given = [
        (where, gbnf)
        for where, gbnf in (
            (format_field, format_grammar(fmt)),
            ("tool_choice", tool_gbnf),
            ("grammar", raw or None),
        )
        if gbnf
    ]
    if len(given) > 1:
        raise InputError(
            "format, grammar and a forced tool call (tool_choice required or named) "
            "cannot be combined: give one of them"
        )
    for where, gbnf in given:
        check_grammar(gbnf, where)
    return given[0][1] if given else None
