"""Time and size bounds for rendering an untrusted Jinja chat template.

A render runs with a ``Budget`` set in a context variable. The sandbox calls ``tick`` on every
loop iteration, lookup, operator and call, and every 256 ticks the clock is compared with the
deadline. Anything that could build a large value is checked *before* it runs, from the sizes of
its inputs (an upper bound, not an exact count), so a hostile template fails fast instead of
exhausting memory: repetition, concatenation, ``%``/``format`` (widths and arguments), ``**``,
the string methods and filters that multiply their input (``replace``, ``join``, ``indent``,
``center``...), and printing a container. Results are checked again afterwards.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2.nodes import EvalContext
from jinja2.runtime import Context

_TICKS_PER_CLOCK_CHECK = 256
_MAX_POWER_BITS = 1 << 16
_DIGITS = re.compile(r"\d+")
# Filters that turn their input into text, with how much longer than the input it can get.
# Other filters select, count or reorder what already exists and are not checked up front.
_TEXT_FILTERS = {
    "string": 1,
    "format": 1,
    "center": 1,
    "wordwrap": 2,
    "escape": 6,
    "e": 6,
    "forceescape": 6,
    "xmlattr": 6,
    "urlencode": 3,
}


class TemplateLimitExceeded(Exception):
    """A bound was hit while rendering; reported to the user as a BadRequest."""


@dataclass
class Budget:
    deadline: float
    timeout_s: float
    max_output: int
    ticks: int = 0


current: ContextVar[Budget | None] = ContextVar("modelhub_chat_template_budget", default=None)


def start(timeout_s: float, max_output: int) -> Budget:
    return Budget(time.monotonic() + timeout_s, timeout_s, max_output)


def tick() -> None:
    budget = current.get()
    if budget is None:
        return
    budget.ticks += 1
    if budget.ticks % _TICKS_PER_CLOCK_CHECK == 0 and time.monotonic() > budget.deadline:
        raise TemplateLimitExceeded(f"rendering took longer than {budget.timeout_s:g} s")


def _cap() -> int | None:
    budget = current.get()
    return None if budget is None else budget.max_output


def approx_len(value: Any, limit: int, depth: int = 0) -> int:
    """An upper-ish estimate of ``len(str(value))``, computed without building the string.

    Stops counting once ``limit`` is passed (the answer is then just "too big").
    """
    if isinstance(value, str | bytes):
        return len(value)
    if value is None or isinstance(value, bool | int | float):
        return 24
    if depth > 64:
        return limit + 1
    if isinstance(value, Mapping):
        items: Iterable[Any] = (x for kv in value.items() for x in kv)
    elif isinstance(value, list | tuple | set | frozenset):
        items = value
    else:
        return 64  # objects print as a short repr (Undefined prints as "")
    total = 2
    for item in items:
        total += approx_len(item, limit - total, depth + 1) + 4
        if total > limit:
            break
    return total


def check_size(size: int, what: str) -> None:
    cap = _cap()
    if cap is not None and size > cap:
        raise TemplateLimitExceeded(f"{what} exceeds {cap} characters")


def check_value(value: Any, what: str = "a value") -> Any:
    cap = _cap()
    if cap is not None:
        check_size(approx_len(value, cap), what)
    return value


def check_ints(args: Iterable[Any]) -> None:
    cap = _cap()
    if cap is None:
        return
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > cap:
            raise TemplateLimitExceeded(f"argument {arg} exceeds the output limit")


def check_format(fmt: Any, args: Iterable[Any]) -> None:
    """``fmt % args`` or ``fmt.format(*args)``: no huge widths, no huge total."""
    cap = _cap()
    if cap is None or not isinstance(fmt, str):
        return
    for digits in _DIGITS.findall(fmt):
        if len(digits) > 12 or int(digits) > cap:
            raise TemplateLimitExceeded(f"format width {digits[:20]} exceeds the output limit")
    widest = max((approx_len(a, cap) for a in args), default=0)
    slots = fmt.count("%") + fmt.count("{")
    check_size(len(fmt) + slots * widest, "formatted text")


def _format_args(value: Any) -> list[Any]:
    if isinstance(value, tuple | list):
        return list(value)
    if isinstance(value, Mapping):
        return list(value.values())
    return [value]


def check_binop(operator: str, left: Any, right: Any) -> None:
    cap = _cap()
    if cap is None:
        return
    # Lists are counted in items, strings in characters: building a list of many references
    # is cheap, printing it is checked when it is printed or joined.
    if operator == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(count, int):
                check_size(len(seq) * max(count, 0), "repetition")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > _MAX_POWER_BITS:
            raise TemplateLimitExceeded("power is too large")
    elif operator == "%":
        check_format(left, _format_args(right))
    elif operator == "+" and isinstance(left, str | list | tuple) and hasattr(right, "__len__"):
        check_size(len(left) + len(right), "concatenation")


def concat(parts: list[Any]) -> str:
    """Jinja's ``~``: rewritten to call this so that it is bounded like ``+``."""
    cap = _cap()
    if cap is not None:
        check_size(sum(approx_len(p, cap) for p in parts), "concatenation")
    return "".join(map(str, parts))


