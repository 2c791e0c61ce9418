"""One inference context over a loaded model (``llama.LlamaModel``): its KV cache, batched
decoding at given positions with logits on chosen rows, logits as zero-copy numpy views, and
cutting, shifting, saving and restoring sequences. One-to-one llama.cpp calls, as ``llama``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Literal

import llama_cpp
import numpy as np
import numpy.typing as npt

from modelhub.engine.llama import KV_TYPES, LlamaAdapter, LlamaModel
from modelhub.engine.native import native_log_mark, native_messages_since
from modelhub.errors import ModelhubError

LogitsMode = Literal["none", "last", "all"]


class LlamaContext:
    """One inference context (its own KV cache) over a loaded model.

    ``n_seq`` sequences (0..n_seq-1) each get ``n_ctx`` positions in a KV stream of their own
    (llama.cpp's non-unified cache): a sequence's cells then sit in position order whatever
    the others do (after a :meth:`shift`, in the order the freed cells are refilled, the same
    for every batch shape), so its logits are those it would get alone (bit for bit where the
    kernels are row-independent, see the module docstring). :meth:`decode` serves sequence 0;
    :meth:`decode_rows` evaluates rows of several sequences in one ``llama_decode``.
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        flash_attn: bool = True,
        embeddings: bool = False,
        pooling: int | None = None,
        ctx_type: int = llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT,
        ctx_other: LlamaContext | None = None,
        n_outputs_max: int = 0,
        n_seq: int = 1,
        kv_cache_type: str | None = None,
        n_rs_seq: int = 0,
    ) -> None:
        """``kv_cache_type``: a ``KV_TYPES`` name (None: llama.cpp's default, F16).
        ``n_rs_seq``: recurrent-state snapshots kept per sequence, so that the last
        ``n_rs_seq`` tokens of a decode can be cut back (llama.cpp honours it for some
        architectures only: :attr:`n_rs_seq` says what it granted)."""
        params = llama_cpp.llama_context_default_params()
        params.n_rs_seq = n_rs_seq
        if kv_cache_type is not None:
            params.type_k, params.type_v = KV_TYPES[kv_cache_type]
        params.n_ctx = n_ctx * n_seq
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.kv_unified = False
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.embeddings = embeddings
        if pooling is not None:
            params.pooling_type = pooling
        params.ctx_type = ctx_type
        params.n_outputs_max = n_outputs_max
        params.no_perf = True
        if ctx_other is not None:
            params.ctx_other = ctx_other.handle
        mark = native_log_mark()
        handle = llama_cpp.llama_init_from_model(model.handle, params)
        if not handle:
            detail = native_messages_since(mark) or "no details"
            raise ModelhubError(
                f"llama.cpp could not create a context for {model.path.name} "
                f"(n_ctx={n_ctx}, n_batch={n_batch}): {detail}"
            )
        self.model = model
        self.handle: Any = handle
        self.n_seq = n_seq
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(handle))  # positions per sequence
        self.n_batch = n_batch
        self.n_rs_seq = int(llama_cpp.llama_n_rs_seq(handle))
        self.memory = llama_cpp.llama_get_memory(handle)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))
        n_seq_id[:] = 1
        self._seq = np.full(n_batch, -1, dtype=np.int32)  # each row's sequence id, as written
        self._set_seq(n_batch, 0)
        self._n_outputs = 0

    def _set_seq(self, n: int, seq: int | npt.NDArray[np.int32]) -> None:
        """Write the rows' sequence ids where they differ from what the batch holds."""
        wanted = np.broadcast_to(np.asarray(seq, dtype=np.int32), (n,))
        for i in np.flatnonzero(self._seq[:n] != wanted):
            self._batch.seq_id[int(i)][0] = int(wanted[i])
        self._seq[:n] = wanted

    def decode(self, tokens: Sequence[int], start: int, logits: LogitsMode = "last") -> None:
        """Evaluate ``tokens`` at positions ``start..`` (one llama_decode; len <= n_batch)."""
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        if start + n > self.n_ctx:
            raise ModelhubError(
                f"context is full: {start + n} tokens needed, the context holds {self.n_ctx}"
            )
        self._set_seq(n, 0)
        self._tok[:n] = tokens
        self._pos[:n] = np.arange(start, start + n, dtype=np.int32)
        if logits == "all":
            self._out[:n] = 1
            self._n_outputs = n
        else:
            self._out[:n] = 0
            if logits == "last":
                self._out[n - 1] = 1
            self._n_outputs = 1 if logits == "last" else 0
        self._batch.n_tokens = n
        mark = native_log_mark()
        rc = llama_cpp.llama_decode(self.handle, self._batch)
        if rc != 0:
            # On failure the cache may hold part of the batch: drop it so the caller's view of the
            # cache (everything before ``start``) stays true.
            self.truncate(start)
            detail = native_messages_since(mark)
            raise ModelhubError(f"llama_decode failed (code {rc}) at position {start}: {detail}")

    def decode_rows(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        seqs: Sequence[int],
        outputs: Sequence[bool],
    ) -> None:
        """Evaluate rows of several sequences in one llama_decode (``len <= n_batch``): row i
        is ``tokens[i]`` at ``positions[i]`` of sequence ``seqs[i]``; rows with ``outputs[i]``
        get logits (read with :meth:`row_logits`). A sequence's rows must be consecutive
        positions after what its cache holds. On failure every sequence of the batch is cut
        back to where its rows started."""
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        pos = np.asarray(positions, dtype=np.int32)
        seq = np.asarray(seqs, dtype=np.int32)
        if int(pos.max()) >= self.n_ctx:
            raise ModelhubError(
                f"context is full: position {int(pos.max())} needed, the context holds "
                f"{self.n_ctx} per sequence"
            )
        self._set_seq(n, seq)
        self._tok[:n] = tokens
        self._pos[:n] = pos
        self._out[:n] = np.asarray(outputs, dtype=np.int8)
        self._n_outputs = int(np.count_nonzero(self._out[:n]))
        self._batch.n_tokens = n
        mark = native_log_mark()
        rc = llama_cpp.llama_decode(self.handle, self._batch)
        if rc != 0:
            for s in np.unique(seq):
                self.truncate(int(pos[seq == s].min()), int(s))
            detail = native_messages_since(mark)
            raise ModelhubError(f"llama_decode failed (code {rc}): {detail}")

    def row_logits(self, row: int) -> npt.NDArray[np.float32]:
        """The logits of batch row ``row`` of the last :meth:`decode_rows` (a view)."""
        ptr = llama_cpp.llama_get_logits_ith(self.handle, row)
        if not ptr:
            raise ModelhubError(f"batch row {row} has no logits")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def decode_chunked(self, tokens: Sequence[int], start: int, logits_last: bool) -> None:
        """Evaluate a long sequence in n_batch chunks (prefill)."""
        for offset in range(0, len(tokens), self.n_batch):
            chunk = tokens[offset : offset + self.n_batch]
            last = offset + self.n_batch >= len(tokens)
            self.decode(chunk, start + offset, "last" if (last and logits_last) else "none")

    def logits(self) -> npt.NDArray[np.float32]:
        """All logits rows of the last decode, in batch order (a view: valid until the next)."""
        ptr = llama_cpp.llama_get_logits(self.handle)
        return np.ctypeslib.as_array(ptr, shape=(self._n_outputs, self.model.n_vocab))

    def last_logits(self) -> npt.NDArray[np.float32]:
        ptr = llama_cpp.llama_get_logits_ith(self.handle, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def truncate(self, keep: int, seq: int = 0) -> bool:
        """Drop every cached position >= ``keep`` of sequence ``seq``; False when the memory
        cannot (recurrent state)."""
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq, keep, -1))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, True)

    def clear_seq(self, seq: int) -> None:
        """Forget everything sequence ``seq`` holds (possible for every kind of memory)."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def shift(self, keep: int, discard: int, seq: int = 0) -> bool:
        """Context shift: drop positions ``keep..keep+discard-1`` of ``seq`` and move the
        later ones down by ``discard``; llama.cpp re-rotates their keys (RoPE) at the next
        decode (a quantised K cache is dequantised, rotated and quantised again). False, with
        nothing changed, when this memory cannot (recurrent state, M-RoPE)."""
        if not llama_cpp.llama_memory_can_shift(self.memory):
            return False
        if not llama_cpp.llama_memory_seq_rm(self.memory, seq, keep, keep + discard):
            return False
        llama_cpp.llama_memory_seq_add(self.memory, seq, keep + discard, -1, -discard)
        return True

    def save_state(self, seq: int) -> ctypes.Array[ctypes.c_uint8]:
        """A copy of ``seq``'s recurrent state (llama.cpp's partial state: not the attention
        cache, which can be cut back instead), for :meth:`load_state`."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(llama_cpp.llama_state_seq_get_size_ext(self.handle, seq, flags))
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data_ext(self.handle, buf, size, seq, flags)
        if written != size:
            raise ModelhubError(f"could not save the state of sequence {seq}")
        return buf

    def load_state(self, seq: int, state: ctypes.Array[ctypes.c_uint8]) -> bool:
        """Put back a :meth:`save_state` copy; the attention cache past it must then be cut
        (:meth:`truncate`). False when llama.cpp refused it (the sequence is then cleared)."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        n = llama_cpp.llama_state_seq_set_data_ext(self.handle, state, len(state), seq, flags)
        if n == 0:
            self.clear_seq(seq)
            return False
        return True

    def pos_max(self, seq: int = 0) -> int:
        """Highest cached position of ``seq`` (-1 when empty)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq))

    def set_adapters(self, adapters: Sequence[LlamaAdapter], scale: float = 1.0) -> None:
        """Apply ``adapters`` (each at ``scale``) to every later decode of this context; the
        adapters must outlive it (they are freed with their model, after its contexts)."""
        n = len(adapters)
        if n == 0:
            return
        handles = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(a.handle for a in adapters))
        scales = (ctypes.c_float * n)(*([scale] * n))
        llama_cpp.llama_set_adapters_lora(self.handle, handles, n, scales)

    def embeddings_seq(self) -> npt.NDArray[np.float32]:
        ptr = llama_cpp.llama_get_embeddings_seq(self.handle, 0)
        if not ptr:
            raise ModelhubError("this context produced no pooled embedding")
        n = int(llama_cpp.llama_model_n_embd_out(self.model.handle)) or self.model.n_embd
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    def close(self) -> None:
        if self.handle:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.handle)
            self.handle = None
