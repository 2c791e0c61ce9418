"""Cutting a sequence back on targets whose memory keeps recurrent state (Mamba, RWKV, and
hybrids such as Qwen 3.5/3.6 with gated delta-net layers beside attention).

An attention cache drops positions at will; a recurrent state holds only "after the last
token", so a partly rejected draft cannot simply be cut off. Two ways back, chosen per round:

- **snapshots** (llama.cpp's ``n_rs_seq``, for the architectures it supports): the context
  keeps the state after each of the last ``n_rs_seq`` + 1 tokens of a decode, so cutting back up
  to ``n_rs_seq`` tokens of the batch just decoded is an index change. Costs memory (the state
  ``n_rs_seq`` + 1 times) and a little per decode; the engine asks for the draft bound, at most
  :data:`MAX_SNAPSHOTS`.
- **checkpoints**: before a verification batch the sequence's recurrent state is copied; when
  the batch is cut back, the copy goes back in, the attention cache is cut, and the accepted
  tokens are evaluated again (:attr:`Slot.replay`, run by the batch loop after every request
  of the step has read its rows, in one decode for all of them).

Both give the state a plain decode of the accepted tokens gives, so greedy output stays the
target's own (measured bit for bit on the synthetic fixtures: the recurrent kernels evaluate a
batch token by token). The time either costs counts as the round's verification cost, so the
adaptive controller stops drafting where it cannot pay.

A changed prompt reuses the cache through prompt checkpoints: the state before a prompt's last
token is kept (the :data:`PROMPT_CHECKPOINTS` newest per sequence); a later prompt that shares
at least that prefix restarts from it instead of from nothing.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from modelhub.engine.context import LlamaContext

# Snapshots asked of llama.cpp: the recurrent state is kept this many times more per
# sequence, so it is bounded (a Qwen 3.6 27B state is about 150 MB).
MAX_SNAPSHOTS = 8
PROMPT_CHECKPOINTS = 3


@dataclass
class Checkpoint:
    """A sequence's recurrent state after its first ``pos`` cached tokens."""

    pos: int
    state: ctypes.Array[ctypes.c_uint8]


@dataclass
class RecurrentState:
    """What a slot keeps to go back on a recurrent target."""

    prompts: list[Checkpoint] = field(default_factory=list)  # oldest first
    round: Checkpoint | None = None  # before the verification batch in flight
    replay: tuple[int, list[int]] | None = None  # (position, tokens) to evaluate again
    # Positions [start, end) of the sequence's last decode, while its snapshots are valid:
    # llama.cpp keeps the state after each of those tokens only, and does not check it (a
    # cut further back is accepted and leaves a wrong state).
    span: tuple[int, int] | None = None

    def decoded(self, start: int, n: int) -> None:
        self.span = (start, start + n)

    def forget_after(self, n: int) -> None:
        """The cache was cut to ``n`` tokens: later checkpoints describe another sequence."""
        self.prompts = [c for c in self.prompts if c.pos <= n]
        if self.round is not None and self.round.pos > n:
            self.round = None
        self.span = None


class Rollback:
    """How an engine's context cuts its sequences back."""

    def __init__(self, ctx: LlamaContext, recurrent: bool) -> None:
        self.ctx = ctx
        self.recurrent = recurrent
        self.snapshots = ctx.n_rs_seq if recurrent else 0
        self.restores = 0  # checkpoints put back (a statistic: benchmarks and tests read it)

    def mode(self, n_drafts: int) -> str:
        """How a round with ``n_drafts`` drafts is cut back: "cache", "snapshots" or
        "checkpoint"."""
        if not self.recurrent:
            return "cache"
        return "snapshots" if n_drafts <= self.snapshots else "checkpoint"

    def before_round(self, seq: int, state: RecurrentState, n_past: int, n_drafts: int) -> None:
        """Keep what cutting this round back will need (a copy of the state, when the
        snapshots do not reach)."""
        state.round = None
        if n_drafts > 0 and self.mode(n_drafts) == "checkpoint":
            state.round = Checkpoint(n_past, self.ctx.save_state(seq))

    def cut_round(self, seq: int, cached: list[int], state: RecurrentState, keep: int) -> bool:
        """Cut the round just decoded back to ``keep`` cached tokens. With a checkpoint the
        state goes back to the round's start and the accepted tokens wait in ``state.replay``
        (``cached`` then ends at the round's start). False when nothing worked (the caller
        resets the sequence)."""
        if self._cut_in_place(seq, cached, state, keep):
            return True
        ckpt = state.round
        if ckpt is None or ckpt.pos > keep or not self._restore(seq, ckpt):
            return False
        state.replay = (ckpt.pos, cached[ckpt.pos : keep])
        del cached[ckpt.pos :]
        state.forget_after(ckpt.pos)
        return True

    def keep_prompt(self, seq: int, state: RecurrentState, pos: int) -> None:
        """Checkpoint the state after ``pos`` prompt tokens (recurrent targets only)."""
        if not self.recurrent or any(c.pos == pos for c in state.prompts):
            return
        state.prompts.append(Checkpoint(pos, self.ctx.save_state(seq)))
        del state.prompts[:-PROMPT_CHECKPOINTS]

    def reuse(self, seq: int, cached: list[int], state: RecurrentState, want: int) -> int:
        """Cut the cache back to at most ``want`` tokens, keeping as many as possible; returns
        how many it keeps (0: the sequence was cleared)."""
        if want >= len(cached):
            return len(cached)
        if self._cut_in_place(seq, cached, state, want):
            return want
        for ckpt in reversed(state.prompts):
            if ckpt.pos <= want and self._restore(seq, ckpt):
                del cached[ckpt.pos :]
                state.forget_after(ckpt.pos)
                return ckpt.pos
        self.ctx.clear_seq(seq)
        cached.clear()
        state.forget_after(0)
        return 0

    def _cut_in_place(self, seq: int, cached: list[int], state: RecurrentState, keep: int) -> bool:
        """Cut without a checkpoint: any attention cache; a recurrent one only within the
        snapshots of its last decode."""
        if self.recurrent:
            span = state.span
            if span is None or span[1] != len(cached) or not span[0] < keep:
                return False
            if len(cached) - keep > self.snapshots:
                return False
        if not self.ctx.truncate(keep, seq):
            return False
        del cached[keep:]
        state.forget_after(keep)
        return True

    def _restore(self, seq: int, ckpt: Checkpoint) -> bool:
        self.restores += 1
        return self.ctx.load_state(seq, ckpt.state) and self.ctx.truncate(ckpt.pos, seq)