def _str_method_bound(text: str, name: str, args: tuple[Any, ...], cap: int) -> int | None:
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        new = approx_len(args[1], cap)
        hits = text.count(args[0]) if args[0] else len(text) + 1
        return len(text) + hits * new
    if name == "join" and args and isinstance(args[0], list | tuple):
        return approx_len(args[0], cap) + len(text) * len(args[0])
    if name == "expandtabs" and args and isinstance(args[0], int):
        return len(text) + text.count("\t") * abs(args[0])
    return None


def check_call(obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    cap = _cap()
    if cap is None:
        return
    check_ints(args)
    check_ints(kwargs.values())
    owner = getattr(obj, "__self__", None)
    if isinstance(owner, str):
        bound = _str_method_bound(owner, getattr(obj, "__name__", ""), args, cap)
        if bound is not None:
            check_size(bound, "the result")


def _filter_bound(
    name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], cap: int
) -> int | None:
    if name not in _TEXT_FILTERS and name not in ("join", "replace", "indent", "tojson", "pprint"):
        return None
    values = [a for a in args if not isinstance(a, EvalContext | Context)]
    first = values[0] if values else None
    size = sum(approx_len(v, cap) for v in values) + sum(
        approx_len(v, cap) for v in kwargs.values()
    )
    if name == "join" and isinstance(first, list | tuple):
        sep = kwargs.get("d", values[1] if len(values) > 1 else "")
        return size + approx_len(sep, cap) * len(first)
    if name == "replace" and len(values) >= 3 and isinstance(first, str):
        old, new = values[1], values[2]
        hits = first.count(old) if isinstance(old, str) and old else len(first) + 1
        return len(first) + hits * approx_len(new, cap)
    if name == "indent" and isinstance(first, str):
        width = kwargs.get("width", values[1] if len(values) > 1 else 4)
        per_line = abs(width) if isinstance(width, int) else approx_len(width, cap)
        return len(first) + (first.count("\n") + 1) * per_line
    if name in ("tojson", "pprint"):
        indent = kwargs.get("indent", values[1] if name == "tojson" and len(values) > 1 else 0)
        return size * (1 + (indent if isinstance(indent, int) else approx_len(indent, cap)))
    return size * _TEXT_FILTERS.get(name, 1)


def bounded_filter(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Wrap a Jinja filter: tick, refuse oversized work up front, check the result."""

    def bounded(*args: Any, **kwargs: Any) -> Any:
        tick()
        cap = _cap()
        if cap is not None:
            check_ints(args)
            check_ints(kwargs.values())
            if name == "format" and args:
                check_format(args[0], list(args[1:]) + list(kwargs.values()))
            bound = _filter_bound(name, args, kwargs, cap)
            if bound is not None:
                check_size(bound, f"the {name} filter's result")
        result = func(*args, **kwargs)
        if isinstance(result, str):
            check_size(len(result), f"the {name} filter's result")
        return result

    # Jinja reads how to call a filter (pass_context, pass_eval_context...) from attributes.
    bounded.__dict__.update(getattr(func, "__dict__", {}))
    bounded.__name__ = getattr(func, "__name__", name)
    bounded.__doc__ = func.__doc__
    return bounded


def watch_loop(iterable: Any) -> Any:
    """Wrapped around every ``for`` loop's iterable so that each iteration ticks."""
    for item in iterable:
        tick()
        yield item


def finalize(value: Any) -> Any:
    """Every ``{{ value }}`` passes here before ``str()``: refuse printing a huge container."""
    tick()
    if not isinstance(value, str):
        check_value(value, "a printed value")
    return value
