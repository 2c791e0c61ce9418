"""Real HTTP servers on loopback for pull tests, with fault injection.

* ``FileServer``: plain files by path, with Range support (also the "CDN" others redirect to);
* ``RegistryServer``: the OCI distribution subset a pull uses (manifests, blobs, bearer token);
* ``HFServer``: a Hugging Face-like Hub (``/api/models/<repo>?blobs=true``, ``/resolve/``);
* ``PyPIServer``: a PEP 503 simple index serving wheels built by ``build_wheel``.

Faults (``Fault``) are attached per served path: statuses to answer first, connections dropped
after N bytes, corrupted bytes, ignored or wrong ranges, slow links, stalls, endless bodies,
redirects (to other hosts, or to non-HTTP schemes). Every request is logged with its headers
and the number of body bytes sent, so tests can assert what the client really did.

``serve_handler`` runs any hand-written ``BaseHTTPRequestHandler`` the same way (threaded, on a
free loopback port, for a ``with`` block), for tests that fake a daemon's few routes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import json
import os
import re
import socket
import threading
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from modelhub.pull.base import ProgressEvent
from modelhub.store import sha256_file

MEDIA_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_MODEL = "application/vnd.ollama.image.model"
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
SEND_CHUNK = 64 << 10


def sha256(data: bytes) -> str:
    """The digest of bytes in memory, ``sha256:<hex>`` (files: ``modelhub.store.sha256_file``)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Fault:
    """What to do wrong when serving one path. Counters make faults transient."""

    statuses: list[int] = field(default_factory=list)  # answered first, one per request
    drop_after: int | None = None  # close the connection after this many body bytes...
    drop_times: int = 1  # ...this many times
    corrupt_at: int | None = None  # flip the byte at this offset of the blob (every time)
    ignore_range: bool = False  # answer ranged requests with 200 and the whole body
    wrong_range_times: int = 0  # answer ranged requests with a range starting elsewhere
    rate: float | None = None  # bytes per second
    stall_after: int | None = None  # send this many bytes, then nothing for stall_seconds
    stall_seconds: float = 5.0
    stall_times: int = 1
    endless: bool = False  # no Content-Length, and random bytes after the blob, forever
    redirect: str | None = None  # answer 307 with this Location
    empty_body: bool = False  # 200 with Content-Length 0

    def take(self, counter: str) -> bool:
        """Consume one use of a counted fault; True while uses remain."""
        left = getattr(self, counter)
        if left > 0:
            setattr(self, counter, left - 1)
            return True
        return False


