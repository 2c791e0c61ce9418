"""The daemon: a FastAPI app behind the Host/Origin guard, served by uvicorn."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from modelhub import __version__
from modelhub.config import Settings
from modelhub.errors import InputError, ModelhubError, error_for_status
from modelhub.server.errors import api_of, error_response
from modelhub.server.metrics import CONTENT_TYPE_LATEST, RequestCounter
from modelhub.server.routes_audio import router as audio_router
from modelhub.server.routes_completions import router as completions_router
from modelhub.server.routes_inference import router as inference_router
from modelhub.server.routes_info import router as info_router
from modelhub.server.routes_messages import router as messages_router
from modelhub.server.routes_models import router as models_router
from modelhub.server.routes_openai import router as openai_router
from modelhub.server.routes_responses import router as responses_router
from modelhub.server.routes_ui import ui_router
from modelhub.server.security import GuardMiddleware
from modelhub.server.state import ServerState

log = logging.getLogger("modelhub.server")


def create_app(settings: Settings, state: ServerState | None = None) -> FastAPI:
    st = state or ServerState.from_settings(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await st.scheduler.close()  # SIGINT/SIGTERM: unload every runner

    app = FastAPI(
        title="modelhub", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan
    )
    app.state.modelhub = st

    app.add_middleware(RequestCounter, metrics=st.metrics)

    @app.get("/metrics")
    async def metrics() -> Response:
        sched = st.scheduler
        per_model: dict[str, tuple[int, int]] = {}
        for r in sched.runners.values():
            running, queued = per_model.get(r.spec.name, (0, 0))
            per_model[r.spec.name] = (running + r.running, queued + r.queued)
        body = st.metrics.render(sched.loads_total, len(sched.runners), sched.waiting, per_model)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/api/version", methods=["GET", "HEAD"])
    async def version() -> Response:
        return JSONResponse({"version": __version__})

    app.include_router(ui_router(settings.ui))  # GET / (the web page or "modelhub is running")
    app.include_router(models_router)
    app.include_router(inference_router)
    app.include_router(completions_router)
    app.include_router(audio_router)  # /v1/audio/transcriptions
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(messages_router)
    app.include_router(info_router)

    # Every error answer is built by server/errors.py, in the family of the request's path.
    @app.exception_handler(ModelhubError)
    async def modelhub_error(request: Request, exc: ModelhubError) -> Response:
        return error_response(exc, api_of(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        error = InputError(f"{where}: {first.get('msg', 'invalid request')}")
        return error_response(error, api_of(request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return PlainTextResponse("404 page not found", status_code=404)
        if exc.status_code == 405:
            return PlainTextResponse("405 method not allowed", status_code=405)
        error = error_for_status(exc.status_code, str(exc.detail))
        response = error_response(error, api_of(request.url.path))
        response.status_code = exc.status_code  # a status without a kind of ours stays as it is
        return response

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        return error_response(exc, api_of(request.url.path))

    return app


def build_asgi(settings: Settings, state: ServerState | None = None) -> GuardMiddleware:
    # The name the daemon was told to listen on is, by definition, a name for this machine.
    hosts = (settings.host,) if settings.host else ()
    return GuardMiddleware(create_app(settings, state), origins=settings.origins, hosts=hosts)


def serve(settings: Settings) -> None:
    """Run the daemon in the foreground until interrupted."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    state = ServerState.from_settings(settings)
    debris = state.store.clean_work_area()  # what a daemon killed mid-quantize left
    if debris:
        log.info("removed %d leftover work folder(s): %s", len(debris), ", ".join(debris))
    removed = state.store.prune() if not settings.noprune else []
    if removed:
        log.info("pruned %d unreferenced blob(s)", len(removed))
    host = settings.host or "0.0.0.0"
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s: anyone who can reach this address can use the API", host)
    print(
        f"modelhub {__version__} listening on {settings.base_url} (models: {settings.models_dir})",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        build_asgi(settings, state),
        host=host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
