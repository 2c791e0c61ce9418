"""Prompt building: messages (+ tools, system, suffix) -> the text the engine tokenizes.

Which template renders, as Ollama decides:

1. A Go TEMPLATE (from the Modelfile, or a request's ``template``; an empty one counts as none)
   wins. Its mode:
   - fill-in-the-middle when a ``suffix`` is given: ``.Prompt``, ``.Suffix``, ``.Response`` ("");
   - "messages" when the template reads ``.Messages``: consecutive messages of the same role
     (except ``tool``) are merged with a blank line, ``.System`` is every system message joined
     by a blank line, ``.Tools`` the tools;
   - "legacy" otherwise: the template runs once per turn with ``.System``, ``.Prompt`` and
     ``.Response``; the last turn is cut after its first ``.Response`` so generation continues
     there. A template that never reads ``.Response`` gets the response appended after it.
2. Else the GGUF's Jinja chat template, rendered as Hugging Face does, with a generation prompt
   unless the last message is the assistant's (then its text is continued).
3. Else the plain prompt: the default template ``{{ .Prompt }}`` in legacy mode.

BOS rule: the engine tokenizes with ``add_special=True``, so the tokenizer inserts BOS itself when
the model wants one. Chat templates often also start with ``{{ bos_token }}``; when
``tokenizer_adds_bos`` is true (the default) a BOS text at the very start of the rendered prompt
is removed, so the model never sees two. Pass False for models whose tokenizer does not add BOS
(GGUF ``tokenizer.ggml.add_bos_token = false``): then the template's BOS is kept.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelhub.errors import InputError
from modelhub.templates.gotemplate import GoTemplate, parse_template
from modelhub.templates.jinja_chat import compile_chat_template, render_chat_template

DEFAULT_TEMPLATE = "{{ .Prompt }}"
_TOOL_KEYS = ("type", "items", "function")
_FUNCTION_KEYS = ("name", "description", "parameters")
_PARAMETERS_KEYS = ("type", "$defs", "items", "required", "properties")


@dataclass
class PromptInput:
    """What a prompt is built from, after the server has assembled the conversation."""

    messages: list[dict[str, Any]]
    system: str | None
    tools: list[Any] | None = None
    suffix: str | None = None


@functools.lru_cache(maxsize=64)
def _parse_outcome(text: str) -> GoTemplate | InputError:
    """The parsed template, or its error: both cached, as a large template takes seconds to
    parse whichever way it ends."""
    try:
        return parse_template(text)
    except InputError as exc:
        return InputError(exc.message)  # without the traceback, which holds the parser


def _parsed(text: str) -> GoTemplate:
    outcome = _parse_outcome(text)
    if isinstance(outcome, InputError):
        raise InputError(outcome.message)
    return outcome


def prepare_templates(go_template: str | None, jinja_template: str | None = None) -> None:
    """Parse the template a prompt will be rendered with (the Go template if there is one,
    else the Jinja one) into the caches, errors included: the costly step of rendering, for a
    caller to run off the event loop. Raises nothing; rendering raises the error."""
    if go_template:
        _parse_outcome(go_template)
    elif jinja_template:
        with contextlib.suppress(InputError):
            compile_chat_template(jinja_template)


def _as_template(template: str | GoTemplate) -> GoTemplate:
    return template if isinstance(template, GoTemplate) else _parsed(template)


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise InputError(f"message content must be a string, got {type(content).__name__}")
    return content


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as an object; OpenAI clients send them as a JSON string."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return {} if raw is None else raw


def _tool_call(index: int, call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise InputError("each tool call must be an object with a 'function'")
    function = call.get("function") or {}
    return {
        "id": call.get("id") or "",
        "function": {
            "index": function.get("index", index),
            "name": function.get("name") or "",
            "arguments": _arguments(function.get("arguments")),
        },
    }


def _go_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message with every field Ollama's templates read, zero-valued when absent."""
    if not isinstance(message, Mapping):
        raise InputError("each message must be an object with 'role' and 'content'")
    calls = message.get("tool_calls") or []
    return {
        **message,
        "role": str(message.get("role") or ""),
        "content": _content(message),
        "thinking": message.get("thinking") or "",
        "images": message.get("images") or [],
        "tool_calls": [_tool_call(i, c) for i, c in enumerate(calls)],
        "tool_name": message.get("tool_name") or "",
        "tool_call_id": message.get("tool_call_id") or "",
    }


def _jinja_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as Hugging Face templates read it: tool-call arguments as objects (OpenAI
    clients send JSON strings), reasoning as ``reasoning_content``."""
    out = {**message, "content": _content(message)}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {"type": "function", **c, "function": _tool_call(i, c)["function"]}
            for i, c in enumerate(calls)
        ]
    if message.get("thinking") and "reasoning_content" not in out:
        out["reasoning_content"] = message["thinking"]
    return out


def _ordered(value: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Known keys first, in Ollama's struct order (what ``{{ json . }}`` prints), then the rest."""
    out = {k: value[k] for k in keys if k in value}
    out.update((k, v) for k, v in value.items() if k not in out)
    return out


def _go_tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
        raise InputError("each tool must be an object with a 'function' object")
    function = dict(tool["function"])
    parameters = function.get("parameters")
    if isinstance(parameters, Mapping):
        function["parameters"] = _ordered(parameters, _PARAMETERS_KEYS)
    return _ordered({**tool, "function": _ordered(function, _FUNCTION_KEYS)}, _TOOL_KEYS)


