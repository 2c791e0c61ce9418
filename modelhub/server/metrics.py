"""Prometheus metrics: requests, tokens, loads, queue depth, running and queued sequences and
draft proposed/accepted per model (and per draft position)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from modelhub.engine.protocol import DoneResult

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "RequestCounter"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "modelhub_requests", "HTTP requests served", ["path", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "modelhub_prompt_tokens", "Prompt tokens evaluated", ["model"], registry=r
        )
        self.generated_tokens = Counter(
            "modelhub_generated_tokens", "Tokens generated", ["model"], registry=r
        )
        self.draft_proposed = Counter(
            "modelhub_draft_proposed_tokens",
            "Draft tokens proposed for verification",
            ["model"],
            registry=r,
        )
        self.draft_accepted = Counter(
            "modelhub_draft_accepted_tokens",
            "Draft tokens accepted by the target",
            ["model"],
            registry=r,
        )
        self.draft_accepted_at = Counter(
            "modelhub_draft_accepted_by_position_tokens",
            "Draft tokens accepted at each draft position (1 = the first guess of a round)",
            ["model", "position"],
            registry=r,
        )
        self.draft_proposed_at = Counter(
            "modelhub_draft_proposed_by_position_tokens",
            "Draft tokens verified at each draft position",
            ["model", "position"],
            registry=r,
        )
        self.loads = Gauge("modelhub_model_loads", "Runner loads since start", registry=r)
        self.loaded = Gauge("modelhub_models_loaded", "Runners resident now", registry=r)
        self.queue = Gauge("modelhub_queue_depth", "Requests waiting for a runner", registry=r)
        self.running = Gauge(
            "modelhub_sequences_running", "Requests generating now", ["model"], registry=r
        )
        self.queued = Gauge(
            "modelhub_sequences_queued", "Requests waiting for a sequence", ["model"], registry=r
        )

    def record(self, model: str, result: DoneResult) -> None:
        self.prompt_tokens.labels(model).inc(result.prompt_eval_count)
        self.generated_tokens.labels(model).inc(result.eval_count)
        self.draft_proposed.labels(model).inc(result.draft_count)
        self.draft_accepted.labels(model).inc(result.draft_accepted_count)
        counts = zip(
            result.draft_count_by_position, result.draft_accepted_by_position, strict=False
        )
        for i, (proposed, accepted) in enumerate(counts, start=1):
            self.draft_proposed_at.labels(model, str(i)).inc(int(proposed))
            self.draft_accepted_at.labels(model, str(i)).inc(int(accepted))

    def render(
        self, loads: int, loaded: int, waiting: int, per_model: dict[str, tuple[int, int]]
    ) -> bytes:
        """``per_model``: (running, queued) requests of each loaded model."""
        self.loads.set(loads)
        self.loaded.set(loaded)
        self.queue.set(waiting)
        self.running.clear()
        self.queued.clear()
        for model, (running, queued) in per_model.items():
            self.running.labels(model).set(running)
            self.queued.labels(model).set(queued)
        return generate_latest(self.registry)


class RequestCounter:
    """Pure ASGI middleware (streaming and disconnects pass through untouched)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = getattr(scope.get("route"), "path", "other")
            self.metrics.requests.labels(path, str(status)).inc()
