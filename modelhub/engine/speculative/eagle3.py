"""Drafting with an EAGLE-3 head (``DRAFT`` an ``eagle3`` GGUF, ``draft_kind="eagle3"``).

An EAGLE-3 head is one decoder block with a KV cache of its own. Its encoder (``fc``) fuses the
inputs of three target layers at position p into a state g_p, the target's view of what
follows x_p. Its cache row at position p holds the pair (x_{p+1}, g_p), and decoding a pair
predicts the token after x_{p+1}. So after every target decode the drafter encodes the batch's
rows into g and decodes the pairs whose next token the batch holds (:meth:`observe_target`);
the g of the batch's last position waits for the token the target picks next.

To draft after the pending token x_P (the target's cache holds positions < P), it decodes
(x_P, g_{P-1}) at P-1, picks a token, and decodes (that token, the head's own pre-norm state)
at P, and so on. The first row is exact and is kept; the rows after it are removed, since the
next verification feeds the target's real states for those positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from modelhub.engine.speculative.base import ProbabilityFn, Proposal, pick_draft
from modelhub.engine.speculative.layer_api import logits_row
from modelhub.engine.speculative.layered import LayeredDrafter
from modelhub.errors import DraftError
from modelhub.gguf.info import GGUFInfo
from modelhub.gguf.pairing import PairingReport
from modelhub.gguf.pairing_layers import check_eagle3_pairing


class Eagle3Drafter(LayeredDrafter):
    """EAGLE-3 drafting for one sequence of the target (see the module docstring)."""

    kind = "eagle3"

    @classmethod
    def check(cls, target: GGUFInfo, draft: GGUFInfo) -> PairingReport:
        return check_eagle3_pairing(target, draft)

    def setup(self) -> None:
        self.n_embd = self.model.n_embd
        # g of the last observed batch, by position, and the one row before it (the previous
        # batch's last), which the first pair of the next batch needs.
        self._g_start = 0
        self._g = np.zeros((0, self.n_embd), np.float32)
        self._g_prev: tuple[int, npt.NDArray[np.float32]] | None = None

    def _g_at(self, pos: int) -> npt.NDArray[np.float32] | None:
        if self._g_start <= pos < self._g_start + len(self._g):
            row: npt.NDArray[np.float32] = self._g[pos - self._g_start]
            return row
        if self._g_prev is not None and self._g_prev[0] == pos:
            return self._g_prev[1]
        return None

    def _encode(self, feats: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """g rows of the fused target features (one encoder pass; positions are unused, but
        must follow what the cache holds)."""
        for i, row in enumerate(feats):
            self.batch.embd(row, self._len + i, logits=True)
        self.batch.run(encode=True)
        ptr = self.ext.llama_get_embeddings_nextn(self.ctx.handle)
        if not ptr:
            raise DraftError("the EAGLE-3 encoder produced no states")
        out: npt.NDArray[np.float32] = np.ctypeslib.as_array(
            ptr, shape=(len(feats), self.n_embd)
        ).copy()
        return out

    def observe_target(self, tokens: Sequence[int], start: int, first_row: int = 0) -> None:
        """The target decoded ``tokens`` at ``start..`` as rows ``first_row..`` of its batch."""
        n = len(tokens)
        if n == 0:
            return
        g = self._encode(self.target_features(first_row, n))
        # The target redid positions >= start. A pair at start-1 can only be propose()'s
        # first one, made with this batch's first token (rollback drops it otherwise).
        self.truncate(start)
        pairs: list[tuple[int, int, npt.NDArray[np.float32]]] = []
        if start <= self._len + 1:  # otherwise a gap this batch cannot fill
            for pos in range(self._len, start + n - 1):
                g_pos = g[pos - start] if pos >= start else self._g_at(pos)
                if g_pos is None:
                    pairs = []
                    break
                pairs.append((tokens[pos + 1 - start], pos, g_pos))
        before = self._g_at(start - 1)
        self._g_prev = None if before is None else (start - 1, before.copy())
        self._g_start, self._g = start, g
        self._decode(pairs, logits=False)

    def rollback(self, keep: int) -> int:
        """The target kept positions < ``keep``: the cache keeps pairs < keep-1 (the pair at
        keep-1 needs the token the target picks next). Returns where the target must decode
        again from: ``keep``, or earlier when g_{keep-1} is gone (an older prompt's cache)."""
        if self._g_start + len(self._g) > keep:
            self._g = self._g[: max(0, keep - self._g_start)]
        if self._g_prev is not None and self._g_prev[0] >= keep:
            self._g_prev = None
        self.truncate(max(keep - 1, 0))
        if keep == 0 or (self._len == keep - 1 and self._g_at(keep - 1) is not None):
            return keep
        return self._len

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        pending = len(tokens) - 1
        g = self._g_at(pending - 1)
        if pending < 1 or self._len != pending - 1 or g is None or max_tokens <= 0:
            return Proposal([])
        token, pos = tokens[-1], pending - 1
        drafts: list[int] = []
        dists: list[npt.NDArray[np.float32]] = []
        history = list(tokens)
        try:
            for _ in range(max_tokens):
                self._decode([(token, pos, g)], logits=True)
                row = logits_row(self.ctx.handle, 0, self.model.n_vocab, self.n_vocab)
                picked = pick_draft(row, history, probs, self.p_min, self.rng)
                if picked is None:
                    break
                token, q = picked
                drafts.append(token)
                history.append(token)
                if q is not None:
                    dists.append(q)
                out = self.ext.llama_get_embeddings_nextn_ith(self.ctx.handle, 0)
                if not out:
                    break
                g = np.ctypeslib.as_array(out, shape=(self.n_embd,)).copy()
                pos += 1
        finally:
            self.truncate(pending)  # the pair at pending-1 is exact; the later ones are guesses
        return Proposal(drafts, np.stack(dists) if dists else None)

    def _decode(self, pairs: list[tuple[int, int, npt.NDArray[np.float32]]], logits: bool) -> None:
        for offset in range(0, len(pairs), self.ctx.n_batch):
            chunk = pairs[offset : offset + self.ctx.n_batch]
            for i, (token, pos, g) in enumerate(chunk):
                self.batch.token(token, pos, logits=logits and i == len(chunk) - 1, h=g)
            try:
                self.batch.run()
            except DraftError:
                self.ctx.truncate(chunk[0][1])  # it may hold part of the chunk
                self._len = min(self._len, chunk[0][1])
                raise
            self._len = max(self._len, chunk[-1][1] + 1)
