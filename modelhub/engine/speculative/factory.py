"""Building the drafter an engine was configured with, and the optional drafter capabilities.

``base.Drafter`` is the contract every drafter meets. Some drafters can do more, and the engine
asks for that through the small protocols below rather than by drafter kind:

- :class:`Preparing`: catch up on the accepted sequence before drafting (a draft model decoding
  the tokens it has not seen), so the engine can time that apart from drafting proper;
- :class:`Seeded`: a drafter that samples takes the request's seed;
- :class:`TargetObserver`: sees every target decode (MTP heads need the target's hidden states);
- :class:`Shifting`: follows a context shift of the target's sequence in a cache of its own;
- :class:`Closable`: holds native resources.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from modelhub.engine.context import LlamaContext
from modelhub.engine.llama import LlamaModel, LoadPlacement
from modelhub.engine.options import DraftSource
from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.ngram import NgramDrafter, NgramPool
from modelhub.errors import DraftError

if TYPE_CHECKING:
    from modelhub.engine.load_config import DraftKind
    from modelhub.engine.options import EngineConfig

# n-gram guesses cost nothing to make: a long bound, which the confidence cut trims.
NGRAM_DRAFT_LEN = 16

log = logging.getLogger("modelhub.engine")


@runtime_checkable
class Preparing(Protocol):
    def prepare(self, tokens: Sequence[int]) -> bool: ...


@runtime_checkable
class Seeded(Protocol):
    def reseed(self, seed: int | None) -> None: ...


@runtime_checkable
class TargetObserver(Protocol):
    def observe_target(self, tokens: Sequence[int], start: int, first_row: int = 0) -> None:
        """The target just decoded ``tokens`` at positions ``start..``, rows ``first_row..``
        of its last batch (its memory is current)."""

    def rollback(self, keep: int) -> int:
        """The target kept only positions ``< keep``. Returns the position from which the
        target must decode again for the observer to follow (``keep`` when it can already)."""


@runtime_checkable
class Shifting(Protocol):
    def shift(self, keep: int, discard: int) -> None:
        """The accepted sequence lost tokens ``keep..keep+discard-1`` (a context shift); the
        later ones moved down by ``discard``."""


@runtime_checkable
class Closable(Protocol):
    def close(self) -> None: ...


def draft_sources(cfg: EngineConfig, given: Drafter | None) -> tuple[list[DraftSource], list[str]]:
    """The drafters an engine loads, and the names of those a request uses unless it names
    one. ``DRAFT auto``: every candidate plus n-gram, all used. A fixed kind: the configured
    drafter (used) and n-gram beside it (only for requests that ask). None: n-gram for requests
    that ask. A caller's ``given`` drafter is the only one."""
    if given is not None:
        kind = cast("DraftKind", given.kind)
        return [DraftSource(given.kind, kind, None, cfg.draft_num_predict)], [given.kind]
    ngram = DraftSource("ngram", "ngram", None, NGRAM_DRAFT_LEN)
    if cfg.draft_kind == "auto":
        sources = list(cfg.draft_candidates)
        if not any(src.kind == "ngram" for src in sources):
            sources.append(ngram)
        return sources, [src.name for src in sources]
    if cfg.draft_kind == "none" or cfg.draft_num_predict <= 0:
        return [*cfg.draft_candidates, ngram], []
    name = cfg.draft_name or cfg.draft_kind
    main = DraftSource(name, cfg.draft_kind, cfg.draft_path, cfg.draft_num_predict)
    extras = [src for src in cfg.draft_candidates if src.name != name]
    if cfg.draft_kind != "ngram" and not any(src.kind == "ngram" for src in extras):
        extras.append(ngram)
    return [main, *extras], [name]


