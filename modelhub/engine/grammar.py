"""Constrained output: a GBNF grammar (JSON and JSON schemas become one in
:mod:`modelhub.engine.gbnf`; raw GBNF comes as it is) run in llama.cpp's grammar sampler, which
we use only as a mask over a token-data array and advance with each emitted token. Drafting
under a grammar checks drafts and verification rows against clones advanced past the drafts
before them (:meth:`GrammarConstraint.clone`); the request's own constraint only ever sees the
committed sequence.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
import numpy as np

from modelhub.engine.llama import LlamaModel
from modelhub.engine.native import native_log_mark, native_messages_since
from modelhub.engine.sampling import FloatArray
from modelhub.errors import InputError

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


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
