"""One request's drafting: its drafters, which of them drafts each round, and what it measured.

:class:`RequestDrafting` is what :class:`~modelhub.engine.sequence.Generation` asks for a
round's drafts and tells what the round kept. It holds the request's drafters (one, or the
candidates of ``DRAFT auto``: :mod:`modelhub.engine.speculative.choice`), proposes under the
request's sampler (greedy, rejection sampling or coupled draws, a grammar cutting drafts it
forbids), reports each round to the controller of the drafter that drafted it, and counts what
a user is shown: drafts and acceptances per draft position, the drafter that guessed the most,
and the plain-decoding time the controller predicts for the same tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from modelhub.engine.sampling import Sampler, TokenConstraint
from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.base import ProbabilityFn
from modelhub.engine.speculative.choice import DraftChoice, Member, load_bucket
from modelhub.engine.speculative.costs import StepShare
from modelhub.engine.speculative.factory import Seeded

if TYPE_CHECKING:
    from modelhub.engine.options import GenerateOptions, GenerateResult

# (member name, request class, batch load, bound) -> that drafter's controller
ControllerSource = Callable[[str, str, int, int], AdaptiveDraftLength]


class RequestDrafting:
    """The drafting state of one request (see the module docstring)."""

    def __init__(
        self,
        members: list[Member],
        controllers: ControllerSource,
        sampler: Sampler,
        options: GenerateOptions,
        draft_min: int,
        ending_at: Callable[[list[int]], int | None] = lambda drafts: None,
    ) -> None:
        self.choice = DraftChoice(members)
        # The first guess that would end the answer (``Committer.ending_at``): none from it on
        # is verified.
        self.ending_at = ending_at
        self._controllers = controllers
        self.sampler = sampler
        self.options = options
        self.draft_min = draft_min
        self.klass = "grammar" if sampler.constraint is not None else "plain"
        self.load = 1  # the batch load bucket of the round in flight
        self.others = 0  # the other requests decoding in its step
        self.base_rows = 0  # the rows of its step besides its own
        # The round in flight.
        self.member: Member | None = None
        self.controller: AdaptiveDraftLength | None = None
        self.k = 0
        self.drafts: list[int] = []
        self.q: npt.NDArray[np.float32] | None = None
        self.t_round = self._t_prep = self.t_drafted = 0
        # What the request is shown.
        self.count_by_position: list[int] = []
        self.accepted_by_position: list[int] = []
        self.drafted_by: dict[str, int] = {}
        self.plain_estimate_s = 0.0  # predicted plain-decoding time of the emitted tokens

    @property
    def members(self) -> list[Member]:
        return self.choice.members

    def controller_of(self, member: Member) -> AdaptiveDraftLength:
        controller = self._controllers(member.name, self.klass, self.load, member.max_k)
        controller.others, controller.base_rows = self.others, self.base_rows
        controller.cost_prior = member.cost_prior
        return controller

    def begin(self, prompt: Sequence[int], seed: int | None) -> None:
        for member in self.members:
            if isinstance(member.drafter, Seeded):
                member.drafter.reseed(None if seed is None or seed < 0 else seed + 1)
            member.drafter.begin(prompt)

    # ---- a round -----------------------------------------------------------------------------
    def plan(self, tokens: list[int], k_cap: int, share: StepShare | None = None) -> list[int]:
        """This round's drafts (at most ``k_cap``) by the drafter expected to pay most, priced
        as the batch step ``share`` describes. No drafts while the step evaluates a prompt:
        they would lengthen the step that prompt waits for, so the round decodes plainly and
        no drafter is asked (nor charged for a round it did not choose)."""
        share = share or StepShare()
        self.t_round = self._t_prep = time.perf_counter_ns()
        self.load, self.others = load_bucket(share.decoding), max(0, share.decoding - 1)
        self.base_rows = share.other_rows
        self.member, self.controller, self.k, self.drafts, self.q = None, None, 0, [], None
        if self.members and not share.prompt:
            self._choose(tokens, k_cap)
        self.t_drafted = time.perf_counter_ns()
        return self.drafts

    def _choose(self, tokens: list[int], k_cap: int) -> None:
        model = self.choice.model(self.controller_of)
        model_rate = self.controller_of(model).best_rate() if model is not None else None
        for member in self.choice.rated:  # cheap to ask: they price every guess
            controller = self.controller_of(member)
            k = min(k_cap, member.max_k)
            self.member, self.controller, self.k = member, controller, k
            if k > 0:
                self._propose(member, controller, tokens, k)
            rate = controller.last_cut_rate or 0.0
            if self.drafts and (model_rate is None or rate >= model_rate):
                return
            self.drafts, self.q = [], None
        if model is not None:
            controller = self.controller_of(model)
            k = min(controller.next_k(), k_cap, model.max_k)
            self.member, self.controller, self.k = model, controller, max(k, 0)
            if k > 0:
                self._propose(model, controller, tokens, k)

    def _propose(
        self, member: Member, controller: AdaptiveDraftLength, tokens: list[int], k: int
    ) -> None:
        """Up to ``k`` drafts (none when fewer than ``draft_min`` are left) and their draft
        distributions if the drafter gave them."""
        drafter = member.drafter
        if member.prepare is not None:
            member.prepare(tokens)
        self._t_prep = time.perf_counter_ns()
        sampler = self.sampler
        probs: ProbabilityFn | None = sampler.probs
        if sampler.greedy or self.options.sampling_verify == "compare":
            probs = None
        elif sampler.coupled:  # the draft model draws with the target's noise: often the same
            probs = sampler.coupled_probs(sampler.emitted, len(tokens))
        proposal = drafter.propose(tokens, k, probs)
        drafts = [int(t) for t in proposal.tokens[:k]]
        # Guesses stop before one that would end the answer (an end of generation, a stop
        # string): the round's own token after the last kept guess ends it just the same, and
        # no guess after it can be kept. Not for guesses drawn from q and verified against it:
        # whether a position is verified must not depend on what was drawn there, or the output
        # would no longer follow the target's p.
        if proposal.probs is None or sampler.greedy or sampler.coupled:
            end = self.ending_at(drafts)
            drafts = drafts if end is None else drafts[:end]
        if proposal.confidence is not None:
            drafts = drafts[: controller.cut(proposal.confidence[: len(drafts)])]
        q = proposal.probs[: len(drafts)] if proposal.probs is not None else None
        if sampler.coupled:
            q = None  # verified by equality with the target's own draw
        if sampler.constraint is not None and q is None:
            drafts = _allowed_prefix(sampler.constraint, drafts)
        if len(drafts) < max(1, self.draft_min):
            drafts, q = [], None
        self.drafts, self.q = drafts, q

    def after_round(
        self,
        tokens: Sequence[int],
        emitted: int,
        accepted: int,
        verify_ns: int,
        step_rows: int | None = None,
    ) -> None:
        """Verification accepted ``accepted`` drafts and the request emitted ``emitted`` tokens
        (fewer when it stopped inside the round), the rows taking ``verify_ns`` to decode and
        check in a step of ``step_rows`` rows (None: the step evaluated a prompt too, so its
        time is no measure of a round): every drafter learns what was kept, the round's
        drafter's controller what it cost."""
        for member in self.members:
            member.drafter.commit(tokens)
        drafts = self.drafts
        for i in range(len(drafts)):
            if i == len(self.count_by_position):
                self.count_by_position.append(0)
                self.accepted_by_position.append(0)
            self.count_by_position[i] += 1
            self.accepted_by_position[i] += int(i < min(accepted, emitted))
        if drafts and self.member is not None:
            name = self.member.name
            self.drafted_by[name] = self.drafted_by.get(name, 0) + len(drafts)
        controller = self.controller
        yardstick = controller
        if yardstick is None and self.members:  # a round that yielded to a prompt
            yardstick = self.controller_of(self.members[0])
        if yardstick is not None:
            plain = yardstick.verify_cost(self.others + 1)  # the step if nobody drafted
            if plain is not None:
                self.plain_estimate_s += emitted * plain
        if controller is None or step_rows is None:
            return
        controller.base_rows = step_rows - len(drafts) - 1
        controller.record(
            self.k,
            len(drafts),
            accepted,
            draft_seconds=(self.t_drafted - self._t_prep) / 1e9,
            verify_seconds=verify_ns / 1e9,
            prepare_seconds=(self._t_prep - self.t_round) / 1e9,
        )

    def report(self, result: GenerateResult) -> None:
        """Put the request's drafting figures into its result."""
        result.draft_count_by_position = list(self.count_by_position)
        result.draft_accepted_by_position = list(self.accepted_by_position)
        if self.drafted_by:
            name = max(self.drafted_by, key=lambda n: self.drafted_by[n])
            member = next((m for m in self.members if m.name == name), None)
            result.drafter_name = name
            if member is not None:
                result.drafter = member.drafter.kind
        if result.eval_duration_ns > 0 and self.plain_estimate_s > 0:
            result.plain_estimate_ns = int(self.plain_estimate_s * 1e9)


def _allowed_prefix(constraint: TokenConstraint, drafts: list[int]) -> list[int]:
    """The drafts up to the first one the grammar forbids (judged in the state the drafts
    before it lead to). For drafts without a distribution this cut is what verification would
    do anyway (a forbidden token is never the target's choice), so it changes nothing but the
    rows spent on it."""
    probe = constraint.clone()
    try:
        for i, token in enumerate(drafts):
            if not probe.allows(token):
                return drafts[:i]
            probe.accept(token)
        return drafts
    finally:
        probe.close()
