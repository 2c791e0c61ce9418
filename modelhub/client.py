"""HTTP client for the modelhub daemon; also the public Python API.

It speaks the Ollama-compatible ``/api/*`` routes. Failures come back as exceptions of our
hierarchy, typed by what the daemon answered (:func:`error_from_response`: the class the
daemon raised, which it names beside every error answer and in the last line of a stream that
failed; from the status alone for a server that does not name it: a 404 is a
``NotFoundError``, a 400 an ``InputError``, ...), and ``DaemonUnreachableError`` when nothing
answers, so callers branch on classes and never see a raw httpx traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlsplit

import httpx
from filelock import FileLock, Timeout

from modelhub import __version__
from modelhub.config import Settings, log_dir, parse_host
from modelhub.errors import (
    DaemonUnreachableError,
    ErrorKind,
    ModelhubError,
    error_for_status,
    rebuilt_error,
)

AUTOSTART_WAIT_SECONDS = 30.0
_UPLOAD_CHUNK = 1 << 20
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""})

ProgressCallback = Callable[[int, int], None]


def error_from_response(response: httpx.Response) -> ModelhubError:
    """The one place where an error answer of the daemon becomes a typed error: its class
    from the status, its message the daemon's own words (the CLI prints ``Error: <message>``
    whether the call streamed or not)."""
    headers = response.headers
    name, kind = headers.get("x-modelhub-error-class"), headers.get("x-modelhub-error-kind")
    return _typed(name, kind, response.status_code, _error_text(response))


def _typed(name: str | None, kind: str | None, status: int, message: str) -> ModelhubError:
    """The class the daemon named, else the class of the status."""
    if name and kind:
        return rebuilt_error(name, ErrorKind.named(kind), message)
    return error_for_status(status, message)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class Client:
    """Synchronous client for one daemon. Safe to reuse; close it (or use ``with``) when done."""

    def __init__(
        self,
        host: str | None = None,
        *,
        timeout: float | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        """``http`` replaces the HTTP client (e.g. Starlette's ``TestClient`` over the app, for
        tests that need the API but not a daemon process); its base URL is used as it is."""
        if http is not None:
            self._http = http
            self.base_url = str(http.base_url).rstrip("/")
            return
        self.base_url = parse_host(host).url if host else Settings.from_env().base_url
        # Reads may legitimately wait a long time (loading, quantizing); connecting should not.
        limits = httpx.Timeout(timeout, connect=timeout if timeout is not None else 10.0)
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=limits,
            headers={"User-Agent": f"modelhub/{__version__} (python)"},
            trust_env=False,  # a proxy from the environment must not intercept loopback calls
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- generic plumbing ---------------------------------------------------------------

    def _unavailable(self, exc: httpx.TransportError) -> DaemonUnreachableError:
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return DaemonUnreachableError(
                f"could not connect to modelhub at {self.base_url}: start it with `modelhub serve`"
            )
        # Connected, then the exchange broke (daemon stopped, timeout): say so, not "start it".
        detail = str(exc) or "no detail"
        return DaemonUnreachableError(
            f"the connection to modelhub at {self.base_url} failed "
            f"({exc.__class__.__name__}: {detail}); see the daemon's log"
        )

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    def request_json(self, method: str, path: str, body: Any = None) -> Any:
        """One request with an optional JSON body; the decoded JSON answer, or None if empty."""
        kwargs: dict[str, Any] = {"headers": {"Accept": "application/json"}}
        if body is not None:
            kwargs["json"] = body
        response = self._send(method, path, **kwargs)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise ModelhubError(
                f"the daemon sent a response that is not JSON: {response.text[:200]!r}"
            ) from exc

    def stream(self, method: str, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """Send ``body`` and yield each NDJSON object of the answer as it arrives.

        Raises the typed error of an HTTP error status (:func:`error_from_response`), or of a
        line carrying ``error`` (a failure mid-stream: the same class as before the stream).
        """
        headers = {"Accept": "application/x-ndjson"}
        try:
            with self._http.stream(method, path, json=body, headers=headers) as response:
                if response.status_code >= 400:
                    response.read()
                    raise error_from_response(response)
                for line in response.iter_lines():
                    if not line.strip():
                        continue
                    item = _decode_line(line)
                    if item.get("error"):
                        name, kind = item.get("error_class"), item.get("error_kind")
                        raise _typed(name, kind, 500, str(item["error"]))
                    yield item
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc

    # -- endpoints ------------------------------------------------------------------------

    def heartbeat(self) -> bool:
        """True when a daemon answers ``HEAD /`` at this address."""
        try:
            return self._http.head("/").status_code < 400
        except httpx.TransportError:
            return False

    def version(self) -> str:
        return str(self.request_json("GET", "/api/version")["version"])

    def list(self) -> list[dict[str, Any]]:
        answer = self.request_json("GET", "/api/tags") or {}
        return list(answer.get("models") or [])

    def show(
        self,
        model: str,
        *,
        verbose: bool = False,
        system: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model}
        if verbose:
            body["verbose"] = True
        if system is not None:
            body["system"] = system
        if options:
            body["options"] = options
        return dict(self.request_json("POST", "/api/show", body) or {})

    def copy(self, source: str, destination: str) -> None:
        self.request_json("POST", "/api/copy", {"source": source, "destination": destination})

    def delete(self, model: str) -> None:
        self.request_json("DELETE", "/api/delete", {"model": model})

    def blob_exists(self, digest: str) -> bool:
        try:
            response = self._http.head(f"/api/blobs/{quote(digest, safe=':')}")
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        if response.status_code == 404:
            return False
        if response.status_code >= 400:
            raise error_from_response(response)
        return True

    def push_blob(self, digest: str, path: Path, progress: ProgressCallback | None = None) -> None:
        """Upload ``path`` as the blob ``digest``, streaming it in 1 MiB chunks.

        ``progress(sent, total)`` is called after each chunk. The daemon verifies the digest.
        """
        total = path.stat().st_size

        def chunks(handle: IO[bytes]) -> Iterator[bytes]:
            sent = 0
            if progress:
                progress(0, total)
            while chunk := handle.read(_UPLOAD_CHUNK):
                sent += len(chunk)
                yield chunk
                if progress:
                    progress(sent, total)

        with path.open("rb") as handle:
            self._send(
                "POST",
                f"/api/blobs/{quote(digest, safe=':')}",
                content=chunks(handle),
                headers={"Content-Length": str(total), "Content-Type": "application/octet-stream"},
            )

    def create(self, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Stream the progress of ``POST /api/create`` (ends with ``{"status": "success"}``)."""
        return self.stream("POST", "/api/create", {**request, "stream": True})