@dataclass
class Hit:
    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    sent: int = 0  # body bytes written


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _dispatch(self, method: str) -> None:
        owner = self.server.owner
        hit = Hit(method, self.path, {k.lower(): v for k, v in self.headers.items()})
        with owner.lock:
            owner.log.append(hit)
        self.hit = hit
        try:
            owner.handle(self, method)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
            self.close_connection = True

    # ----- helpers used by the servers -----------------------------------------------------

    def reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.hit.status = status
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            self.hit.sent += len(body)

    def reply_json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        self.reply(
            status,
            json.dumps(doc).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )

    def send_blob(self, data: bytes | Path, fault: Fault | None) -> None:
        """Serve a blob with Range support and the fault's misbehaviour."""
        fault = fault or Fault()
        if fault.statuses:
            status = fault.statuses.pop(0)
            self.reply(
                status,
                json.dumps(
                    {"errors": [{"code": "INJECTED", "message": f"injected {status}"}]}
                ).encode(),
            )
            return
        if fault.redirect:
            self.reply(307, headers={"Location": fault.redirect})
            return
        total = data.stat().st_size if isinstance(data, Path) else len(data)
        start, end, status = 0, total - 1, 200
        match = _RANGE.match(self.headers.get("Range", "").strip())
        if match and not fault.ignore_range and total > 0:
            start = int(match.group(1))
            end = min(int(match.group(2)), total - 1) if match.group(2) else total - 1
            status = 206
            if start >= total:
                self.reply(416, headers={"Content-Range": f"bytes */{total}"})
                return
        length = end - start + 1 if total else 0
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if status == 206:
            shown_start = start
            if fault.take("wrong_range_times"):
                shown_start = max(0, start - 1)
            headers["Content-Range"] = f"bytes {shown_start}-{end}/{total}"
        self.hit.status = status
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if fault.endless:
            self.send_header("Connection", "close")
            self.close_connection = True
        elif fault.empty_body:
            self.send_header("Content-Length", "0")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD" or fault.empty_body:
            return
        self._stream(data, start, length, fault)

    def _stream(self, data: bytes | Path, start: int, length: int, fault: Fault) -> None:
        # A counted fault is used up only by a response long enough to show it.
        drop = stall = None
        if fault.drop_after is not None and fault.drop_after < length and fault.take("drop_times"):
            drop = fault.drop_after
        if fault.stall_after is not None and fault.stall_after < length:
            stall = fault.stall_after if fault.take("stall_times") else None
        if isinstance(data, Path) and fault == Fault() and hasattr(os, "sendfile"):
            with open(data, "rb") as handle:
                sent = self.connection.sendfile(handle, start, length)
                self.hit.sent += sent
            return
        sent = 0
        position = start
        began = time.monotonic()
        with _reader(data) as read:
            while sent < length:
                size = min(SEND_CHUNK, length - sent)
                if drop is not None:
                    size = min(size, max(0, drop - sent))
                    if size == 0:
                        self._drop()
                        return
                if stall is not None and sent >= stall:
                    self.wfile.flush()
                    self.server.owner.stopping.wait(fault.stall_seconds)
                    self._drop()
                    return
                if stall is not None:
                    size = min(size, stall - sent)
                chunk = bytearray(read(position, size))
                if fault.corrupt_at is not None and position <= fault.corrupt_at < position + size:
                    chunk[fault.corrupt_at - position] ^= 0xFF
                self.wfile.write(chunk)
                sent += size
                position += size
                self.hit.sent += size
                if fault.rate:
                    delay = sent / fault.rate - (time.monotonic() - began)
                    if delay > 0 and self.server.owner.stopping.wait(delay):
                        return
        if fault.endless:
            while not self.server.owner.stopping.is_set():
                self.wfile.write(b"\0" * SEND_CHUNK)
                self.hit.sent += SEND_CHUNK

    def _drop(self) -> None:
        self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _reader:
    """Random access to a blob held in memory or in a file."""

    def __init__(self, data: bytes | Path) -> None:
        self.data = data
        self.handle: Any = None

    def __enter__(self) -> Any:
        if isinstance(self.data, Path):
            self.handle = open(self.data, "rb")
            return lambda pos, n: os.pread(self.handle.fileno(), n, pos)
        view = memoryview(self.data)
        return lambda pos, n: view[pos : pos + n]

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()


class _QuietServer(ThreadingHTTPServer):
    """Threads that die with the test; a client hanging up is not worth a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, OSError)):
            super().handle_error(request, client_address)


class _Server(_QuietServer):
    owner: LoopbackServer


@contextlib.contextmanager
def serve_handler(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free 127.0.0.1 port in a thread; yields ``"127.0.0.1:<port>"``.

    For a hand-written handler (a few fake daemon routes); the server is shut down and its port
    closed when the ``with`` block ends, also on an error.
    """
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 with a request log; use as a context manager."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[Hit] = []
        self.stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def handle(self, request: _Handler, method: str) -> None:
        request.reply(404, b"not found")

    def hits(self, path_part: str = "", method: str | None = None) -> list[Hit]:
        with self.lock:
            return [h for h in self.log if path_part in h.path and method in (None, h.method)]

    def bytes_sent(self, path_part: str = "") -> int:
        return sum(hit.sent for hit in self.hits(path_part))


class FileServer(LoopbackServer):
    """Serves ``files[path]`` (bytes or a file) with ranges; ``faults[path]`` misbehave."""

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, bytes | Path] = {}
        self.faults: dict[str, Fault] = {}

    def add(self, path: str, data: bytes | Path, fault: Fault | None = None) -> str:
        self.files[path] = data
        if fault is not None:
            self.faults[path] = fault
        return self.url + path

    def handle(self, request: _Handler, method: str) -> None:
        path = urlsplit(request.path).path
        if path not in self.files:
            request.reply(404, b"no such file")
            return
        request.send_blob(self.files[path], self.faults.get(path))


