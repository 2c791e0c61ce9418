"""What a request's steps and drafters use of the engine that runs them.

:class:`EngineHost` is the one way up from :mod:`modelhub.engine.sequence` and
:mod:`modelhub.engine.members` to :class:`modelhub.engine.generate.Engine` (its one
implementation): the model and context, the rollback, the drafting controllers, and the
``finished`` callback. The modules below ``generate`` import this, never ``generate``, so
the engine's imports point one way (``generate -> batching -> sequence -> members | shift``).
"""

from __future__ import annotations

from typing import Protocol

from modelhub.engine.context import LlamaContext
from modelhub.engine.llama import LlamaModel
from modelhub.engine.options import EngineConfig, GenerateResult
from modelhub.engine.rollback import Rollback
from modelhub.engine.speculative.adaptive import AdaptiveDraftLength


class EngineHost(Protocol):
    """The engine as a request in one of its sequences sees it."""

    @property
    def cfg(self) -> EngineConfig: ...

    @property
    def model(self) -> LlamaModel: ...

    @property
    def ctx(self) -> LlamaContext: ...

    @property
    def n_ctx(self) -> int:
        """The context a sequence holds (llama.cpp may have rounded ``cfg.n_ctx`` up)."""
        ...

    @property
    def rollback(self) -> Rollback: ...

    @property
    def default_drafters(self) -> list[str]:
        """The drafters a request uses unless it names one."""
        ...

    def controller(self, name: str, klass: str, load: int, k_max: int) -> AdaptiveDraftLength:
        """The draft-length controller of drafter ``name`` for this kind of request."""
        ...

    def finished(self, result: GenerateResult) -> None:
        """A request ended (called on the batch thread)."""
        ...