def _error_text(response: httpx.Response) -> str:
    """The daemon's ``error`` text, or a readable description of a non-JSON error answer."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict) and payload.get("error"):
        return str(payload["error"])
    text = response.text.strip()
    return text[:500] if text else _reason(response.status_code).lower()


def _decode_line(line: str) -> dict[str, Any]:
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise ModelhubError(f"the daemon sent a malformed stream line: {line[:200]!r}") from exc
    if not isinstance(item, dict):
        raise ModelhubError(f"the daemon sent an unexpected stream line: {line[:200]!r}")
    return item


# -- autostart ------------------------------------------------------------------------------


def is_local_address(base_url: str) -> bool:
    """True when ``base_url`` points at this machine (where autostart makes sense)."""
    return (urlsplit(base_url).hostname or "") in _LOOPBACK_HOSTS


def ensure_server(client: Client, settings: Settings) -> None:
    """Make sure a daemon answers at ``client.base_url``, starting one in the background if
    none does (unless ``settings.no_autostart`` or the address is not on this machine)."""
    if client.heartbeat():
        return
    hint = f"could not connect to modelhub at {client.base_url}: start it with `modelhub serve`"
    if settings.no_autostart or not is_local_address(client.base_url):
        raise DaemonUnreachableError(hint)
    logs = log_dir()
    logs.mkdir(parents=True, exist_ok=True)
    # One starter at a time: concurrent CLI calls would otherwise race to bind the port.
    try:
        with FileLock(str(logs / "autostart.lock"), timeout=AUTOSTART_WAIT_SECONDS):
            if client.heartbeat():
                return
            _start_daemon(client, logs / "server.log", hint)
    except Timeout as exc:
        raise DaemonUnreachableError(
            f"{hint} (another modelhub is starting one and did not finish)"
        ) from exc


def _start_daemon(client: Client, log_file: Path, hint: str) -> None:
    print(
        f"modelhub: no daemon at {client.base_url}; starting one (log: {log_file})",
        file=sys.stderr,
        flush=True,
    )
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "modelhub", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the daemon outlives this command and its terminal
            env=os.environ.copy(),
            close_fds=True,
        )
    deadline = time.monotonic() + AUTOSTART_WAIT_SECONDS
    while time.monotonic() < deadline:
        if client.heartbeat():
            return
        code = process.poll()
        if code is not None:
            if client.heartbeat():  # another daemon won the port meanwhile
                return
            raise DaemonUnreachableError(
                f"{hint}: the daemon started in the background exited with status {code}; "
                f"see {log_file}{_log_tail(log_file)}"
            )
        time.sleep(0.2)
    with contextlib.suppress(OSError):
        process.terminate()
    raise DaemonUnreachableError(
        f"{hint}: the daemon started in the background did not answer within "
        f"{AUTOSTART_WAIT_SECONDS:.0f} s; see {log_file}{_log_tail(log_file)}"
    )


def _log_tail(log_file: Path, lines: int = 5) -> str:
    try:
        with log_file.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            text = handle.read().decode(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return ("\n" + "\n".join(text)) if text else ""
