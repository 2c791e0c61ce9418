"""Direct GGUF URLs (``https://.../foo.gguf``) and local files (``file:///.../foo.gguf``).

A URL pull stores the model as ``<host>/<last folder>/<file stem>:latest``; a file pull as
``local/<file stem>:latest``. Without a pinned digest, a URL download is verified by its size
and, when the server publishes one (``X-Linked-Etag``/``ETag`` holding a sha256, as Hugging
Face does), by that digest. A download whose digest is not known in advance is not resumed
by a later pull (the file may have changed in between); it starts again.
A local file must be a regular GGUF file; every other case gets the same error, so the pull
API cannot be used to probe which files exist (SEC-06).
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from modelhub.errors import InputError, SourceUnavailableError
from modelhub.pull.base import DownloadPolicy
from modelhub.pull.fetch import HttpBlobSource, probe_size
from modelhub.pull.http import HttpClient, describe_error
from modelhub.pull.single import FileToFetch, SingleFilePlan, partial_key
from modelhub.pull.transfers import HttpJob, Job, StreamJob
from modelhub.store import ModelName, Store, parse_digest
from modelhub.store.digests import CHUNK_SIZE

GGUF_MAGIC = b"GGUF"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]+")
_SHA256_TAG = re.compile(r'^(?:W/)?"?(?:sha256:)?([0-9a-f]{64})"?$', re.IGNORECASE)


def is_direct_url(ref: str) -> bool:
    """An http(s) reference to a file (``.gguf``), as opposed to a registry model name."""
    parts = urlsplit(ref.strip())
    return parts.scheme.lower() in ("http", "https") and parts.path.lower().endswith(".gguf")


def _part(text: str, fallback: str) -> str:
    cleaned = _UNSAFE.sub("-", text).strip("-.") or fallback
    return cleaned if cleaned[0].isalnum() else fallback


def url_model_name(url: str) -> ModelName:
    parts = urlsplit(url)
    segments = [unquote(s) for s in parts.path.split("/") if s]
    stem = segments[-1][: -len(".gguf")] if segments else "model"
    folder = segments[-2] if len(segments) > 1 else "files"
    host = _HOST_UNSAFE.sub("-", parts.netloc.rsplit("@", 1)[-1]).strip("-.") or "localhost"
    return ModelName.from_parts(
        host, _part(folder, "files").replace(".", "-")[:80], _part(stem, "model")[:80], "latest"
    )


def file_model_name(path: Path) -> ModelName:
    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
    return ModelName.from_parts("registry.ollama.ai", "local", _part(stem, "model")[:80], "latest")


def url_plan(
    client: HttpClient,
    url: str,
    *,
    pin: tuple[str, int] | None = None,
    name: ModelName | None = None,
    filename: str | None = None,
) -> SingleFilePlan:
    """Probe a GGUF URL (size, published digest) and plan its download."""
    parts = urlsplit(url)
    if parts.scheme.lower() == "http" and not client.insecure:
        raise InputError(f"{url}: plain http:// downloads need --insecure (insecure: true)")
    file_name = filename or unquote(parts.path.rsplit("/", 1)[-1]) or "model.gguf"
    if pin is not None:
        expected: str | None = pin[0]
        size: int | None = pin[1]
    else:
        expected, size = _published(client, url)
    if size is None:
        raise SourceUnavailableError(f"{url}: the server does not say how large the file is")
    total = size
    key = partial_key(expected, f"url:{url}")

    def make_job(store: Store, policy: DownloadPolicy) -> Job:
        source = HttpBlobSource(client, lambda: (url, {}), label=file_name)
        return HttpJob(store, source, key=key, expected=expected, total=total, policy=policy)

    item = FileToFetch(file_name, key, expected, total, make_job)
    return SingleFilePlan(name=name or url_model_name(url), model=item)


def _published(client: HttpClient, url: str) -> tuple[str | None, int | None]:
    """Size and, when the server states it, the sha256 of the file at ``url``."""
    digest = None
    try:
        # Not followed: Hugging Face states the digest on the redirect, not on the CDN.
        with client.open(url, method="HEAD", follow=False) as response:
            for header in ("x-linked-etag", "etag"):
                match = _SHA256_TAG.match(response.headers.get(header, "").strip())
                if match:
                    digest = parse_digest("sha256:" + match.group(1).lower())
                    break
    except httpx.TransportError as exc:
        raise SourceUnavailableError(f"{url}: {describe_error(exc)}") from exc
    return digest, probe_size(client, url, {})


# ----- file:// ------------------------------------------------------------------------------


def local_path(ref: str) -> Path:
    parts = urlsplit(ref.strip())
    if parts.netloc not in ("", "localhost"):
        raise InputError(f"{ref}: only local file:// URLs are supported")
    path = Path(unquote(parts.path))
    if not path.is_absolute():
        raise InputError(f"{ref}: a file:// URL needs an absolute path")
    return path


def file_plan(
    ref: str,
    *,
    pin: tuple[str, int] | None = None,
    name: ModelName | None = None,
    filename: str | None = None,
) -> SingleFilePlan:
    path = local_path(ref)
    size = _checked_size(path, ref)
    if pin is not None and pin[1] != size:
        raise SourceUnavailableError(f"{ref}: {size} bytes, the catalog pins {pin[1]}")
    expected = pin[0] if pin is not None else None
    key = partial_key(expected, f"file:{path}")

    @contextmanager
    def opener(cancel: threading.Event) -> Iterator[Iterator[bytes]]:
        with open(path, "rb") as handle:
            yield iter(lambda: handle.read(CHUNK_SIZE), b"")

    def make_job(store: Store, policy: DownloadPolicy) -> Job:
        return StreamJob(
            store, opener, key=key, expected=expected, total=size, policy=policy, label=path.name
        )

    item = FileToFetch(filename or path.name, key, expected, size, make_job)
    return SingleFilePlan(name=name or file_model_name(path), model=item)


def _checked_size(path: Path, ref: str) -> int:
    """Size of a regular GGUF file; one error for every other case (missing, dir, device)."""
    refused = InputError(f"{ref}: not a readable GGUF file")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise refused from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or os.pread(fd, 4, 0) != GGUF_MAGIC:
            raise refused
        return info.st_size
    except OSError as exc:
        raise refused from exc
    finally:
        os.close(fd)
