"""From a stored model and a request's options to a runner load spec and runner options.

Precedence as Ollama: built-in defaults < Modelfile PARAMETERs < request ``options``. Load-time
options (context size, batch, threads, the draft, the adapter) are part of a runner's identity;
the rest are per request.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelhub.config import DEFAULT_CONTEXT_LENGTH
from modelhub.errors import InputError, ModelfileError
from modelhub.gguf.info import GGUFInfo
from modelhub.library.drafters import auto_drafters, draft_mode, fixed_drafter
from modelhub.library.views import (
    DRAFT_DFLASH,
    DRAFT_EAGLE3,
    DRAFT_MODEL,
    DRAFT_MTP,
    DRAFT_MTP_DRAFTER,
    DRAFT_NGRAM,
    ModelView,
    ModelViews,
)
from modelhub.modelfile import PARAMETER_TYPES, check_parameter, coerce_option
from modelhub.runtime.loadspec import LoadSpec
from modelhub.runtime.memory import MemoryEstimate, adapters_estimate, estimate

log = logging.getLogger("modelhub.planning")

DEFAULT_NUM_CTX = DEFAULT_CONTEXT_LENGTH
LOAD_KEYS = (
    "num_ctx",
    "num_batch",
    "num_thread",
    "num_parallel",
    "num_gpu",
    "main_gpu",
    "rpc_servers",
    "draft_min",
    "draft_p_min",
    "draft_adaptive",
)
IGNORED_LOAD_KEYS = ("use_mmap",)
REQUEST_ONLY_KEYS = (
    "draft",
)  # options a request may give but a Modelfile may not  # llama.cpp maps the file whenever it can
RUNTIME_KEYS = (
    "num_predict",
    "num_keep",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "draft_num_predict",
    "draft",
)
DEFAULT_DRAFT_LEN = {
    DRAFT_MODEL: 4,
    DRAFT_MTP: 4,
    DRAFT_MTP_DRAFTER: 4,
    DRAFT_NGRAM: 16,
    DRAFT_EAGLE3: 4,
    DRAFT_DFLASH: 4,
}
# A caller-supplied prediction costs nothing to draft: allow long drafts (adaptive trims them).
PREDICTION_DRAFT_LEN = 16


# A request's ``draft`` option besides a drafter's name.
DRAFT_CHOICES = ("auto", "off")


@dataclass(frozen=True)
class DraftSettings:
    """The daemon's side of drafting: ``views`` finds draft models in the store and each
    model's state directory (None: neither), ``default`` is ``MODELHUB_DRAFT`` (how models
    without a DRAFT line draft), ``catalog_drafts`` the catalog's suggestions for a model."""

    views: ModelViews | None = None
    default: str = "auto"
    ngram_persist: bool = True
    catalog_drafts: Callable[[ModelView], list[str]] | None = None


@dataclass
class Plan:
    spec: LoadSpec
    options: dict[str, Any]  # runtime GenerateOptions fields
    draft_kind: str
    drafters: list[str] = field(default_factory=list)  # names a request's ``draft`` may use


def merged_options(view: ModelView, request_options: dict[str, Any] | None) -> dict[str, Any]:
    """The model's parameters overridden by the request's options, each checked against its
    type and range before any runner work (400 naming the option; unknown keys pass)."""
    merged = dict(view.parameters)
    for key, value in (request_options or {}).items():
        if value is None:
            continue
        if key not in PARAMETER_TYPES and key not in REQUEST_ONLY_KEYS:
            # As Ollama: a request's unknown option is ignored, and the log says so.
            log.warning("invalid option provided: %r (ignored)", key)
        if key == "rpc_servers":  # SEC-22: never a connection a remote party chooses
            raise InputError(
                "option rpc_servers cannot be set by a request: RPC workers come from the "
                "daemon's MODELHUB_RPC_SERVERS or a Modelfile PARAMETER the user created"
            )
        merged[key] = coerce_option(key, value)
        for item in merged[key] if isinstance(merged[key], list) else [merged[key]]:
            try:
                check_parameter(key, item)
            except ModelfileError as exc:
                raise InputError(f"option {exc.message}") from None
    threads = merged.get("num_thread")
    cores = os.cpu_count() or 1
    if isinstance(threads, int) and threads > cores:
        raise InputError(
            f"option num_thread must be at most {cores} (this machine's CPUs), got {threads}"
        )
    return merged


