"""What the scheduler loads: a model's weights and runner config (``LoadSpec``), and what its
drafters did since the load (``DraftTally``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelhub.runtime.memory import MemoryEstimate


@dataclass(frozen=True)
class LoadSpec:
    """What to load. ``config`` holds EngineConfig fields (paths as strings)."""

    name: str  # display name of the model that asked for it
    digest: str  # manifest digest (for /api/ps)
    model_blob: str  # weights digest: the runner identity with ``config``
    config: tuple[tuple[str, Any], ...]
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    memory: MemoryEstimate = field(default_factory=MemoryEstimate, compare=False, hash=False)
    # The same model without its draft models, loaded when memory is short for them (SPEC-13).
    lean: LoadSpec | None = field(default=None, compare=False, hash=False)
    note: str = field(default="", compare=False, hash=False)  # why this spec was chosen

    @property
    def key(self) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return (self.model_blob, self.config)

    @staticmethod
    def make(
        name: str,
        digest: str,
        model_blob: str,
        config: dict[str, Any],
        details: dict[str, Any],
        memory: MemoryEstimate | None = None,
        *,
        lean: LoadSpec | None = None,
        note: str = "",
    ) -> LoadSpec:
        return LoadSpec(
            name,
            digest,
            model_blob,
            tuple(sorted((k, _freeze(v)) for k, v in config.items())),
            dict(details),
            memory or MemoryEstimate(),
            lean,
            note,
        )


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """What ``_freeze`` made, back as dicts and lists (an empty tuple stays one)."""
    if not isinstance(value, tuple) or not value:
        return value
    if all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
        return {k: thaw(v) for k, v in value}
    return [thaw(v) for v in value]


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

    def add_result(self, result: dict[str, Any]) -> None:
        self.checked += int(result.get("draft_count") or 0)
        self.kept += int(result.get("draft_accepted_count") or 0)
        self.last_drafter = result.get("drafter_name") or self.last_drafter