def _collate(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Merge consecutive same-role messages (not tool results); collect the system text."""
    system: list[str] = []
    merged: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "system":
            system.append(message["content"])
        last = merged[-1] if merged else None
        if last is not None and last["role"] == message["role"] and message["role"] != "tool":
            last["content"] += "\n\n" + message["content"]
            last["tool_calls"] = last["tool_calls"] + message["tool_calls"]
        else:
            merged.append(dict(message))
    return "\n\n".join(system), merged


def _think_vars(think: bool | str | None) -> dict[str, Any]:
    return {
        "Think": bool(think),
        # As Ollama: true is the level "medium" for a template that reads one
        "ThinkLevel": think if isinstance(think, str) else ("medium" if think else ""),
        "IsThinkSet": think is not None,
    }


def _render_legacy(
    template: GoTemplate, messages: list[dict[str, Any]], think: dict[str, Any]
) -> str:
    append_response = not template.references("Response")
    parts: list[str] = []
    turn = {"System": "", "Prompt": "", "Response": ""}

    def flush() -> None:
        parts.append(template.execute({**turn, **think}))
        if append_response:
            parts.append(turn["Response"])
        turn.update(System="", Prompt="", Response="")

    for message in messages:
        role = message["role"]
        if role == "system":
            if turn["Prompt"] or turn["Response"]:
                flush()
            turn["System"] = message["content"]
        elif role == "user":
            if turn["Response"]:
                flush()
            turn["Prompt"] = message["content"]
        elif role == "assistant":
            turn["Response"] = message["content"]
    parts.append(template.execute_until({**turn, **think}, "Response"))
    if append_response:
        parts.append(turn["Response"])
    return "".join(parts)


def _render_go(template: GoTemplate, inp: PromptInput, think: bool | str | None) -> str:
    think_vars = _think_vars(think)
    messages = [_go_message(m) for m in inp.messages]
    if inp.suffix:
        if not template.references("Suffix"):
            raise InputError("this model does not support insert: its TEMPLATE has no .Suffix")
        prompt = messages[-1]["content"] if messages else ""
        data = {"Prompt": prompt, "Suffix": inp.suffix, "Response": "", **think_vars}
        return template.execute(data)
    system, collated = _collate(messages)
    if template.references("Messages"):
        tools = [_go_tool(t) for t in inp.tools] if inp.tools else None
        data = {"System": system, "Messages": collated, "Tools": tools, "Response": ""}
        return template.execute({**data, **think_vars})
    return _render_legacy(template, collated, think_vars)


def render_prompt(
    inp: PromptInput,
    *,
    go_template: str | GoTemplate | None,
    jinja_template: str | None,
    bos_token: str = "",
    eos_token: str = "",
    think: bool | str | None = None,
    tokenizer_adds_bos: bool = True,
) -> str:
    """Render ``inp`` with the template that applies (see the module docstring)."""
    if isinstance(go_template, GoTemplate) or go_template or not jinja_template:
        template = _as_template(go_template or DEFAULT_TEMPLATE)
        text = _render_go(template, inp, think)
    else:
        if inp.suffix:
            raise InputError("this model does not support insert: it has no TEMPLATE with .Suffix")
        messages = [_jinja_message(m) for m in inp.messages]
        extra: dict[str, Any] = {} if think is None else {"enable_thinking": bool(think)}
        if isinstance(think, str):  # chat templates know low, medium and high
            extra["reasoning_effort"] = "high" if think == "max" else think
        last_role = messages[-1].get("role") if messages else None
        text = render_chat_template(
            jinja_template,
            messages,
            add_generation_prompt=last_role != "assistant",
            bos_token=bos_token,
            eos_token=eos_token,
            tools=inp.tools or None,
            extra=extra,
        )
    if tokenizer_adds_bos and bos_token and text.startswith(bos_token):
        text = text[len(bos_token) :]
    return text


def build_chat_prompt(
    *,
    go_template: str | GoTemplate | None,
    jinja_template: str | None,
    messages: list[dict[str, Any]],
    tools: list[Any] | None = None,
    bos_token: str = "",
    eos_token: str = "",
    think: bool | str | None = None,
    tokenizer_adds_bos: bool = True,
) -> str:
    """The prompt for /api/chat: ``messages`` are final (history, SYSTEM already applied)."""
    return render_prompt(
        PromptInput(messages=messages, system=None, tools=tools),
        go_template=go_template,
        jinja_template=jinja_template,
        bos_token=bos_token,
        eos_token=eos_token,
        think=think,
        tokenizer_adds_bos=tokenizer_adds_bos,
    )


def build_generate_prompt(
    *,
    go_template: str | GoTemplate | None,
    jinja_template: str | None,
    prompt: str,
    system: str | None,
    history: list[dict[str, Any]],
    suffix: str | None,
    bos_token: str = "",
    eos_token: str = "",
    think: bool | str | None = None,
    tokenizer_adds_bos: bool = True,
) -> str:
    """The prompt for /api/generate (not raw): [system] + MESSAGE history + the user prompt.

    ``system`` is the request's system or else the model's SYSTEM (empty means none); with a
    ``suffix`` the template renders fill-in-the-middle instead.
    """
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.extend(history)
    messages.append({"role": "user", "content": prompt})
    return render_prompt(
        PromptInput(messages=messages, system=system, suffix=suffix),
        go_template=go_template,
        jinja_template=jinja_template,
        bos_token=bos_token,
        eos_token=eos_token,
        think=think,
        tokenizer_adds_bos=tokenizer_adds_bos,
    )
