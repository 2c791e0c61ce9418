"""Continuous batching: every step decodes the rows of every active request in one llama_decode.

A request waits until a slot is free, then takes the free slot whose cache shares the longest
prefix with its prompt, so a chat's next turn returns to the slot that holds its history; a
prefix that would throw away most of a slot's cache (a shared chat header, a system prompt
before another conversation) does not count, and the least recently used slot is taken
instead. Each step:

1. every decoding request plans its round, ``[pending, drafts...]`` (drafting happens here,
   request by request, and is timed as each one's own cost); its drafts are priced as the
   step they make, with the rows the others planned before it and one row for each after it
   (``StepShare``, ``speculative.adaptive``);
2. prefilling requests fill what is left of the batch with prompt chunks, in arrival order;
   while others are decoding a step takes at most ``prefill_share`` prompt tokens, so a long
   prompt delays running answers by a short chunk per step instead of its whole evaluation;
3. one ``llama_decode`` evaluates all rows; each request reads its logits rows, verifies,
   commits and cuts its sequence back (``sequence.Generation``).

Drafting yields to prompts: while any request is prefilling, the decoding ones decode one row
each and draft nothing, so a new request's prompt chunks and its first token wait behind steps
no longer than plain decoding would make (drafted rows had made the steps a short request waits
through several times longer); the time of a step with prompt rows is no measure of a round,
so no controller records it. Drafting resumes at the first step without a prompt. A fixed draft
length (``draft_adaptive`` false) drafts every step whatever it costs, prompts' waits included.

A request that ends (stop, length, cancel, error) frees its slot at once; the next waiting one
takes it at the next step. Other native work of the engine (the warm-up at load, embeddings)
runs on the same thread between steps (:meth:`BatchLoop.call`): with llama.cpp built with
OpenMP, a second thread calling into it made every decode of the first about 2x slower
(measured 19 vs 8 ms per token), so all of a runner's llama.cpp work comes from one thread.
A failing ``llama_decode`` fails the requests of that step only; the others' caches are cut
back to where the step started them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from modelhub.engine.context import LlamaContext
from modelhub.engine.sequence import Generation
from modelhub.engine.slot import Slot
from modelhub.engine.speculative.costs import StepShare
from modelhub.engine.speculative.draft_model import common_prefix
from modelhub.errors import ModelhubError

log = logging.getLogger("modelhub.engine")
T = TypeVar("T")

# While other requests decode, a step evaluates at most this many prompt tokens (when the
# batch is larger): each running answer waits for one such chunk per step.
PREFILL_SHARE = 128


class BatchLoop:
    """The thread that runs an engine's requests, several at a time."""

    def __init__(self, ctx: LlamaContext, slots: list[Slot]) -> None:
        self.ctx = ctx  # the target's context: every step is one decode of it
        self.slots = slots
        self.prefill_share = max(1, min(PREFILL_SHARE, ctx.n_batch))
        self.waiting: collections.deque[Generation] = collections.deque()
        self.active: list[Generation] = []
        self._calls: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def counts(self) -> tuple[int, int]:
        """(active, waiting) requests."""
        with self._cond:
            return len(self.active), len(self.waiting)

    def submit(self, gen: Generation) -> None:
        with self._cond:
            self._open()
            self.waiting.append(gen)
            self._cond.notify()

    def call(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the loop's thread, between steps, and return what it returns (or
        raise what it raises)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            self._open()
            self._calls.append((work, future))
            self._cond.notify()
        return future.result()

    def _open(self) -> None:
        """Refuse work once closed; start the thread on first use (caller holds the lock)."""
        if self._closed:
            raise ModelhubError("the engine is closed")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="batch", daemon=True)
            self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # ---- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self.waiting or self.active or self._calls):
                    self._cond.wait()
                if self._closed:
                    pending = [*self.active, *self.waiting]
                    self.active, self.waiting = [], collections.deque()
                    calls, self._calls = self._calls, []
                    break
                calls, self._calls = self._calls, []
            for work, future in calls:
                try:
                    future.set_result(work())
                except BaseException as exc:
                    future.set_exception(exc)
            with self._cond:
                self._admit()
            try:
                self._step()
            except Exception as exc:  # a bug, not a request's fault: fail them, keep serving
                log.exception("batch step failed")
                for gen in self.active:
                    gen.fail(exc)
            with self._cond:
                self.active = [g for g in self.active if g.phase != "done"]
        for gen in pending:
            gen.fail(ModelhubError("the model was unloaded while the request ran"))
        for _work, future in calls:
            future.set_exception(ModelhubError("the engine is closed"))

    def _admit(self) -> None:
        """Move waiting requests into free slots (caller holds the lock)."""
        while self.waiting:
            gen = self.waiting[0]
            if gen.cancelled:  # hung up while queued: never takes a slot
                self.waiting.popleft()
                gen.finish("cancel")  # nothing was evaluated
                continue
            free = [s for s in self.slots if not s.busy]
            if not free:
                return
            self.waiting.popleft()
            slot = max(free, key=lambda s: (_reuse(s, gen.prompt), -s.last_used))
            try:
                gen.start(slot)
            except Exception as exc:
                gen.fail(exc)
                continue
            self.active.append(gen)

    def _step(self) -> None:
        ctx = self.ctx
        n_batch = ctx.n_batch
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[int] = []
        outputs: list[bool] = []
        rounds: list[tuple[Generation, int]] = []  # (request, its first row)
        chunks: list[tuple[Generation, list[int], int]] = []  # (request, chunk, its last row)

        decoding = [g for g in self.active if g.phase == "decode"]
        # A prompt in the step: decode plainly (one row each) and let it through sooner.
        prompt = any(g.phase == "prefill" and not g.cancelled for g in self.active)
        per_request = max(1, n_batch // max(1, len(decoding)))
        for i, gen in enumerate(decoding):
            yields = prompt and gen.yields
            share = StepShare(len(decoding), len(tokens) + len(decoding) - i - 1, yields)
            rows = self._guard(gen, gen.plan_round, 1 if yields else per_request, share)
            if not rows:
                continue
            assert gen.slot is not None
            first = len(tokens)
            start = len(gen.tokens) - 1
            tokens.extend(rows)
            positions.extend(range(start, start + len(rows)))
            seqs.extend([gen.slot.seq] * len(rows))
            outputs.extend([len(rows) > 1] * (len(rows) - 1) + [True])
            rounds.append((gen, first))

        budget = n_batch - len(tokens)
        if rounds:
            budget = min(budget, self.prefill_share)
        for gen in [g for g in self.active if g.phase == "prefill"]:
            if gen.cancelled:
                self._guard(gen, gen.finish, "cancel")
                continue
            chunk = gen.prefill_chunk(budget)
            if not chunk:
                continue
            assert gen.slot is not None
            last_prompt_token = gen.next_pos + len(chunk) == len(gen.prompt)
            tokens.extend(chunk)
            positions.extend(range(gen.next_pos, gen.next_pos + len(chunk)))
            seqs.extend([gen.slot.seq] * len(chunk))
            outputs.extend([False] * (len(chunk) - 1) + [last_prompt_token])
            chunks.append((gen, chunk, len(tokens) - 1))
            budget -= len(chunk)
            if budget <= 0:
                break
        if not tokens:
            return

        t0 = time.perf_counter_ns()
        try:
            ctx.decode_rows(tokens, positions, seqs, outputs)
        except ModelhubError as exc:
            for failed in [r[0] for r in rounds] + [c[0] for c in chunks]:
                failed.fail(exc)
            return
        decode_ns = time.perf_counter_ns() - t0
        logits = ctx.row_logits
        for gen, chunk, last_row in chunks:
            self._guard(gen, gen.after_prefill, chunk, logits, last_row)
        step_rows = None if chunks else len(tokens)  # prompt rows: no measure of a round
        for gen, first in rounds:
            self._guard(gen, gen.after_round, logits, first, decode_ns, step_rows)
        self._replay([gen for gen, _ in rounds])

    def _replay(self, gens: list[Generation]) -> None:
        """Evaluate again the accepted tokens of rounds cut back to a checkpoint (recurrent
        targets, see ``rollback``), all in one decode, now that every request of the step has
        read its rows. Its time is charged to those requests' next rounds."""
        todo = [g for g in gens if g.slot is not None and g.slot.recurrent.replay is not None]
        if not todo:
            return
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[int] = []
        for gen in todo:
            assert gen.slot is not None and gen.slot.recurrent.replay is not None
            pos, replay = gen.slot.recurrent.replay
            tokens.extend(replay)
            positions.extend(range(pos, pos + len(replay)))
            seqs.extend([gen.slot.seq] * len(replay))
        t0 = time.perf_counter_ns()
        try:
            self.ctx.decode_rows(tokens, positions, seqs, [False] * len(tokens))
            error: ModelhubError | None = None
        except ModelhubError as exc:
            error = exc
        share = (time.perf_counter_ns() - t0) // len(todo)
        for gen in todo:
            slot = gen.slot
            assert slot is not None and slot.recurrent.replay is not None
            pos, replay = slot.recurrent.replay
            slot.recurrent.replay = None
            if error is not None:
                self.ctx.clear_seq(slot.seq)
                slot.reset()
                if gen.phase != "done":
                    gen.fail(error)
                continue
            slot.cached.extend(replay)
            slot.recurrent.decoded(pos, len(replay))
            gen.replay_ns += share

    @staticmethod
    def _guard(gen: Generation, work: Callable[..., T], *args: Any) -> T | None:
        """Run one request's part of a step; an error fails that request only."""
        try:
            return work(*args)
        except Exception as exc:
            gen.fail(exc)
            return None


def _reuse(slot: Slot, prompt: list[int]) -> int:
    """How many cached tokens of ``slot`` the prompt would reuse; 0 when that would discard
    more than half of what the slot holds (another conversation's history)."""
    shared = common_prefix(slot.cached, prompt)
    return shared if 2 * shared >= len(slot.cached) else 0
