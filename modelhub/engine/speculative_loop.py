"""One request's draft/verify rounds, after the first token (the invariant they keep is in
:mod:`modelhub.engine.generate`).

A round asks the request's drafter for up to K tokens, decodes ``[pending, d1..dK]`` on the
target in one batch and decides which tokens to emit (:func:`verify_round`), commits them one by
one and cuts the caches back to what was committed (:func:`commit_round`), then reports the
round to the drafter, the request's statistics and the adaptive K controller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from modelhub.engine.options import GenerateOptions, GenerateResult
from modelhub.engine.sampling import Sampler
from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.factory import Preparing, TargetObserver
from modelhub.engine.textstream import Committer
from modelhub.errors import ModelhubError

if TYPE_CHECKING:
    from modelhub.engine.generate import Engine


@dataclass
class Round:
    """What one draft/verify round produced."""

    new: list[int]
    proposed: int
    accepted: int


def run_loop(
    engine: Engine,
    tokens: list[int],
    sampler: Sampler,
    committer: Committer,
    drafter: Drafter | None,
    controller: AdaptiveDraftLength | None,
    k_max: int,
    options: GenerateOptions,
    result: GenerateResult,
) -> None:
    """Run rounds until the committer is done, the context is full or the request cancelled."""
    while True:
        if committer.cancelled():
            committer.done = "cancel"
            return
        n_past = len(tokens) - 1
        room = engine.n_ctx - n_past  # positions left for [pending, drafts...]
        if room < 1:
            committer.done = "length"
            return
        k = controller.next_k() if controller is not None else 0
        remaining = committer.remaining
        k = min(k, k_max, room - 1, engine.ctx.n_batch - 1)
        if remaining is not None:
            k = min(k, remaining - 1)
        k = max(k, 0)

        t0 = time.perf_counter_ns()
        drafts: list[int] = []
        q: npt.NDArray[np.float32] | None = None
        t_prep = t0
        if drafter is not None and k > 0:
            drafts, q, t_prep = _propose(
                drafter, controller, tokens, k, sampler, options, engine.cfg.draft_min
            )
        t1 = time.perf_counter_ns()

        rnd = verify_round(engine, tokens, drafts, q, sampler, options)
        t2 = time.perf_counter_ns()
        kept = commit_round(engine, tokens, rnd, committer, sampler)

        if isinstance(engine.drafter, TargetObserver):
            engine.drafter.rollback(len(tokens) - 1)
        if drafter is not None:
            drafter.commit(tokens)
        if drafts:
            result.draft_count += rnd.proposed
            result.draft_accepted_count += min(rnd.accepted, kept)
            result.draft_steps += 1
            result.draft_time_ns += t1 - t0
            result.verify_time_ns += t2 - t1
        if controller is not None:
            controller.record(
                k,
                len(drafts),
                rnd.accepted,
                draft_seconds=(t1 - t_prep) / 1e9,
                verify_seconds=(t2 - t1) / 1e9,
                prepare_seconds=(t_prep - t0) / 1e9,
            )
        if committer.done is not None:
            return


def _propose(
    drafter: Drafter,
    controller: AdaptiveDraftLength | None,
    tokens: list[int],
    k: int,
    sampler: Sampler,
    options: GenerateOptions,
    draft_min: int,
) -> tuple[list[int], npt.NDArray[np.float32] | None, int]:
    """Up to ``k`` drafts after ``tokens`` (none when fewer than ``draft_min`` are left), their
    draft distributions if the drafter gave them, and when preparing the drafter ended."""
    if isinstance(drafter, Preparing):
        drafter.prepare(tokens)
    t_prep = time.perf_counter_ns()
    deterministic = sampler.greedy or options.sampling_verify == "compare"
    probs = None if deterministic else sampler.probs
    proposal = drafter.propose(tokens, k, probs)
    drafts = [int(t) for t in proposal.tokens[:k]]
    q: npt.NDArray[np.float32] | None = None
    if proposal.confidence is not None and controller is not None:
        drafts = drafts[: controller.cut(proposal.confidence[: len(drafts)])]
    if proposal.probs is not None:
        q = proposal.probs[: len(drafts)]
    if len(drafts) < max(1, draft_min):
        drafts, q = [], None
    return drafts, q, t_prep


def verify_round(
    engine: Engine,
    tokens: list[int],
    drafts: list[int],
    q: npt.NDArray[np.float32] | None,
    sampler: Sampler,
    options: GenerateOptions,
) -> Round:
    """Decode ``[pending] + drafts`` in one batch and decide which tokens to emit."""
    n_past = len(tokens) - 1
    batch = [tokens[-1], *drafts]
    engine.ctx.decode(batch, n_past, "all" if drafts else "last")
    engine.cached.extend(batch)  # the cache now holds the whole batch
    if isinstance(engine.drafter, TargetObserver):
        engine.drafter.observe_target(batch, n_past)
    if not drafts:
        return Round([sampler.sample(engine.ctx.last_logits(), tokens)], 0, 0)
    rows = engine.ctx.logits()
    new: list[int] = []
    history = list(tokens)
    for i in range(len(drafts) + 1):
        row = rows[i]
        if i == len(drafts):
            new.append(sampler.sample(row, history))
            break
        draft = drafts[i]
        if sampler.greedy or options.sampling_verify == "compare":
            chosen = sampler.sample(row, history)
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
    return Round(new, len(drafts), len(new) - 1)


def commit_round(
    engine: Engine, tokens: list[int], rnd: Round, committer: Committer, sampler: Sampler
) -> int:
    """Commit the round's tokens in order and cut the caches back; returns how many."""
    n_past = len(tokens) - 1
    count = 0
    for i, token in enumerate(rnd.new):
        count += 1
        sampler.accept(token)
        if not committer.commit(token, drafted=i < rnd.accepted):
            break
    tokens.extend(rnd.new[:count])
    # Keep pending + the committed tokens except the new pending (the last one).
    keep = n_past + count
    if len(engine.cached) > keep:
        if not engine.ctx.truncate(keep):
            engine.ctx.clear()
            engine.cached = []
            raise ModelhubError("the target's cache could not be rolled back; it was reset")
        del engine.cached[keep:]
    return count
