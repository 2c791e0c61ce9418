"""Running cost estimates of the draft-length controllers (``adaptive``), and the table of
verify costs a model's controllers share, as ``drafting_state`` saves and restores it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

# A sample above this multiple of the running estimate counts as this multiple: one stalled
# round (another process took the core for a second) must not rule plain decoding or drafting
# out, while a real change of level is still followed within a few rounds.
OUTLIER = 3.0
# Assumed cost of each extra verified row, relative to a one-row decode, before it is measured.
PRIOR_ROW_SLOPE = 0.35

# A new number at every change of any Ewma's value (unique even across threads: next() on a
# count holds the GIL): estimates derived under another number are stale.
_changes = itertools.count()
_generation = next(_changes)


def generation() -> int:
    """Changes whenever an estimate changes (see ``AdaptiveDraftLength.verify_cost``'s cache:
    a round's decision prices every width several times, on a fast GPU step at a cost that
    counts)."""
    return _generation


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

    def __setattr__(self, name: str, value: Any) -> None:
        global _generation
        object.__setattr__(self, name, value)
        if name == "value":
            _generation = next(_changes)


VerifyCosts = dict[int, Ewma]
"""Seconds to decode and check n rows, per n: a property of the target and the batch it runs
in, not of the drafter, so the controllers of a model's drafters share one table."""


def estimate(costs: VerifyCosts, rows: int) -> float | None:
    """Estimated seconds of a step of ``rows`` rows from the table (None: nothing measured).

    Never less than the estimate for fewer rows: more rows cannot be cheaper, and noisy
    measurements must not make a wider batch look free. Between measured widths the estimate
    is interpolated; below the smallest, and above the only one, scaled by the prior curve;
    above several, the last measured segment is extended, unless it starts at one row: a
    one-row decode takes other kernels (llama.cpp's matrix-vector path, a CUDA graph), so the
    step to two rows is a switch, not a slope (measured: 60 ms to 130 ms for the padded
    target on two cores, whose 5- and 9-row steps cost far less than that slope says). Then
    wider steps are priced by the prior curve from the one-row cost, never below the widest
    measured."""
    known = sorted((n, e.value) for n, e in costs.items() if e.value is not None)
    if not known:
        return None
    running = 0.0
    for i, (n, value) in enumerate(known):
        running = max(running, value)
        known[i] = (n, running)
    for n, value in known:
        if n == rows:
            return value
    below = [(n, v) for n, v in known if n < rows]
    above = [(n, v) for n, v in known if n > rows]
    if below and above:
        (n0, v0), (n1, v1) = below[-1], above[0]
        return v0 + (v1 - v0) * (rows - n0) / (n1 - n0)
    if above or len(known) == 1:
        n0, v0 = known[0]
        s = PRIOR_ROW_SLOPE
        return v0 * (1.0 + s * (rows - 1)) / (1.0 + s * (n0 - 1))
    (n0, v0), (n1, v1) = known[-2:]
    if n0 == 1:
        return max(v1, v0 * (1.0 + PRIOR_ROW_SLOPE * (rows - 1)))
    return v1 + max(0.0, (v1 - v0) / (n1 - n0)) * (rows - n1)


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
