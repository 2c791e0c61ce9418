"""One request generating in a slot, as steps the batch loop interleaves with other requests'.

A request goes through its prefill (the prompt in chunks, then its last token alone), its first
token, then draft/verify rounds. The invariant the rounds keep is the one in
:mod:`modelhub.engine.generate`: the slot's KV sequence holds every accepted token except the
last, the *pending* token, which opens the next verification batch ``[pending, d1..dK]``. The
loop asks a request for its rows (:meth:`Generation.prefill_chunk`, :meth:`Generation.plan_round`),
decodes the rows of every request in one ``llama_decode``, then hands each its logits
(:meth:`Generation.after_prefill`, :meth:`Generation.after_round`). Nothing a request does
depends on the others' rows: each sequence has its own KV stream (``llama.LlamaContext``), so
its output is what it would be alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from modelhub.engine.drafting import RequestDrafting
from modelhub.engine.host import EngineHost
from modelhub.engine.members import request_drafters
from modelhub.engine.options import DoneReason, GenerateOptions, GenerateResult, TokenLogprob
from modelhub.engine.sampling import Sampler
from modelhub.engine.shift import follow_shift, keep_count, shift_sequence
from modelhub.engine.slot import Slot
from modelhub.engine.speculative.costs import StepShare
from modelhub.engine.speculative.draft_model import common_prefix
from modelhub.engine.textstream import Committer
from modelhub.engine.vision import ImageSpan, decode_embeddings, reusable
from modelhub.engine.vision_drafting import image_rows_observer, settle_reuse
from modelhub.errors import ModelhubError

Phase = Literal["waiting", "prefill", "decode", "done"]
RowLogits = Callable[[int], npt.NDArray[np.float32]]
OnDone = Callable[[GenerateResult | None, BaseException | None], None]


class Generation:
    """One request: its sampler, stop logic, drafter state, statistics and result."""

    def __init__(
        self,
        engine: EngineHost,
        prompt: list[int],
        options: GenerateOptions,
        sampler: Sampler,
        committer: Committer,
        prediction: list[int] | None,
        on_done: OnDone,
        images: list[ImageSpan] | None = None,
    ) -> None:
        self.engine = engine
        self.prompt = prompt
        self.images = images or []  # the prompt's image spans (``vision``)
        self.options = options
        self.sampler = sampler
        self.committer = committer
        self.prediction = prediction
        self.on_done = on_done
        self.phase: Phase = "waiting"
        # Decodes plainly while a prompt is in the step (``batching``); a fixed draft length
        # (``adaptive`` off) drafts every step, as documented.
        self.yields = engine.cfg.adaptive
        self.slot: Slot | None = None
        self.drafting: RequestDrafting | None = None
        self.k_max = 0
        self.tokens: list[int] = []  # accepted tokens, the pending one last
        self.next_pos = 0  # the next prompt position to prefill
        self.reused = 0
        self.t_start = self.t_prefilled = 0
        self.result: GenerateResult | None = None
        self._checkpoint_ns = 0  # saving the recurrent state before this round's batch
        self.replay_ns = 0  # re-evaluating the last round's accepted tokens (batch loop)

    @property
    def cancelled(self) -> bool:
        return self.committer.cancelled()

    # ---- start ---------------------------------------------------------------------------------
    def start(self, slot: Slot) -> None:
        """Take ``slot``: keep the prefix its cache shares with the prompt, drop the rest."""
        engine, self.slot = self.engine, slot
        slot.busy = True
        members, self.k_max = request_drafters(engine, slot, self.options, self.prediction)
        if members:
            self.drafting = RequestDrafting(
                members,
                engine.controller,
                self.sampler,
                self.options,
                engine.cfg.draft_min,
                self.committer.ending_at,
            )
        prompt = self.prompt
        reuse = min(common_prefix(slot.cached, prompt), len(prompt) - 1)
        reuse = reusable(slot.images, self.images, reuse)
        reuse = engine.rollback.reuse(slot.seq, slot.cached, slot.recurrent, reuse)
        followed = []  # (observer, the position it follows from)
        for observer in slot.observers():
            resume = min(observer.rollback(reuse), reuse)
            if resume < reuse:  # it needs hidden states from earlier positions: replay them
                reuse = engine.rollback.reuse(slot.seq, slot.cached, slot.recurrent, resume)
            followed.append((observer, resume))
        for observer, position in followed:
            if reuse < position:  # the target went back further (a checkpoint, another observer)
                observer.rollback(reuse)
        reuse = settle_reuse(engine.rollback, slot, slot.images, self.images, reuse)
        slot.keep_images(reuse)
        self.reused = self.next_pos = reuse
        self.t_start = time.perf_counter_ns()
        self.phase = "prefill"

    # ---- prefill -------------------------------------------------------------------------------
    def prefill_chunk(self, budget: int) -> list[int]:
        """The next prompt tokens to evaluate, at most ``budget``: everything but the last
        token in chunks, then the last token alone, so its logits (the first generated token)
        come from a one-row evaluation of this sequence whatever was cached."""
        last = len(self.prompt) - 1
        upto = self._prefill_images() if self.images else last
        if self.next_pos < last:
            return self.prompt[self.next_pos : min(self.next_pos + budget, last, upto)]
        return [self.prompt[last]] if budget > 0 else []

    def _prefill_images(self) -> int:
        """Evaluate the images that start at the next prompt position (``vision``); returns
        where the next image starts (or the prompt's length)."""
        slot = self.slot
        assert slot is not None
        for span in self.images:
            if span.start == self.next_pos:
                after = image_rows_observer(slot.observers(), self.prompt, span)
                decode_embeddings(self.engine.ctx, span, slot.seq, after)
                slot.cached.extend(self.prompt[span.start : span.end])
                slot.images.append(span)
                self.next_pos = span.end
        return next((s.start for s in self.images if s.start >= self.next_pos), len(self.prompt))

    def after_prefill(self, chunk: list[int], logits: RowLogits, row: int) -> None:
        """``chunk`` is in the cache; after the last prompt token, emit the first token from
        its logits (``logits(row)``)."""
        assert self.slot is not None
        start = self.next_pos
        self.slot.cached.extend(chunk)
        self.slot.recurrent.decoded(start, len(chunk))
        self.next_pos += len(chunk)
        if self.next_pos == len(self.prompt) - 1:  # where the next turn's prompt may diverge
            self.engine.rollback.keep_prompt(self.slot.seq, self.slot.recurrent, self.next_pos)
        for observer in self.slot.observers():
            observer.observe_target(chunk, start, row - len(chunk) + 1)
        if self.next_pos < len(self.prompt):
            return
        self.t_prefilled = time.perf_counter_ns()
        self._new_result()
        if self.cancelled:
            self.finish("cancel")
            return
        if self.options.num_predict == 0:
            self.finish("length")
            return
        first = self.sampler.sample(logits(row), self.prompt)
        logprob = self._logprob(logits(row), self.prompt, first)
        self.sampler.accept(first)
        self.tokens = [*self.prompt, first]
        if self.drafting is not None:
            self.drafting.begin(self.prompt, self.options.seed)
        self.phase = "decode"
        if not self.committer.commit(first, drafted=False, logprob=logprob):
            self.finish(self.committer.done or "stop")

    def _new_result(self) -> None:
        now = self.t_prefilled or time.perf_counter_ns()
        evaluated = len(self.slot.cached) - self.reused if self.slot is not None else 0
        self.result = GenerateResult(
            tokens=[],
            text="",
            done_reason="stop",
            prompt_eval_count=evaluated,
            prompt_eval_duration_ns=now - (self.t_start or now),
            eval_count=0,
            eval_duration_ns=0,
            drafter=self.drafting.members[0].drafter.kind if self.drafting else None,
        )

    # ---- rounds --------------------------------------------------------------------------------
    def plan_round(self, max_rows: int, share: StepShare | None = None) -> list[int] | None:
        """The rows of this round, ``[pending, drafts...]`` (at most ``max_rows``, in the batch
        step ``share`` describes); None when the request ended instead (cancelled, or the
        context is full and cannot shift)."""
        if self.cancelled:
            self.finish("cancel")
            return None
        if len(self.tokens) - 1 >= self.engine.n_ctx and not self._shift():
            self.finish("length")
            return None
        n_past = len(self.tokens) - 1
        room = self.engine.n_ctx - n_past  # positions left for [pending, drafts...]
        k = min(self.k_max, room - 1, max_rows - 1)
        remaining = self.committer.remaining
        if remaining is not None:
            k = min(k, remaining - 1)
        drafts: list[int] = []
        if self.drafting is not None:
            drafts = self.drafting.plan(self.tokens, k, share)
        t_drafted = time.perf_counter_ns()
        assert self.slot is not None
        self.engine.rollback.before_round(self.slot.seq, self.slot.recurrent, n_past, len(drafts))
        self._checkpoint_ns = time.perf_counter_ns() - t_drafted
        return [self.tokens[-1], *drafts]

    @property
    def _drafts(self) -> list[int]:
        return self.drafting.drafts if self.drafting is not None else []

    def after_round(
        self, logits: RowLogits, first_row: int, decode_ns: int, step_rows: int | None = None
    ) -> None:
        """The round's rows were decoded (taking ``decode_ns`` in a batch step of ``step_rows``
        rows; None: one that evaluated a prompt too): verify, commit, cut the cache back and
        report the round."""
        assert self.slot is not None and self.result is not None
        slot, drafts, tokens = self.slot, self._drafts, self.tokens
        n_past = len(tokens) - 1
        batch = [tokens[-1], *drafts]
        slot.cached.extend(batch)  # the cache now holds the whole batch
        slot.recurrent.decoded(n_past, len(batch))
        for observer in slot.observers():
            observer.observe_target(batch, n_past, first_row)
        t_verify = time.perf_counter_ns()
        new, accepted = self._verify(logits, first_row)
        kept = self._commit(new, accepted, logits, first_row)
        t_done = time.perf_counter_ns()
        for observer in slot.observers():
            observer.rollback(len(tokens) - 1)
        # Cutting a recurrent state back is part of what verification costs.
        verify_ns = decode_ns + t_done - t_verify + self._checkpoint_ns + self.replay_ns
        self.replay_ns = 0
        result = self.result
        if self.drafting is not None:
            if drafts:
                result.draft_count += len(drafts)
                result.draft_accepted_count += min(accepted, kept)
                result.draft_steps += 1
                result.draft_time_ns += self.drafting.t_drafted - self.drafting.t_round
                result.verify_time_ns += verify_ns
            self.drafting.after_round(tokens, kept, accepted, verify_ns, step_rows)
        if self.committer.done is not None:
            self.finish(self.committer.done)

    def _verify(self, logits: RowLogits, first_row: int) -> tuple[list[int], int]:
        """The tokens this round emits and how many of them are accepted drafts. Row i is the
        target's prediction after row i's token; greedy keeps the drafts equal to its choice,
        sampling uses rejection sampling, so the output is the target's own either way."""
        sampler = self.sampler
        if not self._drafts:
            return [sampler.sample(logits(first_row), self.tokens)], 0
        # Under a grammar, row i is judged in the grammar's state after drafts[:i].
        probe = sampler.constraint.clone() if sampler.constraint is not None else None
        try:
            return self._verify_rows(logits, first_row, sampler.with_constraint(probe))
        finally:
            if probe is not None:
                probe.close()

    def _verify_rows(
        self, logits: RowLogits, first_row: int, sampler: Sampler
    ) -> tuple[list[int], int]:
        options, drafts = self.options, self._drafts
        q = self.drafting.q if self.drafting is not None else None
        new: list[int] = []
        history = list(self.tokens)
        for i in range(len(drafts) + 1):
            row = logits(first_row + i)
            if i == len(drafts):
                new.append(sampler.sample(row, history, offset=i))
                break
            draft = drafts[i]
            if sampler.greedy or sampler.coupled or options.sampling_verify == "compare":
                chosen = sampler.sample(row, history, offset=i)
                accepted = chosen == draft
            else:
                p = sampler.probs(row, history)
                accepted, chosen = options.acceptance_rule(
                    p, None if q is None else q[i], draft, sampler.rng
                )
            new.append(chosen)
            if not accepted:
                break
            history.append(draft)
            if sampler.constraint is not None:
                sampler.constraint.accept(draft)
        return new, len(new) - 1

    def _commit(self, new: Sequence[int], accepted: int, logits: RowLogits, first_row: int) -> int:
        """Commit the round's tokens in order (token i is row ``first_row + i``'s) and cut the
        cache back; returns how many."""
        assert self.slot is not None
        slot, tokens = self.slot, self.tokens
        n_past = len(tokens) - 1
        count = 0
        for i, token in enumerate(new):
            count += 1
            logprob = self._logprob(logits(first_row + i), [*tokens, *new[:i]], token)
            self.sampler.accept(token)
            if not self.committer.commit(token, drafted=i < accepted, logprob=logprob):
                break
        tokens.extend(new[:count])
        keep = n_past + count  # pending + the committed tokens except the new pending
        cut = self.engine.rollback.cut_round
        if len(slot.cached) > keep and not cut(slot.seq, slot.cached, slot.recurrent, keep):
            self.engine.ctx.clear_seq(slot.seq)
            slot.reset()
            raise ModelhubError("the target's cache could not be rolled back; it was reset")
        return count

    # ---- context shift -------------------------------------------------------------------------
    def _shift(self) -> bool:
        """The context is full: shift it (:mod:`modelhub.engine.shift`). ``tokens`` and
        ``slot.cached`` lose the same tokens, so positions stay indices and the invariant
        holds. It happens when the sequence reaches ``n_ctx``, whatever was drafted, so a
        greedy output is the same with and without a drafter. False when the request turned
        it off or the memory cannot shift."""
        assert self.slot is not None
        engine, slot = self.engine, self.slot
        if not self.options.shift or slot.images:  # never cut inside an image
            return False
        keep = keep_count(self.options.num_keep, self.prompt, engine.model, engine.n_ctx)
        discard = shift_sequence(engine.ctx, slot, self.tokens, keep)
        if discard == 0:
            return False
        drafting = self.drafting
        members = drafting.members if drafting is not None else []
        for lost in follow_shift(slot, members, self.tokens, keep, discard):
            assert drafting is not None
            drafting.choice.drop(lost)
        return True

    def _logprob(
        self, row: npt.NDArray[np.float32], history: Sequence[int], token: int
    ) -> TokenLogprob | None:
        """``token``'s log-probability at this row (and the best alternatives), from the
        target's distribution: a drafted token's row is the one a plain decode would have."""
        n_top = self.options.top_logprobs
        if n_top is None:
            return None
        lp = self.sampler.log_distribution(row, history)
        alternatives: list[tuple[int, float]] = []
        if n_top > 0:
            best = np.argpartition(-lp, min(n_top, len(lp)) - 1)[:n_top]
            best = best[np.argsort(-lp[best], kind="stable")]
            alternatives = [(int(t), float(lp[t])) for t in best if np.isfinite(lp[t])]
        return TokenLogprob(int(token), float(lp[token]), alternatives)

    # ---- end -----------------------------------------------------------------------------------

    def finish(self, reason: DoneReason) -> None:
        if self.phase == "done":
            return
        if self.result is None:
            self._new_result()
        assert self.result is not None
        result, committer = self.result, self.committer
        result.text = committer.finish()
        result.tokens = committer.generated
        result.eval_count = len(committer.generated)
        start = self.t_prefilled or time.perf_counter_ns()
        result.eval_duration_ns = time.perf_counter_ns() - start
        result.done_reason = reason
        result.stop_sequence = committer.stop_sequence
        if self.drafting is not None:
            self.drafting.report(result)
        self._release()
        self.engine.finished(result)
        self.on_done(result, None)

    def fail(self, error: BaseException) -> None:
        """The request cannot go on: its slot's cache is forgotten (it may be half-updated)."""
        if self.phase == "done":
            return
        if self.slot is not None:
            self.engine.ctx.clear_seq(self.slot.seq)
            self.slot.reset()
        self._release()
        self.on_done(None, error)

    def _release(self) -> None:
        self.phase = "done"
        if self.slot is not None:
            self.slot.busy = False
            self.slot.last_used = time.monotonic()
