"""Running cost estimates of the draft-length controllers (``adaptive``), and the table of
verify costs a model's controllers share, as ``drafting_state`` saves and restores it."""

from __future__ import annotations

from dataclasses import dataclass

# A sample above this multiple of the running estimate counts as this multiple: one stalled
# round (another process took the core for a second) must not rule plain decoding or drafting
# out, while a real change of level is still followed within a few rounds.
OUTLIER = 3.0


@dataclass
class Ewma:
    """An exponentially weighted moving average (of a cost in seconds)."""

    alpha: float
    value: float | None = None
    # Weight of a sample below the average; None: ``alpha``. Timings on a shared CPU are noisy
    # one way (interference only slows a round), so a fast round is believed sooner.
    down_alpha: float | None = None

    def add(self, sample: float) -> None:
        if self.value is None:
            self.value = sample
        else:
            if self.value > 0:
                sample = min(sample, OUTLIER * self.value)
            low = sample < self.value and self.down_alpha is not None
            alpha = self.down_alpha if low and self.down_alpha is not None else self.alpha
            self.value += alpha * (sample - self.value)


VerifyCosts = dict[int, Ewma]
"""Seconds to decode and check n rows, per n: a property of the target and the batch it runs
in, not of the drafter, so the controllers of a model's drafters share one table."""


def verify_costs_state(costs: VerifyCosts) -> dict[str, float]:
    return {str(n): e.value for n, e in sorted(costs.items()) if e.value is not None}


def restore_verify_costs(state: object, alpha: float = 0.3) -> VerifyCosts:
    """A table saved by :func:`verify_costs_state` (anything malformed is skipped)."""
    costs: VerifyCosts = {}
    if isinstance(state, dict):
        for n, value in state.items():
            if str(n).isdigit() and isinstance(value, (int, float)) and 0 < value < 3600:
                costs[int(n)] = Ewma(alpha, float(value))
    return costs


@dataclass(frozen=True)
class StepShare:
    """A decoding request's place in the batch step it plans a round for: how many requests
    decode in it (this one included), the rows of the others (those planned before it as
    planned, one for each planned after it) and whether the step evaluates a prompt too (then
    the request decodes plainly, nothing is chosen, and the step's time measures nothing)."""

    decoding: int = 1
    other_rows: int = 0
    prompt: bool = False
