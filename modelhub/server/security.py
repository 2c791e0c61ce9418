"""DNS-rebinding and browser-origin guards (SEC-08, SEC-09), as a pure ASGI middleware.

A request whose ``Host`` is not a loopback/local name, or that carries a browser ``Origin``
outside the allow-list, is refused with 403 before any handler runs. The Host check applies
whatever address the daemon is bound to: a foreign name never reaches the API.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_ORIGINS = (
    "http://localhost",
    "https://localhost",
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1",
    "https://127.0.0.1",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://0.0.0.0",
    "https://0.0.0.0",
    "http://0.0.0.0:*",
    "https://0.0.0.0:*",
    "http://[::1]",
    "http://[::1]:*",
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
)
ALLOWED_HEADERS = (
    "Authorization, Content-Type, User-Agent, Accept, X-Requested-With, OpenAI-Beta, "
    "x-stainless-arch, x-stainless-async, x-stainless-custom-poll-interval, "
    "x-stainless-helper-method, x-stainless-lang, x-stainless-os, x-stainless-package-version, "
    "x-stainless-poll-helper, x-stainless-retry-count, x-stainless-runtime, "
    "x-stainless-runtime-version, x-stainless-timeout"
)
ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"


def split_host(host: str) -> str:
    """Host header -> host name without port or IPv6 brackets, lower-cased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host


def host_allowed(host: str, extra: Iterable[str] = ()) -> bool:
    name = split_host(host)
    if name == "":
        return True
    if name in ("localhost",) or name.endswith((".localhost",)):
        return True
    if name == socket.gethostname().lower():
        return True
    if any(fnmatch.fnmatch(name, pattern.lower()) for pattern in extra):
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    # Literal IPs cannot be rebound by DNS; private and loopback ones are the machine or its LAN.
    return addr.is_loopback or addr.is_private or addr.is_unspecified


def origin_allowed(origin: str, allowed: Iterable[str]) -> bool:
    origin = origin.strip().lower()
    for pattern in allowed:
        pattern = pattern.strip().lower()
        if pattern == "*" or fnmatch.fnmatchcase(origin, pattern):
            return True
    return False


class GuardMiddleware:
    def __init__(
        self, app: ASGIApp, origins: Iterable[str] = (), hosts: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.origins = tuple(DEFAULT_ORIGINS) + tuple(origins)
        self.hosts = tuple(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if not host_allowed(host, self.hosts):
            await _respond(send, 403)
            return
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None and not _same_origin(origin, host):
            if not origin_allowed(origin, self.origins):
                await _respond(send, 403)
                return
            cors = [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"vary", b"Origin"),
            ]
            if scope["method"] == "OPTIONS":
                await _respond(
                    send,
                    204,
                    [
                        *cors,
                        (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
                        (b"access-control-allow-headers", ALLOWED_HEADERS.encode()),
                        (b"access-control-max-age", b"43200"),
                    ],
                )
                return
        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + cors
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _same_origin(origin: str, host: str) -> bool:
    o = origin.strip().lower()
    return o in (f"http://{host.lower()}", f"https://{host.lower()}")


async def _respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": (headers or []) + [(b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b""})
