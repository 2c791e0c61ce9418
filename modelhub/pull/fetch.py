"""One remote blob as a byte range source over HTTP, with Range and size checks (STO-02/04)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

from modelhub.errors import SizeMismatchError, SourceUnavailableError
from modelhub.pull.base import RangeNotHonoured, TransientError
from modelhub.pull.http import HttpClient, describe_error, error_body, error_message

# (url, credentials for that url's origin)
Resolved = tuple[str, dict[str, str]]
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_RETRY_STATUS = {408, 425, 429}


class HttpBlobSource:
    """Where the bytes of one blob are fetched from; the URL may be resolved lazily."""

    def __init__(self, client: HttpClient, resolve: Callable[[], Resolved], label: str) -> None:
        self.client = client
        self._resolve = resolve
        self._resolved: Resolved | None = None
        self._lock = threading.Lock()  # parts start together; resolve the URL once
        self.label = label  # shown in error messages, e.g. the blob's short digest

    def resolved(self) -> Resolved:
        with self._lock:
            if self._resolved is None:
                self._resolved = self._resolve()
            return self._resolved

    def forget(self) -> None:
        """Drop a cached direct URL (a signed URL may have expired): resolve it again."""
        self._resolved = None

    @contextmanager
    def stream(self, start: int, end: int, total: int | None) -> Iterator[httpx.Response]:
        """Yield a response whose raw body holds bytes ``start..end`` (inclusive).

        A 200 answer to a request for a range that does not begin at 0 raises
        RangeNotHonoured; a 200 for a range at 0 is accepted (the caller stops reading at
        its end). Retryable failures raise TransientError; others SourceUnavailableError.
        """
        url, credentials = self.resolved()
        headers = {"Accept-Encoding": "identity"}
        if total is None or start != 0 or end + 1 != total:
            headers["Range"] = f"bytes={start}-{end}"
        try:
            with self.client.open(url, headers=headers, credentials=credentials) as response:
                self._check(response, start, end, total)
                yield response
        except httpx.TransportError as exc:
            raise TransientError(describe_error(exc)) from exc

    def _check(self, response: httpx.Response, start: int, end: int, total: int | None) -> None:
        status = response.status_code
        if status >= 400:
            message = error_message(status, error_body(response))
            if status in (401, 403):
                self.forget()  # an expired signed URL: resolve again on the next attempt
            if status >= 500 or status in _RETRY_STATUS or status in (401, 403):
                raise TransientError(message)
            raise SourceUnavailableError(f"{self.label}: {message}")
        encoding = response.headers.get("content-encoding", "identity").lower()
        if encoding not in ("", "identity"):
            raise SourceUnavailableError(
                f"{self.label}: the server compressed the blob ({encoding})"
            )
        if status == 206:
            self._check_content_range(response, start, end, total)
        elif status == 200:
            if start != 0:
                raise RangeNotHonoured()
            length = response.headers.get("content-length")
            if (
                total is not None
                and length is not None
                and length.isdigit()
                and int(length) != total
            ):
                raise SizeMismatchError(
                    f"{self.label}: the server sends {int(length)} bytes, "
                    f"{total} were expected; refused"
                )
        else:
            raise TransientError(f"unexpected HTTP {status}")

    def _check_content_range(
        self, response: httpx.Response, start: int, end: int, total: int | None
    ) -> None:
        match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
        if match is None:
            raise TransientError("a partial response without a valid Content-Range")
        first, last, size = int(match.group(1)), int(match.group(2)), match.group(3)
        if total is not None and size != "*" and int(size) != total:
            raise SizeMismatchError(
                f"{self.label}: the server says the blob has {size} bytes, "
                f"{total} were expected; refused"
            )
        if first != start or last > end or last < first:
            raise TransientError(
                f"the server sent bytes {first}-{last} when {start}-{end} were asked for"
            )


def probe_size(client: HttpClient, url: str, credentials: dict[str, str]) -> int | None:
    """The size of the resource at ``url`` (HEAD, then a one-byte range); None if unknown."""
    try:
        with client.open(url, method="HEAD", credentials=credentials) as response:
            length = response.headers.get("content-length", "")
            if response.status_code == 200 and length.isdigit():
                return int(length)
        headers = {"Range": "bytes=0-0", "Accept-Encoding": "identity"}
        with client.open(url, headers=headers, credentials=credentials) as response:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
            if response.status_code == 206 and match and match.group(3).isdigit():
                return int(match.group(3))
            length = response.headers.get("content-length", "")
            if response.status_code == 200 and length.isdigit():
                return int(length)
            if response.status_code >= 400:
                raise SourceUnavailableError(
                    f"{url}: {error_message(response.status_code, error_body(response))}"
                )
    except httpx.TransportError as exc:
        raise SourceUnavailableError(f"{url}: {describe_error(exc)}") from exc
    return None
