"""Drafting with a DFlash block drafter (``DRAFT`` a ``dflash`` GGUF, ``draft_kind="dflash"``).

A DFlash drafter keeps a KV cache of *target features*: after every target decode the inputs
of some target layers at each of the batch's positions are decoded as embedding-only rows at
those positions (:meth:`observe_target`), which fuses them into the cache. To draft after the
pending token x_P it decodes the block [x_P, mask, mask, ...] at P.. in one (by default
non-causal) pass; row i's logits are the guess for position P+i. The block's rows are removed
afterwards: the verification batch then brings the target's real features for them.

**K is capped at ``dflash.block_size - 1``** (the block holds the anchor token and at most that
many masks), so ``draft_num_predict`` above it drafts ``block_size - 1`` tokens per round.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp
import numpy as np
import numpy.typing as npt

from modelhub.engine.speculative.base import ProbabilityFn, Proposal, pick_draft
from modelhub.engine.speculative.layer_api import logits_row
from modelhub.engine.speculative.layered import LayeredDrafter
from modelhub.gguf.info import GGUFInfo
from modelhub.gguf.pairing import PairingReport
from modelhub.gguf.pairing_layers import DFLASH_DEFAULT_BLOCK, check_dflash_pairing


class DFlashDrafter(LayeredDrafter):
    """DFlash drafting for one sequence of the target (see the module docstring)."""

    kind = "dflash"

    @classmethod
    def check(cls, target: GGUFInfo, draft: GGUFInfo) -> PairingReport:
        return check_dflash_pairing(target, draft)

    def setup(self) -> None:
        block = self.model.meta("dflash.block_size")
        self.block_size = int(block) if block and block.isdigit() else DFLASH_DEFAULT_BLOCK
        self.max_drafts = self.block_size - 1
        self.mask = int(llama_cpp.llama_vocab_mask(self.model.vocab))
        causal = self.model.meta("dflash.attention.causal")
        llama_cpp.llama_set_causal_attn(self.ctx.handle, causal == "true")

    def observe_target(self, tokens: Sequence[int], start: int, first_row: int = 0) -> None:
        """The target decoded ``tokens`` at ``start..`` as rows ``first_row..`` of its batch:
        inject their features at those positions."""
        n = len(tokens)
        self.truncate(start)  # the target redid these positions
        if n == 0 or start != self._len:  # a gap: rollback() asks the target to fill it
            return
        feats = self.target_features(first_row, n)
        for offset in range(0, n, self.ctx.n_batch):
            chunk = feats[offset : offset + self.ctx.n_batch]
            for i, row in enumerate(chunk):
                self.batch.embd(row, start + offset + i)
            self._run(start + offset)
            self._len = start + offset + len(chunk)

    def rollback(self, keep: int) -> int:
        """The target kept positions < ``keep``; the target must decode again from what the
        cache holds when that is less (an older prompt's cache)."""
        self.truncate(keep)
        return self._len

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        pending = len(tokens) - 1
        k = min(max_tokens, self.max_drafts)
        if self._len != pending or k <= 0:
            return Proposal([])
        self.batch.token(tokens[-1], pending)
        for i in range(1, k + 1):
            self.batch.token(self.mask, pending + i, logits=True)
        try:
            self._run(pending)
            drafts: list[int] = []
            dists: list[npt.NDArray[np.float32]] = []
            history = list(tokens)
            for i in range(1, k + 1):
                row = logits_row(self.ctx.handle, i, self.model.n_vocab, self.n_vocab)
                picked = pick_draft(row, history, probs, self.p_min, self.rng)
                if picked is None:
                    break
                token, q = picked
                drafts.append(token)
                history.append(token)
                if q is not None:
                    dists.append(q)
        finally:
            self.ctx.truncate(pending)  # the block's rows: verification re-adds real ones
            self._len = min(self._len, pending)
        return Proposal(drafts, np.stack(dists) if dists else None)

    def _run(self, first_pos: int) -> None:
        try:
            self.batch.run()
        except BaseException:
            self.ctx.truncate(first_pos)  # it may hold part of the batch
            self._len = min(self._len, first_pos)
            raise
