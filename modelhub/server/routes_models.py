"""Ollama-compatible model management routes: tags, show, create, copy, delete, blobs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelhub.errors import (
    InvalidDigestError,
    ModelhubError,
    NotFoundError,
)
from modelhub.gguf.info import capabilities, model_info_for_show
from modelhub.library.create import CreateRequest, Creator
from modelhub.library.views import ModelView
from modelhub.modelfile import RenderSpec, format_parameters, render_modelfile
from modelhub.pull.base import Progress
from modelhub.runtime.planning import DEFAULT_DRAFT_LEN
from modelhub.server.drafting_view import drafting_payload
from modelhub.server.images import projector_facts
from modelhub.server.inventory import list_entries, verify_models
from modelhub.server.lookup import find_model
from modelhub.server.offloop import off_loop
from modelhub.server.request_models import (
    CopyBody,
    CreateBody,
    DeleteBody,
    PullBody,
    ShowBody,
    VerifyBody,
    openapi_body,
    parse_body,
    read_request,
)
from modelhub.server.requests import read_json
from modelhub.server.state import ServerState, get_state
from modelhub.server.streaming import run_streaming
from modelhub.store import parse_digest, parse_name

router = APIRouter()


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(request: Request) -> Response:
    """Every model; a damaged one with ``state: damaged`` and what is wrong (server.inventory)."""
    state = get_state(request)
    models = await asyncio.to_thread(list_entries, state.store, state.views)
    return JSONResponse({"models": models})


@router.post("/api/verify", openapi_extra=openapi_body(VerifyBody))
async def verify(request: Request) -> Response:
    """Re-hash the blobs of ``model`` (every model without one): ``{"models": [reports]}``."""
    state = get_state(request)
    headers = request.headers
    has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    data = await read_json(request) if has_body else {}  # no body: every model
    raw = parse_body(VerifyBody, data).model
    name = parse_name(raw) if raw else None
    try:
        reports = await asyncio.to_thread(verify_models, state.store, state.views, name)
    except NotFoundError:
        raise NotFoundError(f"model '{raw}' not found") from None
    return JSONResponse({"models": reports})


def show_payload(
    view: ModelView, verbose: bool, system: str | None, options: dict[str, Any]
) -> dict[str, Any]:
    params = dict(view.parameters)
    params.update(options)
    draft = view.draft
    draft_line: str | None = None
    if draft is not None:
        draft_line = str(view.draft_path) if view.draft_path is not None else str(draft.get("kind"))
    spec = RenderSpec(
        short_name=view.name.display,
        from_line=str(view.model_path) if view.model_path else view.name.display,
        adapters=[str(p) for p in view.adapter_paths],
        draft=draft_line,
        template=view.template,
        system=system if system else view.system,
        renderer=view.config.get("renderer"),
        parser=view.config.get("parser"),
        parameters=params,
        licenses=view.licenses,
        messages=[
            {"role": m.get("role", ""), "content": m.get("content", "")} for m in view.messages
        ],
    )
    out: dict[str, Any] = {}
    if view.licenses:
        out["license"] = "\n".join(view.licenses)
    out["modelfile"] = render_modelfile(spec)
    if params:
        out["parameters"] = format_parameters(params)
    template = view.template or (view.info.chat_template if view.info else None) or ""
    out["template"] = template
    if system or view.system:
        out["system"] = system or view.system
    out["details"] = view.details()
    if view.messages:
        out["messages"] = view.messages
    if view.info is not None:
        out["model_info"] = model_info_for_show(view.info, verbose)
        out["capabilities"] = capabilities(view.info, view.template)
        seen, projector = projector_facts(view)  # images: a usable projector
        out["capabilities"] += seen
        if projector is not None:
            out["projector_info"] = projector
        if verbose:
            out["tensors"] = [
                {"name": t.name, "type": t.type_name, "shape": list(t.shape)}
                for t in view.info.tensors
            ]
    else:
        out["model_info"] = {}
        out["capabilities"] = []
    if draft is not None:
        out["draft"] = _draft_summary(view, params)
    if view.adapters:
        out["adapters"] = view.adapter_summaries()
    out["modified_at"] = view.modified_at
    for key in ("renderer", "parser", "requires"):  # Ollama's ShowResponse fields, when set
        if view.config.get(key):
            out[key] = view.config[key]
    return out


def _draft_summary(view: ModelView, params: dict[str, Any]) -> dict[str, Any]:
    draft = dict(view.draft or {})
    if view.draft_layer is not None:
        draft["digest"] = view.draft_layer.digest
        draft["from"] = view.draft_layer.from_ or ""
        draft["size"] = view.draft_layer.size
    for key in ("draft_num_predict", "draft_min", "draft_p_min", "draft_adaptive"):
        if key in params:
            draft[key] = params[key]
    # the bound in effect, also when the Modelfile leaves it to the drafter kind's default
    draft.setdefault("draft_num_predict", DEFAULT_DRAFT_LEN.get(str(draft.get("kind")), 0))
    return draft


@router.post("/api/show", openapi_extra=openapi_body(ShowBody))
async def show(request: Request) -> Response:
    state = get_state(request)
    req = await read_request(request, ShowBody)
    view = await find_model(state, req.model)
    payload = show_payload(view, req.verbose, req.system or None, req.options)
    if view.model_layer is not None:
        payload["drafting"] = await drafting_payload(state, view)
    for loaded in state.scheduler.snapshot():  # loaded now: where llama.cpp placed it
        if loaded.spec.digest == view.stored.digest:
            info = loaded.info
            payload["runtime"] = {
                "offload": info.offload,
                "devices": list(info.devices),
                "layers_offloaded": info.placement.layers_offloaded,
                "size_vram": info.placement.size_device,
                "draft_devices": list(info.draft_devices),
            }
            break
    return JSONResponse(payload)


@router.delete("/api/delete", openapi_extra=openapi_body(DeleteBody))
async def delete(request: Request) -> Response:
    state = get_state(request)
    raw = (await read_request(request, DeleteBody)).model
    name = parse_name(raw)
    try:
        await asyncio.to_thread(state.store.delete, name)
    except NotFoundError as exc:
        raise NotFoundError(f"model '{raw}' not found") from exc
    state.on_model_changed(name)
    return Response(status_code=200)


@router.post("/api/copy", openapi_extra=openapi_body(CopyBody))
async def copy(request: Request) -> Response:
    state = get_state(request)
    req = await read_request(request, CopyBody)
    src_raw, dst_raw = req.source, req.destination
    src, dst = parse_name(src_raw), parse_name(dst_raw)
    try:
        await asyncio.to_thread(state.store.copy, src, dst)
    except NotFoundError as exc:
        raise NotFoundError(f"model '{src_raw}' not found") from exc
    return Response(status_code=200)


@router.head("/api/blobs/{digest}")
async def blob_head(request: Request, digest: str) -> Response:
    state = get_state(request)
    try:
        canonical = parse_digest(digest, lenient=True)
    except ModelhubError:
        raise InvalidDigestError("invalid digest format") from None
    if state.store.has_blob(canonical):
        return Response(status_code=200)
    return Response(status_code=404)


@router.post("/api/blobs/{digest}")
async def blob_upload(request: Request, digest: str) -> Response:
    state = get_state(request)
    expected = parse_digest(digest)  # strict: the digest we compare against byte for byte
    if state.store.has_blob(expected):
        return Response(status_code=200)
    writer = state.store.blob_writer(max_size=state.max_blob_size)
    try:
        async for chunk in request.stream():
            if chunk:
                await asyncio.to_thread(writer.write, chunk)
        await asyncio.to_thread(writer.commit, expected)
    except BaseException:
        writer.abort()
        raise
    return Response(status_code=201)


def create_request(body: CreateBody) -> CreateRequest:
    return CreateRequest(
        model=parse_name(body.model),
        from_=body.from_.strip() or None,
        files=dict(body.files),
        adapters=dict(body.adapters),
        draft_files=dict(body.draft_files),
        draft=body.draft.strip() or None,
        template=body.template or None,
        system=body.system or None,
        parameters=dict(body.parameters),
        messages=body.messages,
        license=list(body.license),
        quantize=body.quantize or body.quantization or None,
        draft_quantize=body.draft_quantize or None,
        requires=body.requires or None,
        renderer=body.renderer or None,
        parser=body.parser or None,
    )


def checked_create(data: dict[str, Any]) -> tuple[CreateRequest, bool]:
    """The create request of ``data`` and whether to stream, with the checks that need no store
    (a template's parse)."""
    from modelhub.library.create import check_request
    from modelhub.server.modelfile_body import with_modelfile

    body = parse_body(CreateBody, with_modelfile(data))  # a "modelfile" text: its fields
    req = create_request(body)
    check_request(req)
    return req, body.stream


@router.post("/api/create", openapi_extra=openapi_body(CreateBody))
async def create(request: Request) -> Response:
    state: ServerState = get_state(request)
    data = await read_json(request)
    # 400s before anything is streamed; a template's parse takes seconds when it is large
    req, stream = await off_loop(checked_create, data)

    def job(emit: Progress) -> None:
        Creator(state.store, state.views, emit).run(req)
        state.on_model_changed(req.model)

    return await run_streaming(job, stream)


@router.post("/api/pull", openapi_extra=openapi_body(PullBody))
async def pull(request: Request) -> Response:
    from modelhub.library.pulled import installer
    from modelhub.pull import pull_model

    state = get_state(request)
    req = await read_request(request, PullBody)
    cancel = threading.Event()

    def job(emit: Progress) -> None:
        name = pull_model(
            state.store,
            req.model,
            insecure=req.insecure,
            no_draft=req.no_draft,
            progress=emit,
            install=installer(state.store),
            cancel=cancel,
        )
        state.on_model_changed(name)

    return await run_streaming(job, req.stream, cancel)


@router.post("/api/prune")
async def prune(request: Request) -> Response:
    """Remove unreferenced blobs and abandoned partial downloads (``modelhub prune``)."""
    from modelhub.pull import prune_partials

    state = get_state(request)

    def work() -> tuple[list[str], int]:
        before = _dir_size(state.store.blobs_dir)
        removed = prune_partials(state.store, older_than=0)
        # A blob uploaded in the last minutes may be waiting for its /api/create: keep it.
        removed += state.store.prune(grace_seconds=600)
        return removed, max(0, before - _dir_size(state.store.blobs_dir))

    removed, freed = await asyncio.to_thread(work)
    return JSONResponse({"removed": removed, "freed": freed})


def _dir_size(path: Any) -> int:
    total = 0
    for entry in os.scandir(path):
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


@router.get("/api/catalog")
async def catalog(request: Request) -> Response:
    """The catalog of short names ``modelhub pull`` knows (``modelhub list --catalog``)."""
    from modelhub.pull import default_catalog

    return JSONResponse({"models": default_catalog().listing()})