def plan(
    view: ModelView,
    request_options: dict[str, Any] | None,
    *,
    num_threads: int = 0,
    num_ctx: int = DEFAULT_NUM_CTX,
    prediction: bool = False,
    drafting: DraftSettings | None = None,
) -> Plan:
    """``num_ctx`` is the context when neither the request nor the model sets one (the
    daemon's ``MODELHUB_CONTEXT_LENGTH``)."""
    drafting = drafting or DraftSettings()
    if view.model_path is None or view.info is None:
        raise InputError(f"model '{view.name.display}' has no GGUF weights to load")
    opts = merged_options(view, request_options)
    num_ctx = _context_size(view, opts, request_options, num_ctx)
    draft = _draft_config(view, drafting)
    bound = int(draft.config["draft_num_predict"])
    config: dict[str, Any] = {
        "model_path": str(view.model_path),
        "n_ctx": num_ctx,
        "n_batch": int(opts.get("num_batch") or 512),
        "n_threads": int(opts.get("num_thread") or num_threads or 0),
        **draft.config,
        "draft_min": int(opts.get("draft_min") or 0),
        "draft_p_min": float(opts.get("draft_p_min") or 0.0),
        # 0: the daemon's MODELHUB_NUM_PARALLEL, else automatic (the scheduler decides).
        "n_parallel": int(opts.get("num_parallel") or 0),
    }
    # Only when set: the daemon's defaults (MODELHUB_NUM_GPU, MODELHUB_RPC_SERVERS) apply
    # otherwise, and models that do not set them keep their runner identity.
    for key in ("num_gpu", "main_gpu"):
        if key in opts:
            config[key] = int(opts[key])
    if opts.get("rpc_servers"):
        config["rpc_servers"] = split_endpoints(opts["rpc_servers"])
    if opts.get("draft_adaptive") is False:  # always draft_num_predict guesses, as llama.cpp
        config["adaptive"] = False
    if view.adapter_paths:
        # Only when present: models without one keep their runner identity.
        config["adapter_paths"] = [str(p) for p in view.adapter_paths]
    if view.projector_paths:  # the last projector layer: images in prompts
        config["projector_path"] = str(view.projector_paths[-1])
    if config["n_batch"] < bound + 1:
        raise InputError(f"num_batch {config['n_batch']} must be at least draft_num_predict + 1")
    runtime = _runtime_options(view, opts, draft.names, prediction, config["n_batch"], bound)
    details = view.details()
    base = estimate(view.info, num_ctx, config["n_batch"])
    base = base + adapters_estimate([a.size for a in view.adapters + view.projectors[-1:]])
    memory = base
    for info in draft.model_infos:  # draft models keep a KV cache of their own
        memory = memory + estimate(info, num_ctx, config["n_batch"])

    def spec_of(config: dict[str, Any], memory: MemoryEstimate, **kw: Any) -> LoadSpec:
        blob = view.model_layer.digest if view.model_layer else ""
        return LoadSpec.make(
            view.name.display, view.stored.digest, blob, config, details, memory, **kw
        )

    lean = None
    if draft.model_infos:  # when memory is short, the draft models go before the model does
        lean_config, dropped = _without_draft_models(config)
        note = (
            f"the draft model {dropped} was not loaded: there was not memory enough for it "
            "beside the model, which runs without it"
        )
        lean = spec_of(lean_config, base, note=note)
    spec = spec_of(config, memory, lean=lean)
    return Plan(spec=spec, options=runtime, draft_kind=draft.kind, drafters=draft.names)


def _context_size(
    view: ModelView, opts: dict[str, Any], asked: dict[str, Any] | None, default: int
) -> int:
    """The context to load: the options', else ``default``, capped at the trained length
    (beyond it only when nobody set it: a ``num_ctx`` set too long is refused)."""
    trained = (view.info.context_length if view.info else 0) or 0
    num_ctx = int(opts.get("num_ctx") or 0) or default
    if trained and num_ctx > trained:
        if "num_ctx" in (asked or {}) or "num_ctx" in view.parameters:
            raise InputError(
                f"num_ctx {num_ctx} exceeds the context length {trained} that "
                f"'{view.name.display}' was trained for; use num_ctx <= {trained}"
            )
        num_ctx = trained
    return max(num_ctx, 16)


def _runtime_options(
    view: ModelView,
    opts: dict[str, Any],
    drafters: list[str],
    prediction: bool,
    n_batch: int,
    bound: int,
) -> dict[str, Any]:
    """The options each request sends to the runner (``RUNTIME_KEYS``), checked."""
    runtime = {k: opts[k] for k in RUNTIME_KEYS if k in opts}
    if prediction:
        # A request with a prediction drafts from it whatever the model's DRAFT is.
        limit = int(runtime.get("draft_num_predict", PREDICTION_DRAFT_LEN))
        runtime["draft_num_predict"] = min(limit, n_batch - 1)
    elif "draft_num_predict" in runtime:
        runtime["draft_num_predict"] = min(int(runtime["draft_num_predict"]), bound)
    _check_draft_option(view, runtime, drafters)
    if "stop" in runtime and isinstance(runtime["stop"], str):
        runtime["stop"] = [runtime["stop"]]
    return runtime


