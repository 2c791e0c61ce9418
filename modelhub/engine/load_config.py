"""What a runner loads: the load plan the daemon makes (``runtime.planning``) and the runner
receives in its ``load`` message (``engine.protocol.Load``), as one typed class.

It mirrors :class:`modelhub.engine.options.EngineConfig` field for field (a test holds the two
together), with paths as strings and lists as tuples, so that it crosses the pipe as JSON and
a plan is hashable: two plans equal in every field load the same runner. It imports neither
llama.cpp nor numpy, so the daemon can use it. A field that is not here is refused (pydantic's
``extra="forbid"``): a misspelt setting fails where it is made, not in the runner.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

DraftKind = Literal["none", "auto", "draft_model", "mtp", "ngram", "eagle3", "dflash"]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DraftCandidate(_Shape):
    """A drafter ``DRAFT auto`` may choose (``options.DraftSource`` in the runner)."""

    name: str
    kind: DraftKind
    path: str | None = None
    max_k: int = 4


class LoadConfig(_Shape):
    """``EngineConfig``'s fields (see its docstring for each), but ``num_gpu`` and
    ``rpc_servers`` may be None in a plan: the daemon's defaults (``MODELHUB_NUM_GPU``,
    ``MODELHUB_RPC_SERVERS``) fill them in when the runner starts."""

    model_path: str
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0
    draft_kind: DraftKind = "none"
    draft_path: str | None = None
    draft_name: str = ""
    draft_candidates: tuple[DraftCandidate, ...] = ()
    state_dir: str | None = None
    ngram_persist: bool = True
    draft_num_predict: int = 4
    draft_min: int = 0
    draft_p_min: float = 0.0
    adaptive: bool = True
    draft_n_ctx: int = 0
    repack: bool | None = None
    n_parallel: int = 1
    kv_cache_type: str = "auto"
    adapter_paths: tuple[str, ...] = ()
    adapter_scale: float = 1.0
    projector_path: str | None = None
    recurrent_rollback: Literal["auto", "checkpoint"] = "auto"
    num_gpu: int | None = None
    flash_attn: bool = True
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    rpc_servers: tuple[str, ...] | None = None

    def with_(self, **changes: Any) -> LoadConfig:
        """This plan with ``changes``, checked like the plan itself."""
        return LoadConfig.model_validate({**self.model_dump(exclude_unset=True), **changes})
