"""What EAGLE-3 and DFlash drafters share: a separate drafter GGUF fed with the inputs of some
of the target's layers, read from the target context after each of its decodes.

Each drafter instance follows one sequence of the target (the primary sequence 0, fork i
sequence i) with a draft context of its own (one sequence, the target's positions); the engine
hands it the target's batch rows of that sequence (``first_row``). The primary switches the
target's layer-input copies on and, when closed, off; the forks share its model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from modelhub.engine.context import LlamaContext
from modelhub.engine.llama import ON_CPU, LlamaModel, LoadPlacement
from modelhub.engine.speculative.layer_api import ExtBatch, LayerApi, features, layer_api
from modelhub.engine.speculative.mtp import nextn_api
from modelhub.errors import DraftError
from modelhub.gguf.info import GGUFInfo
from modelhub.gguf.pairing import PairingReport

log = logging.getLogger("modelhub.engine")

T = TypeVar("T", bound="LayeredDrafter")


class LayeredDrafter:
    kind = ""  # set by each subclass

    @classmethod
    def check(cls, target: GGUFInfo, draft: GGUFInfo) -> PairingReport:
        """Raise DraftError unless ``draft`` can serve ``target`` (read from metadata)."""
        raise NotImplementedError

    def __init__(
        self,
        model: LlamaModel,
        target_ctx: LlamaContext,
        *,
        n_threads: int,
        p_min: float = 0.0,
        owns_model: bool = False,
        primary: bool = True,
        seq: int = 0,
    ) -> None:
        self.api: LayerApi = layer_api()
        self.ext: Any = nextn_api()
        self.model = model
        self.target_ctx = target_ctx
        self.seq = seq
        self.p_min = p_min
        self.rng = np.random.default_rng()
        self._n_threads = n_threads
        self._owns_model = owns_model
        self._primary = primary
        self._forks = 0
        self.n_target_embd = target_ctx.model.n_embd
        self.n_vocab = target_ctx.model.n_vocab
        self.layer_ids = self.api.target_layer_ids(model.handle)
        if not self.layer_ids:
            raise DraftError(f"{model.path.name}: llama.cpp loaded no target layer ids")
        self.ctx = LlamaContext(
            model,
            n_ctx=target_ctx.n_ctx,
            n_batch=target_ctx.n_batch,
            n_threads=n_threads,
            ctx_other=target_ctx,  # borrows the target's embeddings / lm_head where it lacks them
        )
        if primary:
            # Before the target's first decode: llama.cpp re-plans its graph for these outputs.
            for lid in sorted(set(self.layer_ids)):
                self.api.set_layer_inp(target_ctx.handle, lid, True)
        self.ext.llama_set_embeddings_nextn(self.ctx.handle, True, True)
        self.batch = ExtBatch(self.ctx.handle)
        self._len = 0  # positions the draft cache holds (0.._len-1)
        self.setup()

    def setup(self) -> None:
        """The subclass's own state (called at the end of ``__init__``)."""

    @classmethod
    def from_file(
        cls: type[T],
        path: Path,
        target: LlamaModel,
        target_ctx: LlamaContext,
        *,
        n_threads: int,
        p_min: float = 0.0,
        placement: LoadPlacement = ON_CPU,
    ) -> T:
        """The drafter in ``path``, checked against ``target`` before any native code runs."""
        from modelhub.gguf.info import read_gguf_info

        if not path.is_file():
            raise DraftError(f"{cls.kind} drafter file not found: {path}")
        layer_api()  # a build without the bindings fails before anything loads
        info = read_gguf_info(path, with_tokens=True, full_arrays=True)
        report = cls.check(read_gguf_info(target.path, with_tokens=True), info)
        for warning in report.warnings:
            log.warning("draft %s: %s", path.name, warning)
        model = LlamaModel(path, placement=placement)
        try:
            return cls(model, target_ctx, n_threads=n_threads, p_min=p_min, owns_model=True)
        except BaseException:
            model.close()
            raise

    def fork(self: T) -> T:
        """A drafter for the target's next sequence (1, 2, ... in the order they are made):
        the same weights, a draft context of its own. Close it before this one."""
        self._forks += 1
        return type(self)(
            self.model,
            self.target_ctx,
            n_threads=self._n_threads,
            p_min=self.p_min,
            primary=False,
            seq=self._forks,
        )

    # ---- helpers -------------------------------------------------------------------------------
    def target_features(self, first_row: int, n: int) -> npt.NDArray[np.float32]:
        return features(
            self.api, self.target_ctx.handle, self.layer_ids, first_row, n, self.n_target_embd
        )

    def truncate(self, keep: int) -> None:
        if self._len > keep:
            self.ctx.truncate(keep)
            self._len = keep

    # ---- the Drafter interface (the target's decodes drive the state) -------------------------
    def reseed(self, seed: int | None) -> None:
        self.rng = np.random.default_rng(seed)

    def begin(self, tokens: Sequence[int]) -> None:
        """Nothing to do: the cache follows the target's decodes (``observe_target``)."""

    def commit(self, tokens: Sequence[int]) -> None:
        """Nothing to do: the engine reports the kept length through ``rollback``."""

    def close(self) -> None:
        if getattr(self, "batch", None) is not None:
            if self._primary and self.target_ctx.handle:
                for lid in sorted(set(self.layer_ids)):
                    self.api.set_layer_inp(self.target_ctx.handle, lid, False)
            self.batch.close()
            self.ctx.close()
            self.batch = None  # type: ignore[assignment]
        if self._owns_model:
            self.model.close()
            self._owns_model = False
