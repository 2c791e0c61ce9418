"""GGUF chat templates (``tokenizer.chat_template``): sandboxed Jinja, rendered as HF does.

The environment matches Hugging Face's ``apply_chat_template``: ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block that renders its
body, ``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson`` that keeps non-ASCII and
does not sort or HTML-escape. It is Jinja's ``ImmutableSandboxedEnvironment``: no access to
private or internal attributes, no mutation of the lists and dicts a template receives.

A chat template comes from a model file, so it is not trusted to terminate quickly or to stay
small: every render runs within a time and size budget (see ``jinja_bounds``). Two rewrites of the
parsed template make that possible: each ``for`` loop's iterable is wrapped so every iteration
ticks the clock (even a loop with an empty body is bounded), and ``~`` becomes a size-checked
concatenation. Operators, lookups and calls go through sandbox hooks that tick and check sizes,
filters are wrapped likewise, and ``finalize`` checks every printed value.

Errors become ``InputError("chat template error: ...")``. Compiled templates are cached by text.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from modelhub.errors import InputError
from modelhub.templates import jinja_bounds as bounds

MAX_OUTPUT = 8 * 1024 * 1024  # characters
TIMEOUT_S = 3.0
_WATCH_FILTER = "_modelhub_watch_loop"
_CONCAT_FILTER = "_modelhub_concat"
_TEMPLATE_FILENAME = "<chat_template>"


class TemplateRaised(Exception):
    """``raise_exception(msg)`` called by the template itself."""


class _ChatSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with our bounds hooked into operators, lookups and calls."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        bounds.tick()
        bounds.check_binop(operator, left, right)
        result = super().call_binop(context, operator, left, right)
        return bounds.check_value(result) if isinstance(result, str) else result

    def getattr(self, obj: Any, attribute: str) -> Any:
        bounds.tick()
        value = super().getattr(obj, attribute)
        if attribute in ("format", "format_map") and isinstance(obj, str) and callable(value):
            return _bounded_format(obj, value)
        return value

    def getitem(self, obj: Any, argument: Any) -> Any:
        bounds.tick()
        return super().getitem(obj, argument)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        bounds.tick()
        bounds.check_call(obj, args, kwargs)
        result = super().call(context, obj, *args, **kwargs)
        return bounds.check_value(result) if isinstance(result, str) else result


def _bounded_format(fmt: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def bounded_format(*args: Any, **kwargs: Any) -> Any:
        values = [*args, *kwargs.values()]
        if args and isinstance(args[0], Mapping):  # format_map
            values += list(args[0].values())
        bounds.check_format(fmt, values)
        return method(*args, **kwargs)

    return bounded_format


class _Bounder(NodeTransformer):
    """Rewrites a parsed template so loops tick and ``~`` is size-checked."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _WATCH_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        items = nodes.List(node.nodes, lineno=node.lineno)
        return nodes.Filter(items, _CONCAT_FILTER, [], [], None, None, lineno=node.lineno)


class _GenerationBlock(Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` marks assistant text; we render it as is."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's Extension declares it as a plain class set)

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: Any) -> None:
    raise TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    bounds.check_format(fmt, [])
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
        finalize=bounds.finalize,
        # No constant folding: it would run filters and operators at compile time.
        optimized=False,
    )
    env.filters["tojson"] = _tojson
    for name, func in list(env.filters.items()):
        env.filters[name] = bounds.bounded_filter(func, name)
    env.filters[_WATCH_FILTER] = bounds.watch_loop
    env.filters[_CONCAT_FILTER] = bounds.concat
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_environment()


@functools.lru_cache(maxsize=32)
def compile_chat_template(text: str) -> Any:
    """Compile (and cache) a chat template; raises BadRequest on syntax errors."""
    # Jinja still folds constant output (``{{ 'a'|center(10**9) }}``) while generating code; a
    # budget makes our checks refuse that, and Jinja then leaves it to run time.
    token = bounds.current.set(bounds.start(TIMEOUT_S, MAX_OUTPUT))
    try:
        tree = _Bounder().visit(_ENV.parse(text))
        code = _ENV.compile(tree, filename=_TEMPLATE_FILENAME)
        return _ENV.template_class.from_code(_ENV, code, _ENV.make_globals(None), None)
    except TemplateSyntaxError as e:
        raise InputError(f"chat template error: {e.message} at line {e.lineno}") from None
    finally:
        bounds.current.reset(token)


def _template_line(tb: TracebackType | None) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEMPLATE_FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _render_error(e: BaseException) -> InputError:
    line = _template_line(e.__traceback__)
    where = f" at line {line}" if line is not None else ""
    if isinstance(e, TemplateRaised | bounds.TemplateLimitExceeded):
        what = str(e)
    elif isinstance(e, SecurityError):
        what = f"blocked by the sandbox: {e}"
    elif isinstance(e, RecursionError):
        what = "recursion too deep"
    else:
        what = f"{type(e).__name__}: {e}"
    return InputError(f"chat template error: {what}{where}")


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
    token = bounds.current.set(bounds.start(timeout_s, max_output))
    chunks: list[str] = []
    size = 0
    try:
        for chunk in compiled.generate(context):
            size += len(chunk)
            if size > max_output:
                raise bounds.TemplateLimitExceeded(f"output exceeds {max_output} characters")
            chunks.append(chunk)
            bounds.tick()
    except InputError:
        raise
    except Exception as e:  # anything a model-supplied template does wrong is a request error
        raise _render_error(e) from None
    finally:
        bounds.current.reset(token)
    return "".join(chunks)
