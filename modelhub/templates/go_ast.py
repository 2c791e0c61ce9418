"""Syntax tree of a parsed Go template (the subset modelhub supports).

Every node keeps the character offset it came from so execution errors can say where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Dot:
    """``.``: the current data."""

    offset: int


@dataclass(frozen=True, slots=True)
class Literal:
    """A string, number, bool or nil constant."""

    value: Any
    offset: int


@dataclass(frozen=True, slots=True)
class Field:
    """``.A.B``: fields looked up on the current data."""

    names: tuple[str, ...]
    offset: int


@dataclass(frozen=True, slots=True)
class Variable:
    """``$x`` or ``$x.A.B`` (``$`` alone is the data the template was executed with)."""

    name: str
    names: tuple[str, ...]
    offset: int


@dataclass(frozen=True, slots=True)
class Function:
    """A function name in operand position (called when it starts a command)."""

    name: str
    offset: int


@dataclass(frozen=True, slots=True)
class Chain:
    """``(pipeline).A.B``: fields looked up on a parenthesised result."""

    base: Pipeline
    names: tuple[str, ...]
    offset: int


@dataclass(frozen=True, slots=True)
class Command:
    args: tuple[Expr, ...]
    offset: int


@dataclass(frozen=True, slots=True)
class Pipeline:
    """``$a, $b := cmd | cmd``; ``assign`` is True for ``=`` (re-assignment)."""

    decl: tuple[str, ...]
    assign: bool
    cmds: tuple[Command, ...]
    offset: int


Expr = Dot | Literal | Field | Variable | Function | Chain | Pipeline


@dataclass(frozen=True, slots=True)
class Text:
    text: str
    offset: int


@dataclass(frozen=True, slots=True)
class Action:
    """``{{ pipeline }}``: prints the result unless the pipeline declares variables."""

    pipe: Pipeline
    offset: int


@dataclass(frozen=True, slots=True)
class Branch:
    """``if`` / ``with`` / ``range`` with its body and optional ``else`` body.

    ``{{else if}}`` and ``{{else with}}`` are a nested Branch as the whole else body, as in Go.
    """

    kind: str  # "if" | "with" | "range"
    pipe: Pipeline
    body: tuple[Node, ...]
    else_body: tuple[Node, ...] | None
    offset: int


@dataclass(frozen=True, slots=True)
class LoopControl:
    """``{{break}}`` or ``{{continue}}`` inside a range."""

    kind: str
    offset: int


Node = Text | Action | Branch | LoopControl


def expr_names(expr: Expr) -> list[str]:
    """Field names an expression reads, at any depth (for ``GoTemplate.references``)."""
    match expr:
        case Field(names=names) | Variable(names=names):
            return list(names)
        case Chain(base=base, names=names):
            return list(names) + expr_names(base)
        case Pipeline(cmds=cmds):
            return [name for cmd in cmds for arg in cmd.args for name in expr_names(arg)]
    return []


def node_names(nodes: tuple[Node, ...]) -> list[str]:
    out: list[str] = []
    for node in nodes:
        match node:
            case Action(pipe=pipe):
                out += expr_names(pipe)
            case Branch(pipe=pipe, body=body, else_body=else_body):
                out += expr_names(pipe) + node_names(body) + node_names(else_body or ())
    return out