class RegistryServer(LoopbackServer):
    """An OCI registry: ``/v2/<ns>/<model>/manifests/<tag>`` and ``/blobs/<digest>``.

    ``token``: require ``Authorization: Bearer <token>`` (401 + challenge otherwise), issued
    by ``/token`` unless ``realm`` points elsewhere. ``cdn``: blobs answer 307 to the CDN.
    """

    def __init__(
        self, *, token: str | None = None, realm: str | None = None, cdn: FileServer | None = None
    ) -> None:
        super().__init__()
        self.token, self.realm, self.cdn = token, realm, cdn
        self.manifests: dict[str, bytes] = {}
        self.manifest_faults: dict[str, str] = {}  # "oversize" | "gzip-bomb"
        self.blobs: dict[str, bytes | Path] = {}
        self.faults: dict[str, Fault] = {}

    def add_blob(self, data: bytes | Path, fault: Fault | None = None) -> str:
        digest = sha256(data) if isinstance(data, bytes) else sha256_file(data)[0]
        self.blobs[digest] = data
        if fault is not None:
            self.faults[digest] = fault
        if self.cdn is not None:
            self.cdn.add(f"/cdn/{digest}", data, fault)
        return digest

    def add_model(
        self, repo: str, tag: str, layers: list[tuple[str, bytes]], config: bytes | None = None
    ) -> bytes:
        """Store the blobs and a manifest for them; returns the manifest bytes."""
        config = (
            config
            if config is not None
            else json.dumps(
                {
                    "model_format": "gguf",
                    "model_family": "llama",
                    "architecture": "amd64",
                    "os": "linux",
                }
            ).encode()
        )
        doc = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {
                "mediaType": MEDIA_CONFIG,
                "digest": self.add_blob(config),
                "size": len(config),
            },
            "layers": [
                {"mediaType": media, "digest": self.add_blob(data), "size": len(data)}
                for media, data in layers
            ],
        }
        raw = json.dumps(doc).encode()
        self.manifests[f"{repo}:{tag}"] = raw
        return raw

    def handle(self, request: _Handler, method: str) -> None:
        path = urlsplit(request.path).path
        if path == "/token":
            request.reply_json(200, {"token": self.token or "anonymous"})
            return
        match = re.fullmatch(r"/v2/([^/]+/[^/]+)/(manifests|blobs)/([^/]+)", path)
        if match is None:
            request.reply(404, b"not found")
            return
        repo, kind, ref = match.groups()
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            realm = self.realm or f"{self.url}/token"
            challenge = (
                f'Bearer realm="{realm}",service="test-registry",scope="repository:{repo}:pull"'
            )
            request.reply(
                401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": challenge}
            )
            return
        if kind == "manifests":
            self._manifest(request, f"{repo}:{ref}")
        elif ref not in self.blobs:
            request.reply(404, b'{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}')
        elif self.cdn is not None:
            request.reply(307, headers={"Location": f"{self.cdn.url}/cdn/{ref}"})
        else:
            request.send_blob(self.blobs[ref], self.faults.get(ref))

    def _manifest(self, request: _Handler, key: str) -> None:
        fault = self.manifest_faults.get(key)
        if fault == "oversize":  # 50 MB of JSON-ish bytes
            request.hit.status = 200
            request.send_response(200)
            request.send_header("Content-Length", str(50 << 20))
            request.end_headers()
            for _ in range(50 << 4):
                request.wfile.write(b" " * (64 << 10))
                request.hit.sent += 64 << 10
            return
        if fault == "gzip-bomb":
            bomb = gzip_bomb()
            request.reply(200, bomb, {"Content-Encoding": "gzip", "Content-Type": MEDIA_MANIFEST})
            return
        if key not in self.manifests:
            request.reply(
                404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}'
            )
            return
        request.reply(200, self.manifests[key], {"Content-Type": MEDIA_MANIFEST})


