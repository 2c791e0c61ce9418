"""Choosing the draft length K from measured costs and acceptance (SPEC-10).

Each round the engine reports how many tokens it asked for, how many the drafter proposed, how
many were accepted, and how long drafting and verification took. From that the controller keeps:

- ``verify cost``: seconds of a decode step of n rows, per n (EWMA), interpolated between the
  n values measured and extrapolated linearly beyond them (where the two widest measured are
  one and two rows, by the prior curve from the one-row cost: ``costs.estimate``); alone, n is
  the round's own rows;
- ``draft cost``: seconds per proposed draft token (EWMA);
- ``acceptance`` a: the per-draft probability of being kept, estimated as if acceptance were
  geometric (a round that keeps j of k drafts contributes j successes and one failure if j < k),
  with exponential forgetting.

The expected number of tokens a round emits with K drafts is (1 - a^(K+1)) / (1 - a), so the
rate for K is that over ``K * draft + verify(K + 1)`` (before a guess is measured, a draft
model's cost is taken from its size against the target's: ``cost_prior``); K = 0 is plain
decoding at ``1 / verify(1)``. In a batch a round shares its step with other requests' rows
(``base_rows``), so it is priced as the step it makes: K drafts cost ``verify(base_rows + K +
1)``, each step's time is recorded under the step's total rows (a round's own row count would
mix in whatever the others drafted, and a table where more rows cost nothing more makes drafts
look free), and the tokens the other requests emit in that step (``others``) count too: drafts
that slow everyone's step pay only when they bring more than the rest of the batch loses.
Steps that evaluate a prompt are not rounds of this kind: the batch loop decodes plainly then
and records nothing (``engine.batching``). The controller picks the best K;
when no K beats plain decoding it stops drafting and re-probes now and then, spending at most a
few percent of the time on probes. A probe that keeps every guess is followed at once by one
twice as wide (one that keeps fewer starts the next, after the usual wait, at what it kept):
where a second row doubles a step (a CPU's matrix-vector kernels giving way to matrix ones)
one-guess probes price a drafter at its worst width, and after one unlucky round even a
near-perfect drafter took six probes, spaced out, to resume.

A drafter that rates each of its tokens (``Proposal.confidence``, e.g. n-gram drafts, whose
quality depends on how long a match they come from) is asked for ``max_k`` tokens every round
and :meth:`AdaptiveDraftLength.cut` keeps the prefix with the best expected rate, using those
per-token estimates in place of the single acceptance figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from modelhub.engine.speculative import costs
from modelhub.engine.speculative.costs import PRIOR_ROW_SLOPE, Ewma, VerifyCosts

# A plain round must lose by this factor before the controller prefers drafting; avoids
# flapping where the two are within measurement noise.
_MARGIN = 1.03
# At most this share of plain-decoding time is spent on probes while drafting is off.
_PROBE_BUDGET = 0.03
# A first probe drafts this many tokens: enough to measure acceptance, cheap when it fails.
# Later ones widen while they keep every guess (see the module docstring).
_PROBE_LENGTH = 1
# "Could drafting ever pay?" is asked at this acceptance.
_OPTIMISTIC_ACCEPTANCE = 0.95
# While drafting, every this many rounds try one draft more than the current choice.
_EXPLORE_EVERY = 8
# Until this many rounds have verified drafts, keep probing at the shortest interval.
_MIN_EVIDENCE = 4
# Weight of a verify time below the running estimate (see Ewma.down_alpha).
_DOWN_ALPHA = 0.6
# While a model drafter keeps drafting, one round in this many decodes plainly: plain decoding
# is the yardstick of every choice, and an estimate of it inflated by a stall would otherwise
# never be measured again (a drafting round does not measure it).
_PLAIN_EVERY = 32
# A rated drafter's guesses that measured costs rule out are verified anyway after this many
# rounds without drafts (then twice as many, ...): rarely enough that a text the drafter
# cannot predict loses little, often enough that one slow measurement does not stick.
_RATED_PROBE_AFTER = 32


class AdaptiveDraftLength:
    """Picks K in ``0..max_k`` per round; ``adaptive=False`` always answers ``max_k``."""

    def __init__(
        self,
        max_k: int,
        *,
        verify: VerifyCosts | None = None,
        adaptive: bool = True,
        cost_alpha: float = 0.3,
        acceptance_decay: float = 0.92,
        prior_acceptance: float = 0.5,
        min_probe_interval: int = 4,
        max_probe_interval: int = 512,
    ) -> None:
        self.max_k = max(0, max_k)
        self.adaptive = adaptive
        self._cost_alpha = cost_alpha
        self._verify: VerifyCosts = {} if verify is None else verify
        self._priced: dict[int, float | None] = {}  # verify_cost's answers at _priced_at
        self._priced_at = -1
        self._draft = Ewma(cost_alpha)
        self._decay = acceptance_decay
        # The prior is one pseudo-trial; it fades with the evidence like any old round.
        self._prior = prior_acceptance
        self._acc_hits = prior_acceptance
        self._acc_trials = 1.0
        self._min_probe = min_probe_interval
        self._max_probe = max_probe_interval
        self._plain_rounds = 0  # consecutive rounds without drafting
        self._undrafted = 0  # consecutive rounds that verified no draft (rated drafters too)
        self._rated_backoff = _RATED_PROBE_AFTER  # rounds without drafts before cut() probes
        self._probe_width = _PROBE_LENGTH  # guesses of the next probe
        self._probing = False  # the round in flight is a probe
        self._probe_again = False  # the last probe kept every guess: the next one follows it
        self._rounds = 0
        self._last_requested = -1  # K of the previous round (-1: none yet)
        self._draft_rounds = 0  # rounds that verified drafts (evidence, never decayed)
        self._catch_up = Ewma(cost_alpha)  # a drafter's catch-up before a probe, seconds
        self._rated = False  # the drafter rates its tokens: cut() decides, next_k() asks max_k
        self.last_cut_rate: float | None = None  # expected tokens/s of the last cut() prefix
        # A guess's cost in one-row target steps until one is measured (None: unknown, taken
        # as free so that the drafter is tried); see ``draft_cost``.
        self.cost_prior: float | None = None
        # Tokens the other requests in the batch emit per step, and the rows of that step
        # besides this request's own (set before each decision and each record).
        self.others = 0
        self.base_rows = 0

    # ---- estimates -------------------------------------------------------------------------
    @property
    def acceptance(self) -> float:
        """Smoothed per-draft acceptance (recent rounds weigh most; starts at the prior)."""
        return self._acc_hits / self._acc_trials if self._acc_trials > 0 else self._prior

    def verify_cost(self, rows: int) -> float | None:
        """Estimated seconds of a step of ``rows`` rows (None until anything was measured):
        :func:`costs.estimate`, kept until an estimate changes (for rated drafters
        ``record`` also keeps the table in order, the freshest measurement winning)."""
        if self._priced_at != costs.generation():
            self._priced.clear()
            self._priced_at = costs.generation()
        if rows not in self._priced:
            self._priced[rows] = costs.estimate(self._verify, rows)
        return self._priced[rows]

    def expected_tokens(self, k: int, acceptance: float | None = None) -> float:
        a = self.acceptance if acceptance is None else acceptance
        if a >= 1.0 - 1e-12:
            return float(k + 1)
        return (1.0 - a ** (k + 1)) / (1.0 - a)

    def step_cost(self, k: int) -> float | None:
        """Estimated seconds of the step this request's round makes with ``k`` drafts."""
        return self.verify_cost(self.base_rows + k + 1)

    @property
    def _plain_measured(self) -> bool:
        """A step of at most this request's plain width was measured."""
        return any(n <= self.base_rows + 1 for n in self._verify)

    def draft_cost(self) -> float | None:
        """Seconds per guess: measured, else ``cost_prior`` one-row target steps (a draft
        model's size against the target's: a guess is one decode of the smaller model), else
        None. With the prior a drafter whose size alone rules it out is never probed, so its
        first probe of a load does not cost a catch-up on the whole prompt for nothing."""
        if self._draft.value is not None:
            return self._draft.value
        one = self.verify_cost(1) if self.cost_prior is not None else None
        return None if one is None or self.cost_prior is None else self.cost_prior * one

    def rate(self, k: int) -> float | None:
        """Predicted tokens per second with K = k (None when costs are unknown)."""
        verify = self.step_cost(k)
        if verify is None:
            return None
        draft = 0.0 if k == 0 else k * (self.draft_cost() or 0.0)
        return (self.others + self.expected_tokens(k)) / (draft + verify)

    @property
    def draft_rounds(self) -> int:
        """Rounds that verified drafts: how much evidence the estimates rest on."""
        return self._draft_rounds

    def best_rate(self) -> float | None:
        """Expected tokens per second at the best K (plain decoding when none pays)."""
        return self.rate(self.best_k())

    def best_k(self) -> int:
        plain = self.rate(0)
        if plain is None:
            return self.max_k
        best_k, best_rate = 0, plain * _MARGIN
        for k in range(1, self.max_k + 1):
            r = self.rate(k)
            if r is not None and r > best_rate:
                best_k, best_rate = k, r
        return best_k

    def cut(self, confidence: Sequence[float]) -> int:
        """How many drafts of a rated proposal to verify: the prefix with the best expected
        rate (0: decode plainly this round). ``confidence[i]`` is the probability that draft i
        is accepted given that the drafts before it were."""
        self._rated = True
        self.last_cut_rate = None
        if not self.adaptive:
            return len(confidence)
        plain = self.rate(0)
        if plain is None:
            return len(confidence)  # nothing measured yet: this round measures a wide verify
        best_k, self.last_cut_rate = self._best_prefix(confidence, plain, self.step_cost)
        if best_k > 0:
            self._rated_backoff = _RATED_PROBE_AFTER
        else:
            # A wide verify's cost is only measured again when one runs: one slow round
            # (another process took the core) would otherwise rule drafting out for good. So
            # after a long dry spell verify the prefix that would pay at the prior cost curve,
            # waiting twice as long after each probe that did not bring drafting back.
            probe = self._best_prefix(confidence, plain, self._prior_step_cost)[0]
            if probe and self._undrafted >= self._rated_backoff:
                best_k = probe
                self._rated_backoff = min(self._max_probe, 2 * self._rated_backoff)
        return best_k

    def _best_prefix(
        self,
        confidence: Sequence[float],
        plain: float,
        step_cost: Callable[[int], float | None],
    ) -> tuple[int, float]:
        """The best prefix length and its expected tokens per second (``plain`` for 0);
        ``step_cost(k)`` is the seconds of the step with ``k`` drafts."""
        draft = self.draft_cost() or 0.0
        best_k, best_rate = 0, plain * _MARGIN
        expected, survive = 1.0 + self.others, 1.0
        for k, c in enumerate(confidence, start=1):
            survive *= c
            expected += survive
            verify = step_cost(k)
            if verify is None:
                break
            r = expected / (k * draft + verify)
            if r > best_rate:
                best_k, best_rate = k, r
        return best_k, best_rate if best_k else plain

    def _prior_step_cost(self, k: int) -> float | None:
        """Seconds of the step with ``k`` drafts by the prior curve from the plain step."""
        one = self.step_cost(0)
        return None if one is None else one * (1.0 + PRIOR_ROW_SLOPE * k)

    # ---- decisions ---------------------------------------------------------------------------
    def _with_acceptance(self, acceptance: float) -> int:
        """best_k() as if the per-draft acceptance were ``acceptance``."""
        saved = self._acc_hits, self._acc_trials
        self._acc_hits, self._acc_trials = acceptance, 1.0
        try:
            return self.best_k()
        finally:
            self._acc_hits, self._acc_trials = saved

    @property
    def hopeless(self) -> bool:
        """True when drafting could not pay even if nearly every draft were accepted: the
        costs alone (measured, or a draft model's size before that) rule it out (a draft as
        expensive as the target), so probing is pointless."""
        if not self._plain_measured or self.draft_cost() is None:
            return False
        plain = self.rate(0)
        if self._draft.value is None and plain is not None:
            # A prior's verdict is weighed at the prior verify curve: the measured wide widths
            # may rest on one slow first step, and a verdict that never probes never re-measures.
            optimistic = [_OPTIMISTIC_ACCEPTANCE] * self.max_k
            return self._best_prefix(optimistic, plain, self._prior_step_cost)[0] == 0
        return self._with_acceptance(_OPTIMISTIC_ACCEPTANCE) == 0

    def next_k(self) -> int:
        """The draft length for the coming round."""
        if not self.adaptive or self.max_k == 0 or self._rated:
            return self.max_k
        if not self._verify and self.cost_prior is None:
            k = self.max_k  # first round: draft, which measures drafting and a wide verify
        elif not self._plain_measured:
            k = 0  # then (first, with a prior to weigh it against) measure plain decoding
        else:
            k = self.best_k()
            self._rounds += 1
            # No probes while the costs alone rule drafting out: a draft model would first
            # have to catch up on every token since it last drafted. The verdict is
            # re-evaluated as plain decoding keeps being measured.
            idle = k == 0 and not self.hopeless
            if idle and (self._probe_again or self._plain_rounds >= self._probe_interval()):
                k = self._probe_width
                self._probing = True
            elif 0 < k < self.max_k and self._rounds % _EXPLORE_EVERY == 0:
                k += 1  # now and then measure one draft more than the model knows about
            elif k > 0 and (self._rounds + _EXPLORE_EVERY // 2) % _PLAIN_EVERY == 0:
                k = 0  # and plain decoding, the yardstick (see _PLAIN_EVERY)
        return min(k, self.max_k)

    def record(
        self,
        requested: int,
        proposed: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        prepare_seconds: float = 0.0,
    ) -> None:
        """One round finished: ``proposed`` drafts (of ``requested``), ``accepted`` kept.

        ``draft_seconds`` is the time spent proposing; ``prepare_seconds`` the time the drafter
        spent catching up on tokens it had not seen (a draft model after rounds without
        drafting: part of what a probe costs); ``verify_seconds`` the time to decode and check
        ``proposed + 1`` rows (in a step of ``base_rows`` more)."""
        rows = self.base_rows + proposed + 1
        cost = self._verify.setdefault(rows, Ewma(self._cost_alpha))
        # Each choice verifies only the widths it believes pay (a rated drafter's cut(), a
        # model drafter's best K), so a slow round must not stick: a faster time is believed
        # sooner, and an older estimate that contradicts this one (fewer rows dearer, more
        # rows cheaper) is stale. The table is shared by a model's drafters.
        cost.down_alpha = _DOWN_ALPHA
        if cost.value is not None and verify_seconds < cost.value / 2:
            cost.value = None  # half the estimate: that was an outlier, start again
        cost.add(max(verify_seconds, 1e-9))
        fresh = cost.value or 0.0
        for n, other in self._verify.items():
            if other.value is not None and (
                (n < rows and other.value > fresh) or (n > rows and other.value < fresh)
            ):
                other.value = fresh
        # In a run of drafting rounds the drafter catches up on one or two tokens per round
        # (the pending token, the bonus): a cost of every round, so part of the draft cost.
        # After plain rounds the catch-up covers all of them: that is what a probe costs.
        warm = self._last_requested > 0
        if requested > 0 and not warm:
            self._catch_up.add(prepare_seconds)
        self._undrafted = 0 if proposed > 0 else self._undrafted + 1
        if proposed > 0:
            self._draft_rounds += 1
            if warm:
                self._draft.add((draft_seconds + prepare_seconds) / proposed)
            elif self._draft.value is None and proposed > 1:
                # Cold, the first draft comes with the catch-up's logits: the others measure.
                self._draft.add(draft_seconds / (proposed - 1))
            self._acc_hits = self._acc_hits * self._decay + accepted
            failure = 1.0 if accepted < proposed else 0.0
            self._acc_trials = self._acc_trials * self._decay + accepted + failure
        if self._probing and proposed > 0:
            self._probe_width = min(
                max(self.max_k, _PROBE_LENGTH),
                2 * proposed if accepted == proposed else max(_PROBE_LENGTH, accepted),
            )
        self._probe_again = self._probing and 0 < proposed == accepted
        self._probing = False
        self._last_requested = requested
        if requested == 0:
            self._plain_rounds += 1
        else:
            self._plain_rounds = 0

    def _probe_interval(self) -> int:
        """Rounds to wait so that probes cost at most ``_PROBE_BUDGET`` of decoding time."""
        if self.hopeless:
            return self._max_probe
        plain = self.step_cost(0)
        width = self._probe_width
        probe = self.step_cost(width)
        if not self._plain_measured or plain is None or probe is None:
            return self._min_probe
        if self._draft_rounds < _MIN_EVIDENCE:
            return self._min_probe  # too little seen yet to give up on drafting for long
        overhead = width * (self.draft_cost() or 0.0) + probe - plain
        overhead += self._catch_up.value or 0.0
        rounds = math.ceil(overhead / (_PROBE_BUDGET * plain))
        return max(self._min_probe, min(self._max_probe, rounds))

    # ---- what is kept across requests and restarts --------------------------------------------
    def state(self) -> dict[str, float | int | bool | None]:
        """The estimates (not the shared verify costs: see :func:`verify_costs_state`)."""
        return {
            "draft": self._draft.value,
            "catch_up": self._catch_up.value,
            "acc_hits": self._acc_hits,
            "acc_trials": self._acc_trials,
            "draft_rounds": self._draft_rounds,
            "rated": self._rated,
        }

    def restore(self, state: object) -> None:
        """Estimates saved by :meth:`state`; malformed values are ignored."""
        if not isinstance(state, dict):
            return

        def number(key: str) -> float | None:
            value = state.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                return None
            return float(value) if math.isfinite(value) and value >= 0 else None

        hits, trials = number("acc_hits"), number("acc_trials")
        if hits is not None and trials is not None and 0 <= hits <= trials:
            self._acc_hits, self._acc_trials = hits, trials
        self._draft.value = number("draft")
        self._catch_up.value = number("catch_up")
        self._draft_rounds = int(number("draft_rounds") or 0)
        self._rated = state.get("rated") is True
