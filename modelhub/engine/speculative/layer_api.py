"""What the layer-fed drafters (EAGLE-3, DFlash) need from libllama beyond llama-cpp-python.

llama-cpp-python 0.3.36 binds the extended batch API (``llama_batch_ext_*``, ``llama_process``)
but not four functions its vendored libllama exports: switching on a target context's copy of
a layer's *input* hidden states (``llama_set_embeddings_layer_inp``), reading it
(``llama_get_embeddings_layer_inp``), and a drafter's list of target layers
(``llama_model_target_layer_ids(_n)``). They are found here by symbol, under their C name or
their C++-mangled one (the header declares them without ``extern "C"``), and a build without
them gets a DraftError, never a crash.

:class:`ExtBatch` wraps ``llama_batch_ext`` for one sequence: rows of (token, paired hidden
row) and embedding-only rows, which the legacy ``llama_batch`` cannot mix with encoder input.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from modelhub.errors import DraftError

_FLOATS = ctypes.POINTER(ctypes.c_float)
_REMEDY = "use DRAFT ngram or a draft model instead"

# name -> (symbols to try, argtypes, restype)
_FUNCTIONS: dict[str, tuple[tuple[str, ...], list[Any], Any]] = {
    "set_layer_inp": (
        ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"),
        [llama_cpp.llama_context_p_ctypes, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    "get_layer_inp": (
        ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj"),
        [llama_cpp.llama_context_p_ctypes, ctypes.c_uint32],
        _FLOATS,
    ),
    "target_ids": (
        ("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model"),
        [llama_cpp.llama_model_p_ctypes],
        ctypes.POINTER(ctypes.c_int32),
    ),
    "target_ids_n": (
        ("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model"),
        [llama_cpp.llama_model_p_ctypes],
        ctypes.c_uint32,
    ),
}
# Bound by llama-cpp-python already; a build without them cannot drive these drafters either.
_BOUND = (
    "llama_batch_ext_init",
    "llama_batch_ext_add_token",
    "llama_batch_ext_add_embd",
    "llama_batch_ext_set_embd_token",
    "llama_batch_ext_set_pos",
    "llama_batch_ext_set_output_logits",
    "llama_process",
    "LLAMA_PROCESS_TYPE_ENCODE",
    "llama_vocab_mask",
    "llama_set_causal_attn",
)


@dataclass(frozen=True)
class LayerApi:
    """The bound functions (ctypes callables)."""

    set_layer_inp: Any
    get_layer_inp: Any
    target_ids: Any
    target_ids_n: Any

    def target_layer_ids(self, model: Any) -> list[int]:
        """The target layers a drafter model reads (``{arch}.target_layers``)."""
        n = int(self.target_ids_n(model))
        ptr = self.target_ids(model)
        return [int(ptr[i]) for i in range(n)] if n and ptr else []

    def layer_rows(
        self, ctx: Any, lid: int, first: int, n: int, width: int
    ) -> npt.NDArray[np.float32]:
        """Rows ``first..first+n-1`` of layer ``lid``'s input in the last decode (a copy:
        the buffer is overwritten by the next one). Every batch row has one, in batch order."""
        ptr = self.get_layer_inp(ctx, lid)
        if not ptr:
            raise DraftError(f"the target produced no input rows for layer {lid}")
        rows = np.ctypeslib.as_array(ptr, shape=(first + n, width))
        out: npt.NDArray[np.float32] = rows[first:].copy()
        return out


@functools.cache
def layer_api() -> LayerApi:
    """The bindings, or a DraftError naming what this libllama lacks."""
    missing = [name for name in _BOUND if not hasattr(llama_cpp, name)]
    lib = getattr(llama_cpp.llama_cpp, "_lib", None)
    found: dict[str, Any] = {}
    for key, (symbols, argtypes, restype) in _FUNCTIONS.items():
        fn = next((f for s in symbols if (f := getattr(lib, s, None)) is not None), None)
        if fn is None:
            missing.append(symbols[0])
            continue
        fn.argtypes, fn.restype = argtypes, restype
        found[key] = fn
    if missing:
        raise DraftError(
            "this llama-cpp-python build lacks " + ", ".join(missing) + ": EAGLE-3 and DFlash "
            f"drafting need them (llama-cpp-python 0.3.36 with its vendored llama.cpp); {_REMEDY}"
        )
    return LayerApi(**found)


class ExtBatch:
    """A reusable ``llama_batch_ext`` of one sequence for a context (at most n_batch rows).
    llama.cpp copies the rows in, so the arrays need not outlive the calls."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.handle: Any = llama_cpp.llama_batch_ext_init(ctx)
        if not self.handle:
            raise DraftError("llama.cpp could not create an extended batch")
        self.n = 0
        self._pos = (llama_cpp.llama_pos * 1)()

    def clear(self) -> None:
        llama_cpp.llama_batch_ext_clear(self.handle)
        self.n = 0

    @staticmethod
    def _embd(row: npt.NDArray[np.float32]) -> Any:
        """A view of ``row`` (contiguous float32, kept alive by the caller during the call)."""
        return llama_cpp.llama_embd(row.ctypes.data_as(_FLOATS), 1, row.shape[0])

    def _finish(self, idx: int, pos: int, logits: bool) -> None:
        if idx < 0:
            raise DraftError(f"could not add a row to the draft batch (code {idx})")
        self._pos[0] = pos
        llama_cpp.llama_batch_ext_set_pos(self.handle, idx, self._pos)
        if logits:
            llama_cpp.llama_batch_ext_set_output_logits(self.handle, idx, True)
        self.n += 1

    def token(
        self, token: int, pos: int, logits: bool = False, h: npt.NDArray[np.float32] | None = None
    ) -> None:
        """A token row; ``h`` is its paired hidden row (EAGLE-3's g)."""
        idx = llama_cpp.llama_batch_ext_add_token(self.handle, 0, token)
        if h is not None and idx >= 0:
            arr = np.ascontiguousarray(h, dtype=np.float32)  # referenced while llama.cpp copies
            if not llama_cpp.llama_batch_ext_set_embd_token(self.handle, idx, self._embd(arr)):
                raise DraftError(f"the draft batch refused a hidden row of width {len(arr)}")
        self._finish(idx, pos, logits)

    def embd(self, row: npt.NDArray[np.float32], pos: int, logits: bool = False) -> None:
        """An embedding-only row (EAGLE-3 encoder input, DFlash feature injection)."""
        arr = np.ascontiguousarray(row, dtype=np.float32)
        idx = llama_cpp.llama_batch_ext_add_embd(self.handle, 0, self._embd(arr))
        self._finish(idx, pos, logits)

    def run(self, encode: bool = False) -> None:
        """Process the rows (then clear them); DraftError on failure."""
        kind = (
            llama_cpp.LLAMA_PROCESS_TYPE_ENCODE if encode else llama_cpp.LLAMA_PROCESS_TYPE_DECODE
        )
        try:
            rc = llama_cpp.llama_process(self.ctx, kind, self.handle)
        finally:
            self.clear()
        if rc != 0:
            raise DraftError(f"the drafter's {'encode' if encode else 'decode'} failed (code {rc})")

    def close(self) -> None:
        if self.handle:
            llama_cpp.llama_batch_ext_free(self.handle)
            self.handle = None


def logits_row(ctx: Any, i: int, n_model: int, n_target: int) -> npt.NDArray[np.float32]:
    """Batch row ``i``'s logits, cut or padded (-inf) to the target's vocabulary: the engine
    only ever accepts ids the target has."""
    ptr = llama_cpp.llama_get_logits_ith(ctx, i)
    if not ptr:
        raise DraftError(f"the drafter produced no logits for row {i}")
    row = np.ctypeslib.as_array(ptr, shape=(n_model,))
    if n_model >= n_target:
        out: npt.NDArray[np.float32] = row[:n_target].copy()
        return out
    return np.concatenate([row, np.full(n_target - n_model, -np.inf, np.float32)])


def features(
    api: LayerApi, ctx: Any, ids: Sequence[int], first: int, n: int, width: int
) -> npt.NDArray[np.float32]:
    """Per batch row, the concatenated inputs of the target layers ``ids`` (in that order)."""
    return np.concatenate([api.layer_rows(ctx, lid, first, n, width) for lid in ids], axis=1)
