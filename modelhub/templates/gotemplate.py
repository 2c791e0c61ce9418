"""Go text/template, the subset Modelfile TEMPLATEs use.

Supported: text and ``{{ }}`` actions with ``{{-``/``-}}`` trimming, ``{{/* comments */}}``,
``if``/``else if``/``else``, ``range`` (lists, maps in key order, integers; ``$i, $v :=``;
``else``; ``break``/``continue``), ``with``/``else with``/``else``, variables (``$x :=``,
``$x =``, ``$``), field chains (``.A.B``, ``$x.A``, ``(index .Messages 0).Content``), pipelines,
string (with Go escapes), raw string, character, number, bool and nil literals, and the functions
``and or not eq ne lt le gt ge len index slice print printf println json`` plus Ollama's
``currentDate``, ``yesterdayDate`` and ``toTypeScriptType``. ``define``/``template``/``block``
are refused. How Python values behave as Go values is described in ``go_values``.

Errors, at parse or execution time, are ``InputError("template error: <what> at line L col C")``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

from modelhub.templates.go_ast import Action, Branch, Node, expr_names, node_names
from modelhub.templates.go_exec import Executor, Limits
from modelhub.templates.go_funcs import FUNCTION_NAMES
from modelhub.templates.go_lexer import Positions
from modelhub.templates.go_parser import parse

__all__ = ["GoTemplate", "Limits", "parse_template"]


class GoTemplate:
    """A parsed template; immutable and safe to execute from several threads at once."""

    def __init__(self, text: str, nodes: tuple[Node, ...], positions: Positions) -> None:
        self.text = text
        self._nodes = nodes
        self._positions = positions

    def __repr__(self) -> str:
        return f"GoTemplate({self.text[:40]!r}{'...' if len(self.text) > 40 else ''})"

    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(name.lower() for name in node_names(self._nodes))

    def references(self, field: str) -> bool:
        """Whether any action reads ``field`` (case-insensitive, as Ollama decides modes)."""
        return field.lower() in self._names

    def execute(self, data: Mapping[str, Any], limits: Limits | None = None) -> str:
        return self._run(self._nodes, data, limits)

    def execute_until(
        self, data: Mapping[str, Any], field: str, limits: Limits | None = None
    ) -> str:
        """Execute, dropping everything after the first action that reads ``field``.

        This is how Ollama renders the last turn of a legacy ``.Prompt``/``.Response`` template:
        the output stops where the model's answer goes. Conditions of ``if``/``with``/``range``
        do not start the cut; an action inside their bodies does (and the rest of the body,
        the else branch and all later nodes are dropped).
        """
        cut = _cut_after(self._nodes, field.lower(), [False])
        return self._run(cut, data, limits)

    def _run(self, nodes: tuple[Node, ...], data: Mapping[str, Any], limits: Limits | None) -> str:
        executor = Executor(self._positions, limits or Limits(), data)
        executor.run(nodes, data)
        return executor.result()


def _cut_after(nodes: tuple[Node, ...], field: str, cut: list[bool]) -> tuple[Node, ...]:
    kept: list[Node] = []
    for node in nodes:
        if cut[0]:
            break
        if isinstance(node, Action):
            kept.append(node)
            cut[0] = field in (name.lower() for name in expr_names(node.pipe))
        elif isinstance(node, Branch):
            body = _cut_after(node.body, field, cut)
            else_body = None if node.else_body is None else _cut_after(node.else_body, field, cut)
            kept.append(Branch(node.kind, node.pipe, body, else_body, node.offset))
        else:
            kept.append(node)
    return tuple(kept)


def parse_template(text: str) -> GoTemplate:
    """Parse a TEMPLATE; raises BadRequest("template error: ... at line L col C")."""
    nodes, positions = parse(text, FUNCTION_NAMES)
    return GoTemplate(text, nodes, positions)
