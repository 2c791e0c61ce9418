"""Stored ``/v1/responses`` answers: what ``previous_response_id``, ``GET``, ``DELETE`` and
``input_items`` read.

One JSON file per response in ``<models>/responses/<id>.json``, written atomically (a temp file
in the same folder, fsynced, renamed), owner-only. A record is self-contained: the response, the
input items of its request, and the conversation before them (``context``), so continuing from
it never needs an older record, and evicting one never breaks another. The folder is bounded in
count and in bytes (``MODELHUB_RESPONSES_MAX``, ``MODELHUB_RESPONSES_MAX_BYTES``); the oldest
records go first. A record that cannot be read (cut short, edited, not JSON) is an error naming
it, and it is removed; the daemon goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelhub.engine.speculative.ngram_file import write_atomic
from modelhub.errors import ResponseNotFoundError, StoreError

log = logging.getLogger("modelhub.server")

FORMAT = 1
_IDENT = re.compile(r"resp_[0-9a-f]{8,64}")
_FILE = re.compile(r"(resp_[0-9a-f]{8,64})\.json")


@dataclass(frozen=True)
class StoredResponse:
    """One stored answer: the response object, its request's input items (with ids) and the
    conversation that came before them."""

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    context: list[dict[str, Any]]

    @property
    def ident(self) -> str:
        return str(self.response["id"])

    def conversation(self) -> list[dict[str, Any]]:
        """The items a request continuing from this response starts with."""
        return [*self.context, *self.input_items, *self.response.get("output", [])]

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "response": self.response,
            "input_items": self.input_items,
            "context": self.context,
        }
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, ident: str) -> StoredResponse:
        """Parse a record; ValueError says what is wrong with it."""
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a stored response of format {FORMAT}")
        response, items, context = doc.get("response"), doc.get("input_items"), doc.get("context")
        if not isinstance(response, dict) or response.get("id") != ident:
            raise ValueError("its response is missing or has another id")
        if not isinstance(response.get("output"), list):
            raise ValueError("its response has no output list")
        lists: list[list[dict[str, Any]]] = []
        for name, value in (("input_items", items), ("context", context)):
            if not isinstance(value, list) or not all(isinstance(i, dict) for i in value):
                raise ValueError(f"its {name} is not a list of objects")
            lists.append(value)
        return cls(response, *lists)


def not_found(ident: str, param: str | None = None) -> ResponseNotFoundError:
    """OpenAI's 404 for a response id (``param`` set for ``previous_response_id``)."""
    what = "Previous response" if param == "previous_response_id" else "Response"
    return ResponseNotFoundError(
        f"{what} with id '{ident}' not found. Stored responses are kept until deleted or until "
        "newer ones push them out (MODELHUB_RESPONSES_MAX, MODELHUB_RESPONSES_MAX_BYTES).",
        param,
    )


class ResponseStore:
    """The folder of stored responses and its index (id -> bytes, oldest first).

    Methods do file I/O: the routes call them in a worker thread. A lock keeps the index and
    the folder in step."""

    def __init__(self, folder: Path, max_count: int, max_bytes: int, enabled: bool = True) -> None:
        self.folder = folder
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.enabled = enabled
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] | None = None  # read from the folder on first use

    def put(self, record: StoredResponse) -> bool:
        """Store ``record``; evict the oldest beyond the bounds. False when it was not stored
        (storing off, a record larger than the byte bound, or the disk refused it)."""
        if not self.enabled:
            return False
        data = record.to_bytes()
        if len(data) > self.max_bytes:
            log.warning(
                "response %s not stored: %d bytes, over MODELHUB_RESPONSES_MAX_BYTES (%d)",
                record.ident,
                len(data),
                self.max_bytes,
            )
            return False
        with self._lock:
            index = self._loaded()
            try:
                write_atomic(self._path(record.ident), data)
            except OSError as exc:
                log.warning("response %s not stored: %s", record.ident, exc.strerror or exc)
                return False
            index[record.ident] = len(data)
            index.move_to_end(record.ident)
            self._evict(index)
        return True

    def get(self, ident: str, param: str | None = None) -> StoredResponse:
        """The stored record; ResponseNotFoundError for an unknown id, StoreError (and the file
        removed) for a damaged one."""
        if not self.enabled or not _IDENT.fullmatch(ident):
            raise not_found(ident, param)
        with self._lock:
            index = self._loaded()
            path = self._path(ident)
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                index.pop(ident, None)
                raise not_found(ident, param) from None
            except OSError as exc:
                raise StoreError(
                    f"the stored response '{ident}' cannot be read ({exc.strerror or exc})"
                ) from exc
            try:
                return StoredResponse.from_bytes(raw, ident)
            except ValueError as exc:  # json's errors are ValueErrors too
                self._remove(index, ident)
                raise StoreError(
                    f"the stored response '{ident}' is damaged ({path.name}: {exc}); it was "
                    "removed: continue from another response, or send the whole conversation "
                    "in input"
                ) from exc

    def delete(self, ident: str) -> None:
        if not self.enabled or not _IDENT.fullmatch(ident):
            raise not_found(ident)
        with self._lock:
            index = self._loaded()
            if not self._path(ident).exists():
                index.pop(ident, None)
                raise not_found(ident)
            self._remove(index, ident)

    # ---- the index ------------------------------------------------------------------------
    def _path(self, ident: str) -> Path:
        return self.folder / f"{ident}.json"

    def _loaded(self) -> OrderedDict[str, int]:
        if self._index is None:
            self._index = self._scan()
            self._evict(self._index)  # the bounds may have been lowered since
        return self._index

    def _scan(self) -> OrderedDict[str, int]:
        """The records on disk, oldest first; temp files a killed daemon left are removed."""
        found: list[tuple[int, str, int]] = []
        try:
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return OrderedDict()
        except OSError as exc:
            log.warning("cannot read stored responses in %s: %s", self.folder, exc)
            return OrderedDict()
        for entry in entries:
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            m = _FILE.fullmatch(entry.name)
            if m is None:
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                found.append((st.st_mtime_ns, m[1], st.st_size))
        found.sort()
        return OrderedDict((ident, size) for _, ident, size in found)

    def _evict(self, index: OrderedDict[str, int]) -> None:
        total = sum(index.values())
        while index and (len(index) > self.max_count or total > self.max_bytes):
            ident = next(iter(index))
            total -= index[ident]
            self._remove(index, ident)

    def _remove(self, index: OrderedDict[str, int], ident: str) -> None:
        index.pop(ident, None)
        try:
            self._path(ident).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:  # left on disk; no longer counted or served
            log.warning("cannot remove the stored response %s: %s", ident, exc.strerror or exc)
