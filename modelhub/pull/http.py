"""The one HTTP client every pull transport uses: checked redirects, bounded reads.

Redirects are followed hop by hop here rather than by httpx, so that every hop can be
checked before it is contacted (SEC-11): only http/https, no downgrade to http unless the
pull is insecure, never a link-local, unspecified or multicast address (cloud metadata
endpoints), and no private or loopback address when the pull started at a public one.
Credentials are bound to the origin they were meant for and are never sent to another one
(SEC-12). Bodies that are read into memory are capped (SEC-14).

Addresses are checked by resolving the host name; the connection resolves it again, so a
DNS answer that changes in between is not caught (documented in docs/pull.md).
"""

from __future__ import annotations

import ipaddress
import json
import platform
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from modelhub import __version__
from modelhub.errors import ForbiddenError, InputError, SourceUnavailableError
from modelhub.pull.base import DEFAULT_POLICY, DownloadPolicy

USER_AGENT = (
    f"modelhub/{__version__} ({platform.machine()} {platform.system().lower()}) "
    f"Python/{platform.python_version()}"
)
REDIRECT_CODES = (301, 302, 303, 307, 308)
KIND_TTL = 60.0  # seconds an address check is reused for a host
ERROR_BODY_LIMIT = 4096

# Address kinds, from most to least exposed.
PUBLIC, LOCAL, FORBIDDEN, UNRESOLVED = "public", "local", "forbidden", "unresolved"


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with default ports filled in: what credentials are bound to."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def address_kind(host: str) -> str:
    """Classify a host as public, local (loopback/private), forbidden, or unresolved."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return LOCAL
    try:
        return _ip_kind(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return UNRESOLVED  # the connection attempt will fail and say why
    kinds = {_ip_kind(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])) for info in infos}
    for kind in (FORBIDDEN, LOCAL, PUBLIC):
        if kind in kinds:
            return kind
    return UNRESOLVED


def _ip_kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:  # before is_reserved: ::1 lies in the reserved ::/8
        return LOCAL
    if ip.is_unspecified or ip.is_link_local or ip.is_multicast or ip.is_reserved:
        return FORBIDDEN
    if ip.is_private or not ip.is_global:
        return LOCAL
    return PUBLIC


def describe_error(exc: BaseException) -> str:
    """A short, human reason for a transport failure (no stack, no class soup)."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "connection timed out"
    if isinstance(exc, httpx.TimeoutException):
        return "stalled: no data within the stall timeout"
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {text}"
    return text


