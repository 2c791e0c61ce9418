"""GGUF chat templates (``tokenizer.chat_template``): sandboxed Jinja, rendered as HF does.

The environment matches Hugging Face's ``apply_chat_template``: ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block that renders its
body, ``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson`` that keeps non-ASCII and
does not sort or HTML-escape. It is Jinja's ``ImmutableSandboxedEnvironment``: no access to
private or internal attributes, no mutation of the lists and dicts a template receives.

A chat template comes from a model file, so it is not trusted to terminate quickly. Bounds:

- time: every loop iteration, attribute/item lookup, operator and call ticks a counter, and
  every 256 ticks the wall clock is compared with the deadline (every ``for`` loop's iterable is
  wrapped at compile time, so even a loop with an empty body is bounded);
- size: output is collected chunk by chunk and capped; ``*``, ``+`` and ``%`` on strings and
  lists, and every call and filter, have their results checked; integers larger than the cap
  (``center(10**9)``, ``"{:>999999999}"``) and huge ``**`` are refused before they run.

Errors become ``BadRequest("chat template error: ...")``. Compiled templates are cached by text.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from modelhub.errors import BadRequest

MAX_OUTPUT = 8 * 1024 * 1024  # characters
TIMEOUT_S = 3.0
_MAX_POWER_BITS = 1 << 16
_TICKS_PER_CLOCK_CHECK = 256
_WATCH_FILTER = "_modelhub_watch_loop"
_DIGITS = re.compile(r"\d+")
_TEMPLATE_FILENAME = "<chat_template>"


class TemplateLimitExceeded(Exception):
    """Raised inside rendering when a bound is hit; reported as a BadRequest."""


class TemplateRaised(Exception):
    """``raise_exception(msg)`` called by the template itself."""


@dataclass
class _Budget:
    deadline: float
    timeout_s: float
    max_output: int
    ticks: int = 0


_budget: ContextVar[_Budget | None] = ContextVar("modelhub_chat_template_budget", default=None)


def _tick() -> None:
    budget = _budget.get()
    if budget is None:
        return
    budget.ticks += 1
    if budget.ticks % _TICKS_PER_CLOCK_CHECK == 0 and time.monotonic() > budget.deadline:
        raise TemplateLimitExceeded(f"rendering took longer than {budget.timeout_s:g} s")


def _check_result(value: Any) -> Any:
    budget = _budget.get()
    if (
        budget is not None
        and isinstance(value, str | list | tuple)
        and len(value) > budget.max_output
    ):
        raise TemplateLimitExceeded(f"a value exceeds {budget.max_output} characters")
    return value


def _check_args(args: Iterable[Any]) -> None:
    budget = _budget.get()
    if budget is None:
        return
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > budget.max_output:
            raise TemplateLimitExceeded(f"argument {arg} exceeds the output limit")


def _check_format_string(text: Any) -> None:
    """Refuse format strings whose widths alone would exceed the output cap."""
    budget = _budget.get()
    if budget is None or not isinstance(text, str):
        return
    for digits in _DIGITS.findall(text):
        if len(digits) > 12 or int(digits) > budget.max_output:
            raise TemplateLimitExceeded(f"format width {digits[:20]} exceeds the output limit")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    budget = _budget.get()
    if budget is None:
        return
    if operator == "*":
        for seq, count in ((left, right), (right, left)):
            sized = isinstance(seq, str | list | tuple) and isinstance(count, int)
            if sized and len(seq) * count > budget.max_output:
                raise TemplateLimitExceeded(f"repetition exceeds {budget.max_output} items")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > _MAX_POWER_BITS:
            raise TemplateLimitExceeded("power is too large")
    elif operator == "%":
        _check_format_string(left)


def _watch_loop(iterable: Any) -> Iterator[Any]:
    """Wrapped around every ``for`` loop's iterable so each iteration ticks."""
    for item in iterable:
        _tick()
        yield item


def _bounded(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        _check_args(args)
        _check_args(kwargs.values())
        if name == "format" and args:
            _check_format_string(args[0])
        return _check_result(func(*args, **kwargs))

    return bounded


class _ChatSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with our bounds hooked into operators, lookups and calls."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _tick()
        _check_binop(operator, left, right)
        return _check_result(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        if attribute in ("format", "format_map"):
            _check_format_string(obj)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _tick()
        _check_args(args)
        _check_args(kwargs.values())
        return _check_result(super().call(context, obj, *args, **kwargs))


class _GenerationBlock(Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` marks assistant text; we render it as is."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's Extension declares it as a plain class set)

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: Any) -> None:
    raise TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    _check_format_string(fmt)
    return dt.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _make_environment() -> _ChatSandbox:
    env = _ChatSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[loopcontrols, _GenerationBlock],
        # No constant folding: it would run filters and operators at compile time, outside
        # the bounds (``'a'|center(10**9)`` would be built while compiling).
        optimized=False,
    )
    env.filters["tojson"] = _tojson
    for name, func in list(env.filters.items()):
        env.filters[name] = _bounded(func, name)
    env.filters[_WATCH_FILTER] = _watch_loop
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_environment()


@functools.lru_cache(maxsize=32)
def compile_chat_template(text: str) -> Any:
    """Compile (and cache) a chat template; raises BadRequest on syntax errors."""
    # Jinja still folds constant output (``{{ 'a'|center(10**9) }}``) while generating code; a
    # budget makes our checks refuse that, and Jinja then leaves it to run time.
    token = _budget.set(_Budget(time.monotonic() + TIMEOUT_S, TIMEOUT_S, MAX_OUTPUT))
    try:
        tree = _ENV.parse(text)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, _WATCH_FILTER, [], [], None, None)
        code = _ENV.compile(tree, filename=_TEMPLATE_FILENAME)
        return _ENV.template_class.from_code(_ENV, code, _ENV.make_globals(None), None)
    except TemplateSyntaxError as e:
        raise BadRequest(f"chat template error: {e.message} at line {e.lineno}") from None
    finally:
        _budget.reset(token)


def _template_line(tb: TracebackType | None) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEMPLATE_FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _render_error(e: BaseException) -> BadRequest:
    line = _template_line(e.__traceback__)
    where = f" at line {line}" if line is not None else ""
    if isinstance(e, TemplateRaised | TemplateLimitExceeded):
        what = str(e)
    elif isinstance(e, SecurityError):
        what = f"blocked by the sandbox: {e}"
    elif isinstance(e, RecursionError):
        what = "recursion too deep"
    else:
        what = f"{type(e).__name__}: {e}"
    return BadRequest(f"chat template error: {what}{where}")


def render_chat_template(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str,
    eos_token: str,
    tools: list[Any] | None = None,
    extra: dict[str, Any] | None = None,
    max_output: int = MAX_OUTPUT,
    timeout_s: float = TIMEOUT_S,
) -> str:
    """Render a GGUF chat template for ``messages`` with HF's variables, within the bounds."""
    compiled = compile_chat_template(template)
    context: dict[str, Any] = dict(extra or {})
    context.update(
        messages=messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
    )
    budget = _Budget(time.monotonic() + timeout_s, timeout_s, max_output)
    token = _budget.set(budget)
    chunks: list[str] = []
    size = 0
    try:
        for chunk in compiled.generate(context):
            size += len(chunk)
            if size > max_output:
                raise TemplateLimitExceeded(f"output exceeds {max_output} characters")
            chunks.append(chunk)
            _tick()
    except BadRequest:
        raise
    except Exception as e:  # anything a model-supplied template does wrong is a request error
        raise _render_error(e) from None
    finally:
        _budget.reset(token)
    return "".join(chunks)
