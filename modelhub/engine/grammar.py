"""Constrained output: JSON, JSON schema and raw GBNF grammars.

Schemas become GBNF through llama-cpp-python's converter (``LlamaGrammar``); the grammar itself
runs in llama.cpp's grammar sampler, which we use only as a mask over a token-data array and
advance with each emitted token. Drafting under a grammar checks drafts and verification rows
against clones advanced past the drafts before them (:meth:`GrammarConstraint.clone`); the
request's own constraint only ever sees the committed sequence.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import LlamaGrammar

from modelhub.engine.json_layout import PRETTY, Layout, relayout
from modelhub.engine.llama import LlamaModel, native_log_mark, native_messages_since
from modelhub.engine.sampling import FloatArray
from modelhub.errors import InputError

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


def json_grammar() -> str:
    """GBNF for any JSON object (Ollama's ``format: "json"``), laid out as schemas are."""
    return schema_grammar({"type": "object"})


def schema_grammar(schema: dict[str, Any] | str, layout: Layout = PRETTY) -> str:
    """GBNF for a JSON schema (Ollama's ``format: {...}``), with whitespace where ``layout``
    allows it (``engine.json_layout``: pretty-printed JSON's places by default)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        gbnf = LlamaGrammar.from_json_schema(text, verbose=False)._grammar
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


class GrammarConstraint:
    """A GBNF grammar as a token mask that advances with each accepted token."""

    def __init__(self, model: LlamaModel, gbnf: str, root: str = "root") -> None:
        mark = native_log_mark()
        handle = llama_cpp.llama_sampler_init_grammar(model.vocab, gbnf.encode(), root.encode())
        if not handle:
            detail = native_messages_since(mark) or "parse error"
            raise InputError(f"invalid grammar: {detail}")
        self._handle: Any = handle
        self._n_vocab = model.n_vocab
        self._data = np.zeros(model.n_vocab, dtype=_TOKEN_DATA)
        self._data["id"] = np.arange(model.n_vocab, dtype=np.int32)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def _apply(self, data: np.ndarray[Any, Any]) -> None:
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=len(data),
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(self._handle, ctypes.byref(array))

    def allows(self, token: int) -> bool:
        self._one["id"] = token
        self._one["logit"] = 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def mask(self, logits: FloatArray) -> None:
        self._data["logit"] = logits
        self._apply(self._data)
        logits[:] = self._data["logit"]

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._handle, token)

    def clone(self) -> GrammarConstraint:
        """An independent copy in the same state (to look ahead through drafted tokens)."""
        handle = llama_cpp.llama_sampler_clone(self._handle)
        if not handle:
            raise InputError("the grammar could not be copied for drafting")
        twin = object.__new__(GrammarConstraint)
        twin._handle = handle
        twin._n_vocab = self._n_vocab
        twin._data = self._data  # scratch space, filled before each use
        twin._one = np.zeros(1, dtype=_TOKEN_DATA)
        return twin

    def close(self) -> None:
        if getattr(self, "_handle", None):
            llama_cpp.llama_sampler_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