class HttpClient:
    """A pull's HTTP session: one connection pool, checked redirects, origin-bound secrets."""

    def __init__(self, policy: DownloadPolicy = DEFAULT_POLICY, *, insecure: bool = False):
        self.policy = policy
        self.insecure = insecure
        timeout = httpx.Timeout(
            policy.stall_timeout, connect=policy.connect_timeout, pool=policy.stall_timeout
        )
        # No cap on connections: every one belongs to a part thread, and one client serves all
        # concurrent pulls of the process (a cap would make parts queue and time out).
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=policy.parallel * 2)
        self._client = httpx.Client(
            timeout=timeout,
            limits=limits,
            follow_redirects=False,
            # Only encodings read_limited can inflate in bounded steps.
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "gzip, deflate"},
        )
        self._kinds: dict[str, tuple[float, str]] = {}  # host -> (when, kind)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----- address policy ----------------------------------------------------------------

    def kind_of(self, url: str) -> str:
        host = urlsplit(url).hostname or ""
        cached = self._kinds.get(host)
        if cached is None or time.monotonic() - cached[0] > KIND_TTL:
            cached = (time.monotonic(), address_kind(host))
            self._kinds[host] = cached
        return cached[1]

    def check_start(self, url: str) -> str:
        """Check the first URL of a request chain; returns its address kind."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise InputError(f"unsupported URL {url!r}: only http:// and https:// can be pulled")
        kind = self.kind_of(url)
        if kind == FORBIDDEN:
            raise ForbiddenError(
                f"refusing to connect to {parts.hostname}: link-local, unspecified and "
                "multicast addresses are never contacted"
            )
        return kind

    def check_redirect(self, current: str, location: str, start_kind: str) -> str:
        """Validate one redirect hop before it is followed; returns the absolute target."""
        target = urljoin(current, location.strip())
        parts = urlsplit(target)
        shown = target if len(target) <= 200 else target[:197] + "..."
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ForbiddenError(f"refusing a redirect to a non-HTTP(S) URL: {shown}")
        downgrade = parts.scheme.lower() == "http" and urlsplit(current).scheme == "https"
        if downgrade and not self.insecure:
            raise ForbiddenError(f"refusing a redirect from https to plain http: {shown}")
        kind = self.kind_of(target)
        if kind == FORBIDDEN:
            raise ForbiddenError(
                f"refusing a redirect to a link-local or unspecified address: {shown}"
            )
        if kind == LOCAL and start_kind == PUBLIC:
            raise ForbiddenError(
                f"refusing a redirect from a public host to a private one: {shown}"
            )
        return target

    # ----- requests --------------------------------------------------------------------------

    @contextmanager
    def open(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        credentials: dict[str, str] | None = None,
        follow: bool = True,
    ) -> Iterator[httpx.Response]:
        """Send a request and yield the (streamed) final response, closing it afterwards.

        ``credentials`` go only to the origin of ``url``; with ``follow=False`` a redirect
        response itself is yielded so that the caller can inspect its ``Location``.
        Transport failures raise httpx exceptions for the caller to classify.
        """
        start_kind = self.check_start(url)
        home = origin(url)
        for _ in range(self.policy.max_redirects + 1):
            sent = dict(headers or {})
            if credentials and origin(url) == home:
                sent.update(credentials)
            request = self._client.build_request(method, url, headers=sent)
            response = self._client.send(request, stream=True)
            location = response.headers.get("location")
            if not (follow and response.status_code in REDIRECT_CODES and location):
                try:
                    yield response
                finally:
                    response.close()
                return
            response.close()
            url = self.check_redirect(url, location, start_kind)
            if response.status_code == 303:
                method = "GET"
        raise SourceUnavailableError(f"too many redirects (more than {self.policy.max_redirects})")

    def get_bounded(
        self,
        url: str,
        limit: int,
        what: str,
        *,
        headers: dict[str, str] | None = None,
        credentials: dict[str, str] | None = None,
    ) -> tuple[httpx.Response, bytes]:
        """GET a small document (manifest, listing, token) whose decoded size is capped."""
        with self.open(url, headers=headers, credentials=credentials) as response:
            if response.status_code >= 400:
                return response, error_body(response)
            return response, read_limited(response, limit, what)


def read_limited(
    response: httpx.Response, limit: int, what: str, *, truncate: bool = False
) -> bytes:
    """The decoded body, refusing more than ``limit`` bytes (or cut there with ``truncate``).

    Compressed bodies are inflated here, at most ``limit + 1`` bytes at a time, because a
    decoder that inflates whole network chunks lets a 64 KB gzip bomb become 64 MB at once.
    """
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    too_large = InputError(f"{what} too large: over {limit} bytes; refused")
    declared = response.headers.get("content-length", "")
    if encoding in ("", "identity"):
        if declared.isdigit() and not truncate and int(declared) > limit:
            raise InputError(f"{what} too large: {int(declared)} bytes (the limit is {limit})")
        inflater = None
    elif encoding in ("gzip", "x-gzip", "deflate"):
        inflater = zlib.decompressobj(47)  # 32 + 15: a gzip or zlib header, detected
    else:
        raise InputError(f"{what}: unsupported Content-Encoding {encoding!r}")
    out = bytearray()
    for raw in response.iter_raw():
        if inflater is None:
            out += raw
        else:
            try:
                out += inflater.decompress(raw, limit + 1 - len(out))
            except zlib.error as exc:
                raise InputError(f"{what}: corrupt compressed body ({exc})") from exc
            if inflater.unconsumed_tail and not truncate:
                raise too_large
        if len(out) > limit:
            if truncate:
                break
            raise too_large
    return bytes(out[:limit])


def error_body(response: httpx.Response) -> bytes:
    """At most ERROR_BODY_LIMIT bytes of an error response (the rest is not read)."""
    try:
        return read_limited(response, ERROR_BODY_LIMIT, "error response", truncate=True)
    except (InputError, httpx.HTTPError):
        return b""


def error_message(status: int, body: bytes) -> str:
    """``<status>: <message>`` from a registry-style JSON error body, or its text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        doc: Any = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        errors = doc.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            text = str(errors[0].get("message") or errors[0].get("code") or text)
        elif isinstance(doc.get("error"), str):
            text = doc["error"]
    text = " ".join(text.split())[:300]
    return f"{status}: {text}" if text else f"HTTP {status}"


_shared: dict[tuple[DownloadPolicy, bool], HttpClient] = {}
_shared_lock = threading.Lock()


def shared_client(policy: DownloadPolicy, *, insecure: bool) -> HttpClient:
    """A process-wide client per (policy, insecure), kept open.

    A download started by one pull can outlive it (another pull may be waiting for the same
    blob), so no single pull may close the client its transfers use. Sharing also keeps
    connections to a registry alive from one pull to the next.
    """
    key = (policy, insecure)
    with _shared_lock:
        client = _shared.get(key)
        if client is None:
            client = _shared[key] = HttpClient(policy, insecure=insecure)
        return client
