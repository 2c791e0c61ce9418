"""Drafting with a second, smaller model that shares the target's tokenizer.

The draft has its own context and KV cache. ``_evaluated`` mirrors that cache exactly; it may lag
the accepted sequence (the draft never decodes its last proposal, and sits idle while adaptive
drafting is off), and it catches up in one batch before the next proposal. A draft context
shorter than the target's is fine: once the sequence no longer fits, it proposes nothing for the
rest of the request (SPEC-07), or until a context shift of the target shortens the sequence (the
draft's cache is shifted alike).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from modelhub.engine.context import LlamaContext
from modelhub.engine.llama import ON_CPU, LlamaModel, LoadPlacement
from modelhub.engine.speculative.base import ProbabilityFn, Proposal, pick_draft

log = logging.getLogger("modelhub.engine")


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b`` (known equal before ``start``)."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelDrafter:
    kind = "draft_model"

    def __init__(
        self,
        path: Path,
        *,
        target_vocab: int,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        p_min: float = 0.0,
        placement: LoadPlacement = ON_CPU,
        model: LlamaModel | None = None,
    ) -> None:
        """``model`` shares weights another drafter loaded (``fork``); it is not closed here."""
        self._owns_model = model is None
        self.model = model if model is not None else LlamaModel(path, placement=placement)
        self._settings = (path, target_vocab, n_ctx, n_batch, n_threads, p_min)
        train = self.model.n_ctx_train
        wanted = min(n_ctx, train) if train > 0 else n_ctx
        try:
            self.ctx = LlamaContext(self.model, n_ctx=wanted, n_batch=n_batch, n_threads=n_threads)
        except BaseException:
            if self._owns_model:
                self.model.close()
            raise
        self.n_ctx = min(wanted, self.ctx.n_ctx)  # llama.cpp may round the context up
        self.p_min = p_min
        self.rng = np.random.default_rng()
        self._width = target_vocab
        self._evaluated: list[int] = []
        self._logits_ready = False  # the context's last row is the logits of _evaluated[-1]
        self._base = 0  # _evaluated[:_base] is known to match the accepted sequence
        self._warned_full = False

    def fork(self) -> DraftModelDrafter:
        """A drafter for another sequence: the same weights, a context of its own. Close it
        before this one."""
        path, vocab, n_ctx, n_batch, n_threads, p_min = self._settings
        return DraftModelDrafter(
            path,
            target_vocab=vocab,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=n_threads,
            p_min=p_min,
            model=self.model,
        )

    def reseed(self, seed: int | None) -> None:
        self.rng = np.random.default_rng(seed)

    def begin(self, tokens: Sequence[int]) -> None:
        """Keep the cached prefix this prompt shares with the last request; drop the rest."""
        self._warned_full = False
        keep = common_prefix(self._evaluated, tokens)
        self._truncate(keep)

    def prepare(self, tokens: Sequence[int]) -> bool:
        """Catch up on ``tokens`` so the next-token logits after them are ready.

        Returns False when the sequence no longer fits the draft context.
        """
        if len(tokens) + 1 > self.n_ctx:
            if not self._warned_full:
                log.info("draft context (%d) is full: drafting off for this request", self.n_ctx)
                self._warned_full = True
            return False
        n = len(self._evaluated)
        if n == len(tokens) and self._logits_ready:
            return True
        if n >= len(tokens):  # re-decode the last token to get its logits row back
            n = len(tokens) - 1
            self._truncate(n)
        self.ctx.decode_chunked(tokens[n:], n, logits_last=True)
        self._evaluated.extend(tokens[n:])
        self._logits_ready = True
        return True

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        self._base = len(tokens)
        max_tokens = min(max_tokens, self.n_ctx - len(tokens) - 1)
        if max_tokens <= 0 or not self.prepare(tokens):
            return Proposal([])
        drafts: list[int] = []
        dists: list[npt.NDArray[np.float32]] = []
        history = list(tokens)
        for i in range(max_tokens):
            picked = pick_draft(self._row(), history, probs, self.p_min, self.rng)
            if picked is None:
                break
            token, q = picked
            if q is not None:
                dists.append(q)
            drafts.append(token)
            history.append(token)
            if i + 1 < max_tokens:
                self.ctx.decode([token], len(self._evaluated))
                self._evaluated.append(token)
        self._logits_ready = False
        return Proposal(drafts, np.stack(dists) if dists else None)

    def commit(self, tokens: Sequence[int]) -> None:
        keep = common_prefix(self._evaluated, tokens, self._base)
        if keep < len(self._evaluated):
            self._truncate(keep)

    def shift(self, keep: int, discard: int) -> None:
        """The target shifted its context: shift this cache the same way, so it still holds a
        prefix of the accepted sequence (where it cannot, keep only what is before ``keep``)."""
        if len(self._evaluated) > keep + discard and self.ctx.shift(keep, discard):
            del self._evaluated[keep : keep + discard]
        else:
            self._truncate(keep)
        self._base = min(self._base, keep)
        self._logits_ready = False  # that row saw the discarded tokens

    def _row(self) -> npt.NDArray[np.float32]:
        """The last logits row, cut or padded to the target's vocabulary size."""
        row = self.ctx.last_logits()
        if len(row) == self._width:
            return row
        if len(row) > self._width:
            return row[: self._width]
        padded = np.full(self._width, -np.inf, dtype=np.float32)
        padded[: len(row)] = row
        return padded

    def _truncate(self, keep: int) -> None:
        if keep >= len(self._evaluated):
            return
        if not self.ctx.truncate(keep):
            self.ctx.clear()
            keep = 0
        del self._evaluated[keep:]
        self._logits_ready = False

    def close(self) -> None:
        self.ctx.close()
        if self._owns_model:
            self.model.close()