def make_drafter(
    cfg: EngineConfig,
    target: LlamaModel,
    target_ctx: LlamaContext,
    n_threads: int,
    placement: LoadPlacement,
    src: DraftSource,
) -> Drafter | None:
    """The drafter of ``src``. ``placement`` is where a draft file's weights go (the target's
    repacking; its local devices, never RPC workers)."""
    if src.kind == "none" or src.max_k <= 0:
        return None
    if src.kind == "draft_model":
        return _draft_model(cfg, src, target, n_threads, placement)
    if src.kind == "ngram":
        return ngram_drafter(target.path)
    if src.kind == "mtp" and src.path is None:  # the target's own NextN heads
        from modelhub.engine.speculative.mtp import MtpDrafter

        return MtpDrafter(target, target_ctx, n_threads=n_threads, p_min=cfg.draft_p_min)
    if src.kind in ("mtp", "eagle3", "dflash"):
        if src.path is None:
            raise DraftError(f"draft_kind {src.kind!r} needs draft_path (the drafter GGUF)")
        drafter = _file_drafter_class(src.kind).from_file(
            Path(src.path),
            target,
            target_ctx,
            n_threads=n_threads,
            p_min=cfg.draft_p_min,
            placement=placement,
        )
        return cast(Drafter, drafter)
    raise DraftError(
        f"unknown draft kind {src.kind!r}: "
        "use none, auto, draft_model, mtp, ngram, eagle3 or dflash"
    )


def _file_drafter_class(kind: str) -> Any:
    """The class that loads a ``kind`` drafter from its own GGUF (each has ``from_file``)."""
    if kind == "mtp":
        from modelhub.engine.speculative.mtp import MtpDrafter

        return MtpDrafter
    if kind == "eagle3":
        from modelhub.engine.speculative.eagle3 import Eagle3Drafter

        return Eagle3Drafter
    from modelhub.engine.speculative.dflash import DFlashDrafter

    return DFlashDrafter


def _draft_model(
    cfg: EngineConfig,
    src: DraftSource,
    target: LlamaModel,
    n_threads: int,
    placement: LoadPlacement,
) -> Drafter:
    from modelhub.engine.speculative.draft_model import DraftModelDrafter
    from modelhub.gguf.info import read_gguf_info
    from modelhub.gguf.pairing import check_draft_pairing

    if src.path is None:
        raise DraftError("draft_kind 'draft_model' needs draft_path (the draft GGUF)")
    draft_path = Path(src.path)
    if not draft_path.is_file():
        raise DraftError(f"draft model file not found: {draft_path}")
    # Checked again at load (not only at create): never reach native code with a bad pair.
    report = check_draft_pairing(
        read_gguf_info(target.path, with_tokens=True),
        read_gguf_info(draft_path, with_tokens=True),
        target.path,
        draft_path,
    )
    for warning in report.warnings:
        log.warning("draft %s: %s", draft_path.name, warning)
    return DraftModelDrafter(
        draft_path,
        target_vocab=target.n_vocab,
        n_ctx=min(cfg.n_ctx, cfg.draft_n_ctx) if cfg.draft_n_ctx > 0 else cfg.n_ctx,
        n_batch=cfg.n_batch,
        n_threads=n_threads,
        p_min=cfg.draft_p_min,
        placement=placement,
    )


# One n-gram pool per target model, shared by every engine (and request) in the process.
_ngram_pools: dict[str, NgramPool] = {}


def ngram_pool(model_path: Path) -> NgramPool:
    """The process-wide n-gram pool of a model (created on first use)."""
    key = str(model_path.resolve())
    pool = _ngram_pools.get(key)
    if pool is None:
        pool = NgramPool()
        _ngram_pools[key] = pool
    return pool


def install_ngram_pool(model_path: Path, pool: NgramPool) -> None:
    """Make ``pool`` (one kept from an earlier load) the model's process-wide pool."""
    _ngram_pools[str(model_path.resolve())] = pool


def ngram_drafter(model_path: Path) -> Drafter:
    pool = ngram_pool(model_path)
    drafter: Drafter = NgramDrafter(pool.n_match, pool=pool)
    return drafter


def prediction_drafter(prediction: Sequence[int], fallback: Drafter | None = None) -> Drafter:
    """A drafter for one request's caller-supplied expected output (OpenAI ``prediction``);
    ``fallback`` drafts where the prediction has nothing to offer."""
    from modelhub.engine.speculative.prediction import PredictionDrafter

    drafter: Drafter = PredictionDrafter(list(prediction), fallback=fallback)
    return drafter
