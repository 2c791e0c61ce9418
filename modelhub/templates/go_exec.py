"""Executes a parsed Go template against Python data, within step, size and time limits.

The limits make a hostile TEMPLATE harmless to the daemon: every node, loop iteration and
function call is a step, every write and every string a function returns counts against the
output cap, and the wall clock is checked every 1024 steps.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from modelhub.templates.go_ast import (
    Action,
    Branch,
    Chain,
    Dot,
    Expr,
    Field,
    Function,
    Literal,
    LoopControl,
    Node,
    Pipeline,
    Text,
    Variable,
)
from modelhub.templates.go_funcs import FUNCTIONS
from modelhub.templates.go_lexer import Positions, template_error
from modelhub.templates.go_values import (
    TemplateValueError,
    field,
    is_list,
    to_text,
    truth,
    type_name,
)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one execution. The defaults leave real templates orders of magnitude of room."""

    max_steps: int = 1_000_000
    max_output: int = 8 * 1024 * 1024  # characters
    timeout_s: float = 3.0


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


_NO_FINAL = object()  # "no value piped in", distinct from a piped nil


class Executor:
    def __init__(self, positions: Positions, limits: Limits, data: Any) -> None:
        self.positions = positions
        self.limits = limits
        self.out: list[str] = []
        self.size = 0
        self.steps = 0
        self.deadline = time.monotonic() + limits.timeout_s
        self.vars: list[list[Any]] = [["$", data]]

    def fail(self, offset: int, what: str) -> NoReturn:
        template_error(self.positions, offset, what)

    def step(self, offset: int) -> None:
        self.steps += 1
        if self.steps > self.limits.max_steps:
            self.fail(offset, f"execution stopped after {self.limits.max_steps} steps")
        if self.steps & 1023 == 0 and time.monotonic() > self.deadline:
            self.fail(offset, f"execution took longer than {self.limits.timeout_s:g} s")

    def write(self, text: str, offset: int) -> None:
        self.size += len(text)
        if self.size > self.limits.max_output:
            self.fail(offset, f"output exceeds {self.limits.max_output} characters")
        self.out.append(text)

    def result(self) -> str:
        return "".join(self.out)

    # -- nodes ----------------------------------------------------------------------------

    def run(self, nodes: tuple[Node, ...], dot: Any) -> None:
        for node in nodes:
            self.step(node.offset)
            if isinstance(node, Text):
                self.write(node.text, node.offset)
            elif isinstance(node, Action):
                value = self.pipeline(node.pipe, dot)
                if not node.pipe.decl:
                    self.write(to_text(value), node.offset)
            elif isinstance(node, Branch):
                self.branch(node, dot)
            elif isinstance(node, LoopControl):
                raise _Break() if node.kind == "break" else _Continue()

    def branch(self, node: Branch, dot: Any) -> None:
        mark = len(self.vars)
        try:
            if node.kind == "range":
                self.range_(node, dot)
                return
            value = self.pipeline(node.pipe, dot)
            if truth(value):
                self.run(node.body, value if node.kind == "with" else dot)
            elif node.else_body is not None:
                self.run(node.else_body, dot)
        finally:
            del self.vars[mark:]

    def range_(self, node: Branch, dot: Any) -> None:
        pipe = node.pipe
        value = self.pipeline(pipe, dot, declare=False)
        if len(pipe.decl) == 2 and isinstance(value, int) and not isinstance(value, bool):
            self.fail(pipe.offset, "can't use two variables when ranging over an integer")
        mark = len(self.vars)
        ran = False
        for key, elem in self.items(value, pipe.offset):
            self.step(node.offset)
            ran = True
            if pipe.decl:
                self.bind(pipe.decl[-1], elem, pipe.assign)
            if len(pipe.decl) == 2:
                self.bind(pipe.decl[0], key, pipe.assign)
            try:
                self.run(node.body, elem)
            except _Continue:
                pass
            except _Break:
                break
            finally:
                del self.vars[mark:]
        if not ran and node.else_body is not None:
            self.run(node.else_body, dot)

    def items(self, value: Any, offset: int) -> Iterator[tuple[Any, Any]]:
        if value is None:
            return iter(())
        if isinstance(value, Mapping):
            keys = list(value)
            with contextlib.suppress(TypeError):  # mixed key types keep their order
                keys.sort()  # Go ranges over maps in key order
            return ((k, value[k]) for k in keys)
        if is_list(value):
            return enumerate(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return ((i, i) for i in range(max(value, 0)))
        self.fail(offset, f"range can't iterate over {type_name(value)}")

    # -- pipelines and operands -----------------------------------------------------------

    def bind(self, name: str, value: Any, assign: bool) -> None:
        if not assign:
            self.vars.append([name, value])
            return
        for slot in reversed(self.vars):
            if slot[0] == name:
                slot[1] = value
                return

    def variable(self, name: str) -> Any:
        for slot in reversed(self.vars):
            if slot[0] == name:
                return slot[1]
        return None  # the parser has checked the name is declared

    def pipeline(self, pipe: Pipeline, dot: Any, declare: bool = True) -> Any:
        value: Any = _NO_FINAL
        for cmd in pipe.cmds:
            self.step(cmd.offset)
            first = cmd.args[0]
            if isinstance(first, Function):
                value = self.call(first, cmd.args[1:], dot, value)
            else:
                value = self.operand(first, dot)
        if declare and pipe.decl:
            self.bind(pipe.decl[0], value, pipe.assign)
        return value

    def call(self, fn: Function, args: tuple[Expr, ...], dot: Any, final: Any) -> Any:
        func, lowest, highest = FUNCTIONS[fn.name]
        count = len(args) + (final is not _NO_FINAL)
        if count < lowest or (highest is not None and count > highest):
            want = f"{lowest}" if highest == lowest else f"at least {lowest}"
            if highest is not None and highest != lowest:
                want = f"{lowest} to {highest}"
            self.fail(fn.offset, f"wrong number of args for {fn.name}: want {want} got {count}")
        if fn.name in ("and", "or"):
            return self.and_or(fn.name == "and", args, dot, final)
        values = [self.operand(arg, dot) for arg in args]
        if final is not _NO_FINAL:
            values.append(final)
        try:
            result = func(*values)
        except TemplateValueError as e:
            self.fail(fn.offset, f"error calling {fn.name}: {e}")
        if isinstance(result, str) and len(result) > self.limits.max_output:
            self.fail(fn.offset, f"{fn.name} result exceeds {self.limits.max_output} characters")
        return result

    def and_or(self, is_and: bool, args: tuple[Expr, ...], dot: Any, final: Any) -> Any:
        value: Any = None
        for arg in args:
            value = self.operand(arg, dot)
            if truth(value) != is_and:
                return value
        return final if final is not _NO_FINAL else value

    def operand(self, expr: Expr, dot: Any) -> Any:
        if isinstance(expr, Dot):
            return dot
        if isinstance(expr, Literal):
            return expr.value
        if isinstance(expr, Field):
            return self.fields(dot, expr.names, expr.offset)
        if isinstance(expr, Variable):
            return self.fields(self.variable(expr.name), expr.names, expr.offset)
        if isinstance(expr, Function):
            return self.call(expr, (), dot, _NO_FINAL)
        if isinstance(expr, Chain):
            return self.fields(self.pipeline(expr.base, dot), expr.names, expr.offset)
        return self.pipeline(expr, dot)

    def fields(self, value: Any, names: tuple[str, ...], offset: int) -> Any:
        try:
            for name in names:
                value = field(value, name)
        except TemplateValueError as e:
            self.fail(offset, str(e))
        return value
