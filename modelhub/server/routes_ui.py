"""The web page (``modelhub/web/``): ``/`` and ``/ui/<file>``, static files shipped in the package.

``GET /`` answers a browser (an ``Accept`` that names ``text/html``) with the page and every
other client with Ollama's plain ``modelhub is running``, so health checks keep their answer.
``MODELHUB_UI=0`` turns the page off: ``/`` is always the plain text and ``/ui/*`` is 404.

Every file goes out with a Content-Security-Policy that allows scripts, styles and requests of
this origin only (no inline script or style, no other host), ``nosniff`` and no framing. The
page calls the API as any same-origin client; the Host/Origin guard applies to it unchanged.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

import modelhub

WEB_DIR = Path(modelhub.__file__).resolve().parent / "web"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self' data: blob:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

RUNNING = "modelhub is running"


def web_files(root: Path = WEB_DIR) -> dict[str, Path]:
    """The page's files by name: only these are served (no path is built from a request)."""
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if p.suffix in CONTENT_TYPES and p.is_file()}


def _file_response(path: Path, method: str) -> Response:
    body = b"" if method == "HEAD" else path.read_bytes()
    headers = dict(SECURITY_HEADERS)
    if method == "HEAD":
        headers["Content-Length"] = str(path.stat().st_size)
    return Response(body, media_type=CONTENT_TYPES[path.suffix], headers=headers)


def ui_router(enabled: bool) -> APIRouter:
    """The routes of ``/`` and ``/ui/<file>``; with ``enabled`` false, ``/`` only."""
    router = APIRouter(include_in_schema=False)
    files = web_files() if enabled else {}

    @router.api_route("/", methods=["GET", "HEAD"])
    async def root(request: Request) -> Response:
        index = files.get("index.html")
        if index is not None and "text/html" in request.headers.get("accept", ""):
            return _file_response(index, request.method)
        return PlainTextResponse(RUNNING)

    @router.api_route("/ui/{name}", methods=["GET", "HEAD"])
    async def asset(name: str, request: Request) -> Response:
        path = files.get(name)
        if path is None or name == "index.html":
            return PlainTextResponse("404 page not found", status_code=404)
        return _file_response(path, request.method)

    return router