@dataclass
class _Draft:
    config: dict[str, Any]  # EngineConfig's draft fields
    kind: str  # the engine's draft kind
    names: list[str]  # the drafters a request may name
    model_infos: list[GGUFInfo]  # draft models the runner loads (for the memory estimate)


def _draft_config(view: ModelView, drafting: DraftSettings) -> _Draft:
    """The runner's draft settings: ``DRAFT auto`` candidates, a fixed drafter, or none
    (``library.drafters``); n-gram is always there for requests that name it."""
    explicit = view.parameters.get("draft_num_predict")
    mode = draft_mode(view, drafting.default)
    if explicit == 0:
        mode = "none"  # PARAMETER draft_num_predict 0 turns drafting off
    config: dict[str, Any] = {"draft_kind": "none", "draft_num_predict": 0}
    views = drafting.views
    if views is not None and view.model_layer is not None:
        config["state_dir"] = str(views.store.drafting_dir(view.model_layer.digest))
        if not drafting.ngram_persist:
            config["ngram_persist"] = False
    fixed = fixed_drafter(view) if mode == "fixed" else None
    if fixed is not None:
        bound = int(explicit if explicit is not None else DEFAULT_DRAFT_LEN[fixed.kind])
        config.update(
            draft_kind=fixed.engine_kind,
            draft_path=str(fixed.path) if fixed.path else None,
            draft_name=fixed.name,
            draft_num_predict=bound,
        )
        names = [fixed.name] + ([] if fixed.kind == DRAFT_NGRAM else [DRAFT_NGRAM])
        infos = [fixed.info] if fixed.kind == DRAFT_MODEL and fixed.info else []
        return _Draft(config, fixed.engine_kind, names, infos)
    if mode == "none":
        return _Draft(config, "none", [DRAFT_NGRAM], [])
    suggested = drafting.catalog_drafts(view) if drafting.catalog_drafts else []
    found = auto_drafters(view, views, suggested) if views is not None else []
    candidates: list[dict[str, Any]] = [
        {
            "name": o.name,
            "kind": o.engine_kind,
            "path": str(o.path) if o.path else None,
            "max_k": int(explicit if explicit is not None else DEFAULT_DRAFT_LEN[o.kind]),
        }
        for o in found
    ]
    ngram_bound = int(explicit if explicit is not None else DEFAULT_DRAFT_LEN[DRAFT_NGRAM])
    config.update(
        draft_kind="auto",
        draft_num_predict=max([ngram_bound, *(int(c["max_k"]) for c in candidates)]),
        draft_candidates=candidates,
    )
    infos = [o.info for o in found if o.kind == DRAFT_MODEL and o.info is not None]
    return _Draft(config, "auto", [o.name for o in found] + [DRAFT_NGRAM], infos)


def _without_draft_models(config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``config`` without its draft models, and their names (quoted) for a message."""
    if config["draft_kind"] == "auto":
        candidates = config["draft_candidates"]
        dropped = [c["name"] for c in candidates if c["kind"] == "draft_model"]
        kept = [c for c in candidates if c["kind"] != "draft_model"]
        return {**config, "draft_candidates": kept}, ", ".join(f"'{n}'" for n in dropped)
    lean = {**config, "draft_kind": "none", "draft_path": None, "draft_num_predict": 0}
    return lean, f"'{config.get('draft_name') or 'draft_model'}'"


def _check_draft_option(view: ModelView, runtime: dict[str, Any], names: list[str]) -> None:
    """A request's ``draft``: auto, off, or the name of one of the model's drafters."""
    choice = runtime.get("draft")
    if choice is None:
        return
    if not isinstance(choice, str):
        raise InputError('option "draft" must be a string: auto, off or a drafter\'s name')
    if choice not in (*DRAFT_CHOICES, *names):
        raise InputError(
            f"model '{view.name.display}' has no drafter {choice!r}; its drafters: "
            f"{', '.join(names)} (or auto, off)"
        )


def split_endpoints(value: Any) -> list[str]:
    """``rpc_servers`` as given (lines of a Modelfile, a list, a comma-separated text)."""
    parts = value if isinstance(value, list) else [value]
    return [e.strip() for part in parts for e in str(part).split(",") if e.strip()]


def keep_alive_seconds(value: Any) -> float | None:
    """Request ``keep_alive`` -> seconds (inf = forever) or None (keep the runner's setting)."""
    if value is None:
        return None
    from modelhub.config import parse_duration

    seconds = parse_duration(value)
    return math.inf if seconds == math.inf else seconds
