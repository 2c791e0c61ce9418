"""What the scheduler loads: a model's weights and runner config (``LoadSpec``), and what its
drafters did since the load (``DraftTally``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelhub.engine.load_config import LoadConfig
from modelhub.engine.protocol import DoneResult
from modelhub.runtime.memory import MemoryEstimate


@dataclass(frozen=True)
class LoadSpec:
    """What to load: ``config`` is the load plan the runner receives."""

    name: str  # display name of the model that asked for it
    digest: str  # manifest digest (for /api/ps)
    model_blob: str  # weights digest: the runner identity with ``config``
    config: LoadConfig
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    memory: MemoryEstimate = field(default_factory=MemoryEstimate, compare=False, hash=False)
    # The same model without its draft models, loaded when memory is short for them (SPEC-13).
    lean: LoadSpec | None = field(default=None, compare=False, hash=False)
    note: str = field(default="", compare=False, hash=False)  # why this spec was chosen

    @property
    def key(self) -> tuple[str, LoadConfig]:
        return (self.model_blob, self.config)

    @staticmethod
    def make(
        name: str,
        digest: str,
        model_blob: str,
        config: dict[str, Any] | LoadConfig,
        details: dict[str, Any],
        memory: MemoryEstimate | None = None,
        *,
        lean: LoadSpec | None = None,
        note: str = "",
    ) -> LoadSpec:
        """``config`` as a dict is checked into a :class:`LoadConfig` here (a field it does
        not have is a bug, refused loudly)."""
        return LoadSpec(
            name,
            digest,
            model_blob,
            LoadConfig.model_validate(config),
            dict(details),
            memory or MemoryEstimate(),
            lean,
            note,
        )


@dataclass
class DraftTally:
    """What a loaded model's drafters did since the load: ``tokens`` generated and
    ``drafted`` of them from accepted drafts (counted as they stream), guesses checked and kept
    by finished requests, and the drafter that guessed most in the last one."""

    tokens: int = 0
    drafted: int = 0
    checked: int = 0
    kept: int = 0
    last_drafter: str | None = None

    def add_token(self, drafted: bool) -> None:
        self.tokens += 1
        self.drafted += int(drafted)

    def add_result(self, result: DoneResult) -> None:
        self.checked += result.draft_count
        self.kept += result.draft_accepted_count
        self.last_drafter = result.drafter_name or self.last_drafter
