"""A thin, typed wrapper over llama-cpp-python's low-level API.

Only what the engine needs: load a model (here), create contexts (``context``: flash attention
on, which makes batched decoding bit-identical to one-token decoding for quantised weights on
CPU), tokenize, decode a batch at given positions with logits on chosen rows, read logits rows
as zero-copy numpy views, and roll the KV cache back. Everything here maps one-to-one to a
llama.cpp call; policy lives in ``generate.py``; the backend and llama.cpp's log are
``native``.
"""

from __future__ import annotations

import ctypes
import itertools
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from modelhub.engine.native import ensure_backend, native_log_mark, native_messages_since
from modelhub.errors import GGUFError, ModelhubError, RequestCancelledError

# About how long the pieces of a long text are tokenized one by one (see LlamaModel.tokenize).
_PIECE_CHARS = 8192

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
        self._eog: dict[int, bool] = {}  # asked of every emitted and drafted token
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
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return eog

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
