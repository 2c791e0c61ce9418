"""What the running daemon holds: settings, the store and the services built on it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

from fastapi import Request

from modelhub.config import Settings
from modelhub.errors import ModelhubError
from modelhub.library.views import ModelView, ModelViews
from modelhub.runtime.checked_runner import CheckedRunner
from modelhub.runtime.planning import DraftSettings, Plan, plan
from modelhub.runtime.scheduler import Scheduler
from modelhub.server.metrics import Metrics
from modelhub.server.responses_store import ResponseStore
from modelhub.server.system import has_local_accelerator
from modelhub.store import ModelName, Store


@dataclass
class ServerState:
    settings: Settings
    store: Store
    views: ModelViews
    scheduler: Scheduler
    metrics: Metrics = field(default_factory=Metrics)
    max_blob_size: int | None = None
    stored_responses: ResponseStore | None = None  # /v1/responses' store, made on first use
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("modelhub.server"))

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerState:
        store = Store(settings.models_dir, noprune=settings.noprune)
        scheduler = Scheduler(
            max_loaded=settings.max_loaded_models,
            default_keep_alive=settings.keep_alive,
            max_queue=settings.max_queue,
            memory_limit=settings.memory_limit,
            repack=settings.repack,
            num_parallel=settings.num_parallel,
            kv_cache_type=settings.kv_cache_type,
            flash_attention=settings.flash_attention,
            num_gpu=settings.num_gpu,
            rpc_servers=settings.rpc_servers,
            runner_timeout=settings.runner_timeout,
            accelerator_probe=has_local_accelerator,
            runner_factory=lambda label: CheckedRunner(label, store),
        )
        return cls(settings=settings, store=store, views=ModelViews(store), scheduler=scheduler)

    def plan(self, view: ModelView, options: dict[str, Any] | None, **kw: Any) -> Plan:
        """``runtime.planning.plan`` with this daemon's settings (threads, context, drafting)."""
        return plan(
            view,
            options,
            num_threads=self.settings.num_threads,
            num_ctx=self.settings.context_length,
            drafting=DraftSettings(
                views=self.views,
                default=self.settings.draft,
                ngram_persist=self.settings.ngram_persist,
                catalog_drafts=catalog_drafts,
            ),
            **kw,
        )

    @property
    def responses(self) -> ResponseStore:
        """The stored /v1/responses answers (``<models>/responses``), read on first use."""
        if self.stored_responses is None:
            s = self.settings
            self.stored_responses = ResponseStore(
                s.models_dir / "responses",
                s.responses_max,
                s.responses_max_bytes,
                s.responses_store,
            )
        return self.stored_responses

    def on_model_changed(self, name: ModelName) -> None:
        """A manifest was written or removed (the scheduler will drop stale runners here)."""
        self.log.debug("model changed: %s", name.display)


def catalog_drafts(view: ModelView) -> list[str]:
    """The model names the catalog suggests as drafts for ``view`` (DRAFT auto's store search
    takes them whatever their size)."""
    from modelhub.pull import default_catalog

    try:
        entry = default_catalog().get(view.name)
    except ModelhubError:  # an unreadable MODELHUB_CATALOG: pull reports it, drafting goes on
        return []
    return [d for d in entry.drafts if d not in ("mtp", "ngram")] if entry else []


def get_state(request: Request) -> ServerState:
    return cast(ServerState, request.app.state.modelhub)
