"""JSON and JSON-schema grammars as GBNF text, without llama.cpp's native library.

The daemon builds these (Ollama's ``format``, forced tool calls) and sends the text to the
runner, where :mod:`modelhub.engine.grammar` runs it. Schemas become GBNF through
llama-cpp-python's converter (``llama_cpp/llama_grammar.py``, what ``LlamaGrammar.from_json_schema``
calls), a pure-Python module of the package that this loads by itself: importing it as
``llama_cpp.llama_grammar`` would import the package first, and with it the native library,
which the daemon process never loads (docs/architecture.md).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from modelhub.engine.json_layout import PRETTY, Layout, relayout
from modelhub.errors import InputError


@functools.cache
def _schema_converter() -> Callable[[str], str]:
    """llama-cpp-python's ``json_schema_to_gbnf``: the runner's already-imported module, or
    the module's file loaded alone."""
    module: Any = sys.modules.get("llama_cpp.llama_grammar")
    if module is None:
        package = importlib.util.find_spec("llama_cpp")  # finds it, does not import it
        folders = package.submodule_search_locations if package is not None else None
        if not folders:
            raise ModuleNotFoundError("llama-cpp-python is not installed")
        path = Path(next(iter(folders))) / "llama_grammar.py"
        spec = importlib.util.spec_from_file_location("modelhub.engine._llama_grammar", path)
        if spec is None or spec.loader is None:
            raise ModuleNotFoundError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return cast("Callable[[str], str]", module.json_schema_to_gbnf)


def json_grammar() -> str:
    """GBNF for any JSON object (Ollama's ``format: "json"``), laid out as schemas are."""
    return schema_grammar({"type": "object"})


def schema_grammar(schema: dict[str, Any] | str, layout: Layout = PRETTY) -> str:
    """GBNF for a JSON schema (Ollama's ``format: {...}``), with whitespace where ``layout``
    allows it (``engine.json_layout``: pretty-printed JSON's places by default)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        gbnf = _schema_converter()(text)
    except Exception as exc:  # the converter asserts on schemas it does not know (a user error)
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise InputError(
            f"format: the JSON schema cannot be turned into a grammar ({detail})"
        ) from exc
    # The converter allows one optional space after every token; models lay JSON out with
    # newlines and indentation, and drafts copy that layout from the prompt, so the layout
    # allows them where pretty-printed JSON has them, and nowhere else.
    return relayout(gbnf, layout)


def format_grammar(fmt: str | dict[str, Any] | None) -> str | None:
    """Map Ollama's ``format`` field to GBNF: "json", a schema object, or ""/None (none)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return json_grammar()
    if isinstance(fmt, dict):
        return schema_grammar(fmt)
    raise InputError(f'format must be "json" or a JSON schema object, not {fmt!r}')
