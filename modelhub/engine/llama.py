"""A thin, typed wrapper over llama-cpp-python's low-level API.

Only what the engine needs: load a model, create contexts (flash attention on, which makes batched
decoding bit-identical to one-token decoding for quantised weights on CPU), tokenize, decode a
batch at given positions with logits on chosen rows, read logits rows as zero-copy numpy views,
and roll the KV cache back. Everything here maps one-to-one to a llama.cpp call; policy lives in
``generate.py``.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import llama_cpp
import numpy as np
import numpy.typing as npt

from modelhub.errors import GGUFError, ModelhubError, RequestCancelledError

log = logging.getLogger("modelhub.llama")

LogitsMode = Literal["none", "last", "all"]

# KV cache types (keys, values) by setting name. llama.cpp's CPU flash attention takes a split-KV
# path for a single query over 512+ cells and a tiled path for 64+ queries of one sequence,
# but only when keys and values are both F16/F32; those paths sum in other orders, so a
# one-row and a many-row decode of the same token then differ in the last bits (measured up to
# 0.6 in a logit past 256 cached tokens). Q8_0 keys with F16 values keep every batch on the one
# kernel, bit-identical, at no measured speed cost on CPU: that is ``auto``.
KV_TYPES: dict[str, tuple[int, int]] = {
    "auto": (llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_F16),
    "f16": (llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_F16),
    "q8_0": (llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_Q8_0),
    "q4_0": (llama_cpp.GGML_TYPE_Q4_0, llama_cpp.GGML_TYPE_Q4_0),
}

_backend_lock = threading.Lock()
_backend_ready = False
# llama.cpp's recent warnings and errors: (number, thread, text), to explain a failure with
# what the failing call logged (see native_messages_since).
_recent_messages: collections.deque[tuple[int, int, str]] = collections.deque(maxlen=32)
_message_numbers = itertools.count(1)
_last_message = 0
# About how long the pieces of a long text are tokenized one by one (see LlamaModel.tokenize).
_PIECE_CHARS = 8192
# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation.
_LEVELS = {3: logging.WARNING, 4: logging.ERROR}


# "load_tensors:   CPU_Mapped model buffer size =    92.00 MiB", "... RPC0[host:port] KV ...":
# what llama.cpp allocated on which device (it has no API for this).
_BUFFER_LINE = re.compile(r"(\S+) (model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
_buffers: list[tuple[str, str, int]] = []  # (buffer name, what, bytes) since the last clear
_OFFLOADED_LINE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_offloaded: list[tuple[int, int]] = []


def _on_native_log(level: int, text: bytes, _user_data: Any) -> None:
    global _last_message
    message = text.decode("utf-8", errors="replace").rstrip()
    if not message:
        return
    if (m := _BUFFER_LINE.search(message)) is not None:
        _buffers.append((m[1], m[2], int(float(m[3]) * 1024 * 1024)))
    elif (m := _OFFLOADED_LINE.search(message)) is not None:
        _offloaded.append((int(m[1]), int(m[2])))
    if level in _LEVELS:
        _last_message = next(_message_numbers)
        _recent_messages.append((_last_message, threading.get_ident(), message))
        log.log(_LEVELS[level], "%s", message)
    else:
        log.debug("%s", message)


# Kept at module level: llama.cpp holds the pointer for the life of the process.
_log_callback = llama_cpp.llama_log_callback(_on_native_log)


def ensure_backend() -> None:
    """Initialise llama.cpp once per process and route its log into ``logging``."""
    global _backend_ready
    with _backend_lock:
        if _backend_ready:
            return
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def allocated_buffers() -> list[tuple[str, str, int]]:
    """The buffers llama.cpp reported allocating since :func:`clear_allocation_log`: (buffer
    name such as ``CPU_Mapped`` or ``RPC0[127.0.0.1:50052]``, model/KV/RS/compute/output,
    bytes)."""
    return list(_buffers)


def offloaded_layers() -> tuple[int, int] | None:
    """(offloaded, total) layers of the last model loaded since the clear, as llama.cpp said."""
    return _offloaded[-1] if _offloaded else None


def clear_allocation_log() -> None:
    _buffers.clear()
    _offloaded.clear()


def native_log_mark() -> int:
    """A mark to pass to :func:`native_messages_since` after a llama.cpp call."""
    return _last_message


def native_messages_since(mark: int) -> str:
    """The warnings/errors llama.cpp logged on this thread since ``mark`` (to explain a failed
    call with its own messages, never an earlier call's or another thread's)."""
    me = threading.get_ident()
    return " | ".join(
        text for n, thread, text in list(_recent_messages) if n > mark and thread == me
    )


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class LoadPlacement:
    """Where a model's weights go. ``repack`` False keeps them out of ggml's extra buffer
    types (AMX, repacked layouts): llama.cpp's ``--no-repack``, the fallback for CPUs that
    fault on them. ``n_gpu_layers`` layers go to the offload devices (GPUs, RPC workers; more
    than the model has: all of it, the output layer too): ``devices`` (ggml device handles;
    empty: every offload device), split in the proportions of ``tensor_split`` (empty: by
    their free memory); ``main_gpu`` holds what is not split. ``cpu_only`` gives the model no
    device at all (with devices but no layers on them, llama.cpp would still run large
    batches there and keep buffers there)."""

    repack: bool = True
    n_gpu_layers: int = 0
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    devices: tuple[int, ...] = ()
    cpu_only: bool = False


ON_CPU = LoadPlacement(cpu_only=True)


class LlamaModel:
    """Weights and vocabulary of one GGUF file."""

    def __init__(
        self,
        path: Path,
        *,
        load_mtp: bool = False,
        vocab_only: bool = False,
        placement: LoadPlacement = ON_CPU,
    ) -> None:
        ensure_backend()
        if not path.is_file():
            raise GGUFError(f"model file not found: {path}")
        params = llama_cpp.llama_model_default_params()
        params.load_mtp = load_mtp
        params.vocab_only = vocab_only
        params.use_extra_bufts = placement.repack
        params.n_gpu_layers = placement.n_gpu_layers
        params.main_gpu = placement.main_gpu
        # llama.cpp reads these arrays while loading: kept alive on self until then
        if placement.tensor_split:
            n = int(llama_cpp.llama_max_devices())
            if len(placement.tensor_split) > n:
                raise ModelhubError(
                    f"tensor_split has {len(placement.tensor_split)} parts; at most {n}"
                )
            self._split = (ctypes.c_float * n)(*placement.tensor_split)
            params.tensor_split = ctypes.cast(self._split, ctypes.POINTER(ctypes.c_float))
        if placement.devices or placement.cpu_only:  # NULL-terminated; just NULL: none
            chosen = () if placement.cpu_only else placement.devices
            self._devices = (ctypes.c_void_p * (len(chosen) + 1))(*chosen)
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        mark = native_log_mark()
        handle = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not handle:
            detail = native_messages_since(mark) or "no details"
            raise GGUFError(f"llama.cpp could not load {path.name}: {detail}")
        self.path = path
        self.handle: Any = handle
        self.load_mtp = load_mtp
        self.vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(llama_cpp.llama_model_n_embd(handle))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(handle))
        self.n_layer_nextn = int(llama_cpp.llama_model_n_layer_nextn(handle))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self.vocab))
        self.is_recurrent = bool(llama_cpp.llama_model_is_recurrent(handle))
        self.is_hybrid = bool(llama_cpp.llama_model_is_hybrid(handle))
        self.add_eos = bool(llama_cpp.llama_vocab_get_add_eos(self.vocab))
        self.architecture = self.meta("general.architecture") or "unknown"
        self._pieces: dict[int, bytes] = {}
        self._specials: tuple[frozenset[str], list[int], re.Pattern[str]] | None = None
        self._prefixes: frozenset[str] = frozenset()  # every prefix of a special token
        self._max_piece = 0
        self.adapters: list[LlamaAdapter] = []

    def load_adapter(self, path: Path) -> LlamaAdapter:
        """Load a GGUF LoRA adapter for this model (freed with it; apply it to a context with
        :meth:`LlamaContext.set_adapters`)."""
        adapter = LlamaAdapter(self, path)
        self.adapters.append(adapter)
        return adapter

    def head_size_k(self) -> int:
        """Width of one attention head's key (what a quantised K cache must divide)."""
        key_length = self.meta(f"{self.architecture}.attention.key_length")
        if key_length and key_length.isdigit():
            return int(key_length)
        heads = int(llama_cpp.llama_model_n_head(self.handle))
        return self.n_embd // heads if heads > 0 else self.n_embd

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = llama_cpp.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def tokenize(
        self,
        text: str,
        *,
        add_special: bool = True,
        parse_special: bool = True,
        cancel: threading.Event | None = None,
    ) -> list[int]:
        """llama.cpp's tokenization of ``text``. llama.cpp splits text at special tokens in
        time quadratic in their number, so a long text is cut just before special tokens into
        pieces tokenized one by one: the same tokens, in linear time, with ``cancel`` checked
        between pieces."""
        pieces = self._pieces_at_specials(text) if parse_special else [text]
        if len(pieces) == 1:
            return self._tokenize(text, add_special, parse_special)
        out: list[int] = []
        for piece in pieces:
            if cancel is not None and cancel.is_set():
                raise RequestCancelledError("request canceled")
            out.extend(self._tokenize(piece, False, True))
        if add_special and self.add_bos and self.bos >= 0:
            out.insert(0, self.bos)
        if add_special and self.add_eos and self.eos >= 0:
            out.append(self.eos)
        return out

    def _pieces_at_specials(self, text: str) -> list[str]:
        """``text`` cut into pieces of about ``_PIECE_CHARS`` characters, each cut just before a
        special token, where that is exactly equivalent: llama.cpp splits there too (BPE and
        SPM vocabularies; never before a token that strips the whitespace on its left, inside a
        longer special token, or where a vocabulary adds separators)."""
        if len(text) <= _PIECE_CHARS or not self._special_texts()[0]:
            return [text]
        cuts, pos = [], _PIECE_CHARS
        while pos < len(text) and (cut := self._next_special(text, pos)) is not None:
            cuts.append(cut)
            pos = cut + _PIECE_CHARS
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in itertools.pairwise(bounds)]

    def _next_special(self, text: str, pos: int) -> int | None:
        """The first place at or after ``pos`` where a special token starts on its own."""
        specials, lengths, first = self._special_texts()
        while (m := first.search(text, pos)) is not None:
            at = m.start()
            if (
                self._special_at(text, at)
                and not any(  # not inside a longer special token
                    text[b : b + n] in specials
                    for n in lengths
                    for b in range(max(0, at - n + 1), at)
                )
            ):
                return at
            pos = at + 1
        return None

    def _special_at(self, text: str, at: int) -> bool:
        """Whether a special token starts at ``at``: walks the prefixes of special tokens, so
        a text full of near misses (``<<<<``) costs a lookup or two per character."""
        specials, prefixes, end = self._special_texts()[0], self._prefixes, len(text)
        k = 1
        while at + k <= end and text[at : at + k] in prefixes:
            if text[at : at + k] in specials:
                return True
            k += 1
        return False

    def _special_texts(self) -> tuple[frozenset[str], list[int], re.Pattern[str]]:
        """Special tokens that may start a piece, their lengths, and their first characters."""
        if self._specials is None:
            chunkable = llama_cpp.llama_vocab_type(self.vocab) in (
                llama_cpp.LLAMA_VOCAB_TYPE_BPE,
                llama_cpp.LLAMA_VOCAB_TYPE_SPM,
            ) and not llama_cpp.llama_vocab_get_add_sep(self.vocab)
            special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
            texts = set()
            for token in range(self.n_vocab) if chunkable else ():
                attr = int(llama_cpp.llama_vocab_get_attr(self.vocab, token))
                text = self.token_text(token)
                if attr & special and not attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP and text:
                    texts.add(text)
            self._prefixes = frozenset(t[:k] for t in texts for k in range(1, len(t) + 1))
            firsts = "".join(sorted({t[0] for t in texts}))
            pattern = re.compile(f"[{re.escape(firsts)}]" if firsts else "(?!)")
            self._specials = (frozenset(texts), sorted({len(t) for t in texts}), pattern)
        return self._specials

    def max_piece_bytes(self) -> int:
        """The most bytes one token stands for: a text of n bytes has at least n / this
        many tokens (a bound checked before tokenizing a prompt that may be huge)."""
        if self._max_piece == 0:
            longest = max(
                (len(self.token_text(t).encode()) for t in range(self.n_vocab)), default=1
            )
            self._max_piece = max(1, longest)
        return self._max_piece

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), tokens, capacity, add_special, parse_special
        )
        if n < 0:
            capacity = -n
            tokens = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), tokens, capacity, add_special, parse_special
            )
            if n < 0:
                raise ModelhubError("tokenization failed")
        return list(tokens[:n])

    def token_piece_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as nothing, as in llama-server)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        piece = buf.raw[: max(n, 0)]
        self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_piece_bytes(t) for t in tokens).decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        for adapter in self.adapters:  # before the model they belong to
            adapter.close()
        self.adapters = []
        if self.handle:
            llama_cpp.llama_model_free(self.handle)
            self.handle = None


class LlamaAdapter:
    """A LoRA adapter GGUF loaded for one model; llama.cpp checks its architecture, tensor
    names and shapes against the model and refuses a mismatch."""

    def __init__(self, model: LlamaModel, path: Path) -> None:
        if not path.is_file():
            raise GGUFError(f"adapter file not found: {path}")
        mark = native_log_mark()
        handle = llama_cpp.llama_adapter_lora_init(model.handle, str(path).encode())
        if not handle:
            detail = native_messages_since(mark) or "no details"
            raise GGUFError(
                f"llama.cpp could not load the LoRA adapter {path.name} for "
                f"{model.path.name}: {detail}"
            )
        self.path = path
        self.handle: Any = handle

    def close(self) -> None:
        if self.handle:
            llama_cpp.llama_adapter_lora_free(self.handle)
            self.handle = None


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
