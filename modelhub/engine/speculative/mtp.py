"""Drafting with the target's own MTP (NextN) heads, through ``llama_cpp.llama_cpp_ext``.

A second context on the *same* model (``LLAMA_CONTEXT_TYPE_MTP``) runs only the NextN block(s).
Its cache mirrors the target's: the row at position p holds (token x_p, target hidden state
h_{p-1}), so after every target decode the drafter "catches up" by decoding the batch's tokens
paired with the previous rows' hidden states (:meth:`observe_target`). To draft from the pending
token x at position P it decodes (x, h_{P-1}), takes the head's best token, and feeds that token
with the hidden state the head returned, one position further, and so on; the draft rows are
removed afterwards, because verification re-adds those positions with the target's real hidden
states. Each of the target's sequences drafts with its own MTP context (:meth:`MtpDrafter.fork`:
the same heads, a cache of its own), reading its rows of the target's batch. With several heads
(``nextn_predict_layers`` > 1) head i drafts token i+1 and every draft step re-decodes the
chain under that head (K is then capped at the number of heads).

A Gemma 4 *assistant* (``gemma4-assistant``: a small separate model, ``DRAFT ./assistant.gguf``)
is drafted the same way with one difference (:attr:`MtpDrafter.shared`): it has no cache of
its own but attends over the target's (llama.cpp maps its layers onto the target's last
sliding-window and full-attention layers), so there is no catch-up decode, every draft step is
evaluated at the pending token's position (the target's cache holds what comes before), and
rolling back is the target's business. Its context follows one target sequence (its rows
carry that sequence's id): the primary follows sequence 0, fork i sequence i.

The staging API is feature-detected: a build without it gets a clear error, never a crash.
Creating an MTP context on a model loaded without its NextN tensors aborts the process inside
llama.cpp, so the model and the file are checked first.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import llama_cpp
import numpy as np
import numpy.typing as npt

from modelhub.engine.context import LlamaContext
from modelhub.engine.llama import ON_CPU, LlamaModel, LoadPlacement
from modelhub.engine.speculative.base import ProbabilityFn, Proposal, pick_draft
from modelhub.errors import DraftError

log = logging.getLogger("modelhub.engine")

_NEEDED = (
    "llama_set_embeddings_nextn",
    "llama_get_embeddings_nextn",
    "llama_get_embeddings_nextn_ith",
    "llama_set_nextn_layer_offset",
)


def nextn_api() -> ModuleType:
    """The ``llama_cpp_ext`` module, or a DraftError saying what this build lacks."""
    try:
        from llama_cpp import llama_cpp_ext
    except (ImportError, AttributeError) as exc:
        raise DraftError(
            "this llama-cpp-python build does not expose the NextN (MTP) functions "
            f"({exc}); use llama-cpp-python >= 0.3.36, DRAFT ngram, or a draft model"
        ) from exc
    missing = [name for name in _NEEDED if not hasattr(llama_cpp_ext, name)]
    if missing or not hasattr(llama_cpp, "LLAMA_CONTEXT_TYPE_MTP"):
        raise DraftError(
            "this llama-cpp-python build lacks "
            + ", ".join(missing or ["MTP contexts"])
            + ": MTP drafting is unavailable; use DRAFT ngram or a draft model"
        )
    return llama_cpp_ext


def _check_heads(heads: LlamaModel) -> None:
    from modelhub.gguf.info import read_gguf_info
    from modelhub.gguf.pairing import check_mtp_target

    if heads.architecture != "gemma4-assistant":  # an assistant is checked with its target
        check_mtp_target(read_gguf_info(heads.path))
    if not heads.load_mtp:
        raise DraftError("the model was loaded without its MTP tensors (load_mtp is off)")
    if heads.n_layer_nextn <= 0:
        raise DraftError(f"{heads.path.name}: llama.cpp loaded no NextN layers")


class MtpDrafter:
    """Drafts with the NextN heads of ``heads``: the target model itself, or (``from_file``) a
    separate MTP-only GGUF of the same model, fed with the target context's hidden states."""

    kind = "mtp"

    def __init__(
        self,
        heads: LlamaModel,
        target_ctx: LlamaContext,
        *,
        n_threads: int,
        p_min: float = 0.0,
        owns_heads: bool = False,
        primary: bool = True,
        seq: int = 0,
    ) -> None:
        """``primary``: this drafter switches the target's NextN output on and, at close, off
        (its forks, one per other sequence, leave it alone). ``seq``: the target sequence a
        shared-cache drafter (an assistant) follows."""
        self._ext = nextn_api()
        _check_heads(heads)
        width = int(llama_cpp.llama_model_n_embd_out(heads.handle)) or heads.n_embd
        if width != target_ctx.model.n_embd:
            raise DraftError(
                f"MTP head output width {width} differs from the target's hidden size "
                f"{target_ctx.model.n_embd}"
            )
        self.heads = heads
        self.shared = heads.architecture == "gemma4-assistant"
        self.seq = seq if self.shared else 0
        self._forks = 0
        self._heads = heads if owns_heads else None  # closed with this drafter
        self._primary = primary
        self._n_threads = n_threads
        self.n_embd = width
        # An assistant's blocks form one head (llama.cpp runs them in one graph).
        self.n_heads = 1 if self.shared else heads.n_layer_nextn
        self.p_min = p_min
        self.rng = np.random.default_rng()
        self._target_ctx = target_ctx
        self.ctx = LlamaContext(
            heads,
            n_ctx=target_ctx.n_ctx,
            n_batch=target_ctx.n_batch,
            n_threads=n_threads,
            ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP,
            ctx_other=target_ctx,
            # a shared cache is the target's: the same sequences (llama.cpp then wants room
            # for an output per sequence)
            n_outputs_max=target_ctx.n_seq if self.shared else 1,
            n_seq=target_ctx.n_seq if self.shared else 1,
        )
        self._ext.llama_set_embeddings_nextn(target_ctx.handle, True, False)
        self._ext.llama_set_embeddings_nextn(self.ctx.handle, True, True)
        self.n_batch = target_ctx.n_batch
        self._batch = llama_cpp.llama_batch_init(self.n_batch, self.n_embd, 1)
        self._tokens_buf = (llama_cpp.llama_token * self.n_batch)()
        self._batch.token = self._tokens_buf
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(self.n_batch, self.n_embd))
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = self.seq
        self._len = 0  # positions in the MTP cache (mirrors the target's cache)
        self._rows_start = 0  # target hidden states of the last target batch, by position
        self._rows = np.zeros((0, self.n_embd), dtype=np.float32)
        self._pending: tuple[int, npt.NDArray[np.float32]] | None = None  # (position, h)
        self._last_n = 0
        if self.n_heads > 1:
            log.info("MTP: %d chained heads (at most that many drafts per round)", self.n_heads)

    @classmethod
    def from_file(
        cls,
        path: Path,
        target: LlamaModel,
        target_ctx: LlamaContext,
        *,
        n_threads: int,
        p_min: float = 0.0,
        placement: LoadPlacement = ON_CPU,
    ) -> MtpDrafter:
        """Heads from an MTP-only GGUF (checked against the target before it is loaded)."""
        from modelhub.gguf.info import read_gguf_info
        from modelhub.gguf.pairing import check_assistant_pairing, check_draft_pairing

        info = read_gguf_info(path, with_tokens=True)
        target_info = read_gguf_info(target.path, with_tokens=True)
        if info.architecture == "gemma4-assistant":
            check_assistant_pairing(target_info, info)
        elif not info.is_mtp_only:
            raise DraftError(f"{path.name} is not an MTP-only GGUF (NextN blocks without a trunk)")
        check_draft_pairing(target_info, info, target.path, path)
        heads = LlamaModel(path, load_mtp=True, placement=placement)
        try:
            return cls(heads, target_ctx, n_threads=n_threads, p_min=p_min, owns_heads=True)
        except BaseException:
            heads.close()
            raise

    def fork(self) -> MtpDrafter:
        """A drafter for another sequence of the target: the same heads, an MTP context of its
        own. Close it before this one. An assistant's forks follow sequences 1, 2, ... in the
        order they are made (the engine makes one per extra slot, in slot order)."""
        self._forks += 1
        return MtpDrafter(
            self.heads,
            self._target_ctx,
            n_threads=self._n_threads,
            p_min=self.p_min,
            primary=False,
            seq=self._forks,
        )

    # ---- keeping the MTP cache in step with the target ----------------------------------------
    def _hidden_before(self, pos: int) -> npt.NDArray[np.float32] | None:
        """h_{pos-1}: the target's hidden state at the position before ``pos``."""
        want = pos - 1
        if want < 0:
            return np.zeros(self.n_embd, dtype=np.float32)
        if self._rows_start <= want < self._rows_start + len(self._rows):
            row: npt.NDArray[np.float32] = self._rows[want - self._rows_start]
            return row
        if self._pending is not None and self._pending[0] == want:
            return self._pending[1]
        return None

    def observe_target(self, tokens: Sequence[int], start: int, first_row: int = 0) -> None:
        """The target decoded ``tokens`` at ``start..`` as rows ``first_row..`` of its batch:
        add their MTP rows (token x_p with the hidden state of the row before) for every
        position the MTP cache does not hold yet."""
        ptr = self._ext.llama_get_embeddings_nextn(self._target_ctx.handle)
        if not ptr:
            raise DraftError("the target produced no NextN hidden states for MTP")
        # Unmasked NextN output has a row for every batch row, in batch order.
        batch = np.ctypeslib.as_array(ptr, shape=(first_row + len(tokens), self.n_embd))
        rows = batch[first_row:].copy()
        if self.shared:  # nothing to decode: the target's cache is the assistant's
            self._rows_start, self._rows = start, rows
            self._len = start + len(tokens)
            return
        items: list[tuple[int, int, npt.NDArray[np.float32]]] = []
        if start <= self._len:  # otherwise there is a gap this batch cannot fill
            for pos in range(self._len, start + len(tokens)):
                index = pos - start
                h = rows[index - 1] if index > 0 else self._hidden_before(pos)
                if h is None:
                    items = []
                    break
                items.append((tokens[index], pos, h))
        self._rows_start, self._rows = start, rows
        if items:
            self._decode_heads(items)

    def rollback(self, keep: int) -> int:
        """The target kept positions < ``keep``. Returns where the target must decode again
        from for this cache to follow it: ``keep`` normally; earlier when the hidden state
        before ``keep`` is not known (a prompt-cache hit on an older request)."""
        if self._len > keep:
            self._truncate(keep)
        h = self._hidden_before(self._len)
        if self._len == keep and h is not None:
            self._pending = (keep - 1, h.copy())
            return keep
        return max(0, self._len - 1)

    # ---- the Drafter interface ---------------------------------------------------------------
    def reseed(self, seed: int | None) -> None:
        self.rng = np.random.default_rng(seed)

    def begin(self, tokens: Sequence[int]) -> None:
        """Nothing to do: the cache follows the target's decodes (``observe_target``)."""

    def commit(self, tokens: Sequence[int]) -> None:
        """Nothing to do: the engine reports the kept length through ``rollback``."""

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        pos = len(tokens) - 1
        h = self._hidden_before(pos)
        if self._len != pos or h is None or max_tokens <= 0:
            return Proposal([])
        if self.n_heads > 1:
            max_tokens = min(max_tokens, self.n_heads)
        chain: list[tuple[int, int, npt.NDArray[np.float32]]] = [(tokens[-1], pos, h)]
        drafts: list[int] = []
        dists: list[npt.NDArray[np.float32]] = []
        history = list(tokens)
        try:
            for step in range(max_tokens):
                if self.shared:  # every step at the pending position, over the target's cache
                    self._decode([(chain[-1][0], pos, chain[-1][2])], head=0, logits_last=True)
                elif self.n_heads > 1:
                    self._truncate(pos)
                    self._decode([*chain], head=step, logits_last=True)
                else:
                    self._decode([chain[-1]], head=0, logits_last=True)
                row = self.ctx.last_logits()
                picked = pick_draft(row, history, probs, self.p_min, self.rng)
                if picked is None:
                    break
                token, q = picked
                if q is not None:
                    dists.append(q)
                drafts.append(token)
                history.append(token)
                out = self._ext.llama_get_embeddings_nextn_ith(self.ctx.handle, self._last_n - 1)
                if not out:
                    break
                h_next = np.ctypeslib.as_array(out, shape=(self.n_embd,)).copy()
                chain.append((token, pos + len(drafts), h_next))
        finally:
            self._truncate(pos)  # verification re-adds these positions with real states
        return Proposal(drafts, np.stack(dists) if dists else None)

    # ---- native batches ------------------------------------------------------------------------
    def _decode_heads(self, items: list[tuple[int, int, npt.NDArray[np.float32]]]) -> None:
        """Catch-up rows, once per head (each head keeps its own layer's cache rows)."""
        for offset in range(0, len(items), self.n_batch):
            chunk = items[offset : offset + self.n_batch]
            for head in range(self.n_heads):
                if self.n_heads > 1:
                    self._truncate_native(chunk[0][1])
                self._decode(chunk, head=head, logits_last=False)

    def _decode(
        self, items: list[tuple[int, int, npt.NDArray[np.float32]]], head: int, logits_last: bool
    ) -> None:
        n = len(items)
        for i, (token, pos, h) in enumerate(items):
            self._tokens_buf[i] = token
            self._batch.pos[i] = pos
            self._batch.logits[i] = 1 if (logits_last and i == n - 1) else 0
            self._embd[i] = h
        self._batch.n_tokens = n
        self._last_n = n
        if self.n_heads > 1:
            self._ext.llama_set_nextn_layer_offset(self.ctx.handle, head)
        try:
            rc = llama_cpp.llama_decode(self.ctx.handle, self._batch)
        finally:
            if self.n_heads > 1:
                self._ext.llama_set_nextn_layer_offset(self.ctx.handle, 0)
        if rc != 0:
            self._truncate(items[0][1])
            raise DraftError(f"MTP decode failed (code {rc}) at position {items[0][1]}")
        self._len = max(self._len, items[-1][1] + 1)

    def _truncate_native(self, keep: int) -> None:
        if not self.shared:  # a shared cache is cut back with the target's
            llama_cpp.llama_memory_seq_rm(self.ctx.memory, 0, keep, -1)

    def _truncate(self, keep: int) -> None:
        if self._len > keep:
            self._truncate_native(keep)
            self._len = keep

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            if self._primary:
                self._ext.llama_set_embeddings_nextn(self._target_ctx.handle, False, False)
            # The token array is ours: detach it so llama_batch_free does not free it.
            self._batch.token = ctypes.POINTER(llama_cpp.llama_token)()
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
            self.ctx.close()
        heads = getattr(self, "_heads", None)
        if heads is not None:
            heads.close()
            self._heads = None