@functools.cache
def gzip_bomb(size: int = 64 << 20) -> bytes:
    """gzip of ``size`` spaces, built without holding them in memory (~64 KB per 64 MB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    block = b" " * (1 << 20)
    parts = [packer.compress(block) for _ in range(size // len(block))]
    return b"".join([*parts, packer.flush()])


class HFServer(LoopbackServer):
    """A Hugging Face-like Hub: listing API and ``resolve`` URLs redirecting to a CDN."""

    def __init__(self, cdn: FileServer, *, token: str | None = None) -> None:
        super().__init__()
        self.cdn, self.token = cdn, token
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commit = "0123456789abcdef0123456789abcdef01234567"

    def add_repo(
        self, repo: str, files: dict[str, bytes], faults: dict[str, Fault] | None = None
    ) -> None:
        self.repos[repo] = files
        for path, data in files.items():
            self.cdn.add(f"/lfs/{hashlib.sha256(data).hexdigest()}", data, (faults or {}).get(path))

    def handle(self, request: _Handler, method: str) -> None:
        parts = urlsplit(request.path)
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            request.reply(401, b'{"error":"Invalid credentials"}')
            return
        match = re.fullmatch(r"/api/models/([^/]+/[^/]+)", parts.path)
        if match:
            files = self.repos.get(match.group(1))
            if files is None:
                request.reply_json(404, {"error": "Repository not found"})
                return
            siblings = [
                {
                    "rfilename": path,
                    "size": len(data),
                    "lfs": {
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    },
                }
                for path, data in files.items()
            ]
            request.reply_json(
                200, {"id": match.group(1), "sha": self.commit, "siblings": siblings}
            )
            return
        match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", parts.path)
        if match and match.group(3) in self.repos.get(match.group(1), {}):
            data = self.repos[match.group(1)][match.group(3)]
            digest = hashlib.sha256(data).hexdigest()
            request.reply(
                302,
                headers={
                    "Location": f"{self.cdn.url}/lfs/{digest}",
                    "X-Linked-Etag": f'"{digest}"',
                    "X-Linked-Size": str(len(data)),
                },
            )
            return
        request.reply(404, b"Entry not found")


class PyPIServer(FileServer):
    """A PEP 503 simple index: ``/simple/<project>/`` links to ``/files/<wheel>``."""

    def add_wheel(self, wheel: Path) -> None:
        self.add(f"/files/{wheel.name}", wheel.read_bytes())

    def handle(self, request: _Handler, method: str) -> None:
        path = urlsplit(request.path).path
        match = re.fullmatch(r"/simple/([^/]+)/?", path)
        if match is None:
            super().handle(request, method)
            return
        project = _normal(match.group(1))
        links = []
        for file_path, data in self.files.items():
            name = file_path.rsplit("/", 1)[-1]
            if _normal(name.split("-")[0]) == project:
                assert isinstance(data, bytes)
                digest = hashlib.sha256(data).hexdigest()
                links.append(
                    f'<a href="/files/{html.escape(name)}#sha256={digest}">'
                    f"{html.escape(name)}</a><br/>"
                )
        if not links:
            request.reply(404, b"no such project")
            return
        body = ("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>").encode()
        request.reply(200, body, {"Content-Type": "text/html"})


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_wheel(directory: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid pure-Python wheel holding ``members`` (pip accepts it)."""
    module = re.sub(r"[-_.]+", "_", dist).lower()
    info = f"{module}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{name},sha256={_b64(data)},{len(data)}" for name, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = Path(directory) / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def _b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def fast_policy(**overrides: Any) -> Any:
    """A download policy sized for tests: small parts, short timeouts, quick retries."""
    from modelhub.pull import DownloadPolicy

    values: dict[str, Any] = dict(
        connect_timeout=2.0,
        stall_timeout=1.0,
        attempts=3,
        backoff=0.01,
        backoff_max=0.05,
        part_min=256 << 10,
        part_max=1 << 20,
        parallel=4,
        progress_interval=0.02,
        state_interval=0.05,
        space_margin=0,
    )
    values.update(overrides)
    return DownloadPolicy(**values)


class Recorder:
    """Collects progress events (thread-safe), as the JSON objects a stream would carry, and
    summarises them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, event: ProgressEvent) -> None:
        with self._lock:
            self.items.append(event.to_json())

    @property
    def statuses(self) -> list[str]:
        return [str(item["status"]) for item in self.items]

    @property
    def warnings(self) -> list[str]:
        """The warnings' texts (their own field; the status adds ``warning: ``)."""
        return [str(item["warning"]) for item in self.items if "warning" in item]

    def compact(self) -> list[str]:
        """Statuses with consecutive repeats collapsed (progress ticks become one line)."""
        out: list[str] = []
        for status in self.statuses:
            if not out or out[-1] != status:
                out.append(status)
        return out
