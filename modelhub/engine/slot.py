"""One of a runner's sequences (a slot): its KV sequence id, what that holds, its drafters.

The engine (:mod:`modelhub.engine.generate`) makes ``n_parallel`` of them; the batch loop gives
each request one; a request (:mod:`modelhub.engine.sequence`) keeps ``cached`` equal to what the
KV sequence holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modelhub.engine.rollback import RecurrentState
from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.choice import Member
from modelhub.engine.speculative.factory import TargetObserver
from modelhub.engine.vision import ImageSpan


@dataclass
class Slot:
    """One of a runner's sequences: its KV sequence id, what that holds, and its drafters (the
    model's default first; each sequence has instances of its own)."""

    seq: int
    members: list[Member] = field(default_factory=list)
    defaults: int = 0  # the first ``defaults`` members are the ones a request uses by default
    cached: list[int] = field(default_factory=list)  # exactly the tokens in its KV sequence
    ngram: Drafter | None = None  # drafts where a prediction has nothing (made on first use)
    last_used: float = 0.0
    busy: bool = False
    recurrent: RecurrentState = field(default_factory=RecurrentState)  # see ``rollback``
    images: list[ImageSpan] = field(default_factory=list)  # the images in its KV sequence
    _observed: tuple[list[Drafter], list[TargetObserver]] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def drafter(self) -> Drafter | None:
        """The model's default drafter in this sequence (None: it has none)."""
        return self.members[0].drafter if self.defaults else None

    def observers(self) -> list[TargetObserver]:
        """The drafters that follow every target decode (MTP heads, EAGLE-3, DFlash); asked
        every step, so kept for the members it was worked out for (a check against a runtime
        protocol is slow enough to count on a GPU's step)."""
        drafters = [m.drafter for m in self.members]
        known = self._observed
        if (
            known is None
            or len(known[0]) != len(drafters)
            or any(a is not b for a, b in zip(known[0], drafters, strict=True))
        ):
            known = (drafters, [d for d in drafters if isinstance(d, TargetObserver)])
            self._observed = known
        return known[1]

    def keep_images(self, upto: int) -> None:
        """The cache was cut back to ``upto`` positions: forget the images past it."""
        self.images = [s for s in self.images if s.end <= upto]

    def reset(self) -> None:
        """The sequence was cleared: nothing of it is cached any more."""
        self.cached.clear()
        self.images.clear()
        self.recurrent = RecurrentState()
