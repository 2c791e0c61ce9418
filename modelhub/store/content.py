"""Checks that a blob's content hashes to its name, remembered across daemon runs.

Hashing a model's weights costs a read of the whole file (about 0.5 to 2 GB/s, by CPU), too
much to do before every load. So a blob found right is remembered with its file's identity
(device, inode, size, modification and change times) in ``<root>/verified.json``: until the
file changes (any write, ``chmod`` or replacement changes its change time), a check compares
that identity and reads nothing. ``rehash`` reads the file whatever the record says (what
``modelhub verify`` does, to find decay that leaves the file's times alone).

The record is a cache: a lost or unreadable one only costs hashing again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from modelhub.errors import ModelhubError
from modelhub.store.digests import blob_path_in, parse_digest, sha256_file

log = logging.getLogger(__name__)

RECORD_NAME = "verified.json"
_MAX_RECORD_BYTES = 16 << 20

Identity = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class BlobProblem:
    """What is wrong with one blob: ``corrupt`` when its content does not hash to its name
    (else it is missing)."""

    message: str
    corrupt: bool = False


class ContentChecks:
    """The blobs of ``blobs_dir`` checked against their names, recorded in ``record``."""

    def __init__(self, blobs_dir: Path, record: Path) -> None:
        self.blobs_dir = blobs_dir
        self.record = record
        self._verified: dict[str, Identity] | None = None  # read on first use
        self._lock = threading.Lock()

    def check(self, digest: str, *, rehash: bool = False) -> BlobProblem | None:
        """None when the blob ``digest`` hashes to its name, else what is wrong with it."""
        path = blob_path_in(self.blobs_dir, digest)
        missing = BlobProblem(f'blob "{digest}" is missing from the store')
        try:
            identity = _identity(path)
        except FileNotFoundError:
            return missing
        if not rehash and self._known().get(digest) == identity:
            return None
        try:
            actual, _ = sha256_file(path)
        except FileNotFoundError:
            return missing
        if actual != digest:
            self._remember(digest, None)
            return BlobProblem(f'blob "{digest}" is corrupt: its content hashes to {actual}', True)
        # The identity stat saw before the hash: a write during the hash changes the file's
        # times, so the next check hashes again.
        self._remember(digest, identity)
        return None

    def _known(self) -> dict[str, Identity]:
        with self._lock:
            if self._verified is None:
                self._verified = self._read()
            return self._verified

    def _remember(self, digest: str, identity: Identity | None) -> None:
        with self._lock:
            known = self._verified if self._verified is not None else self._read()
            if identity is None:
                known.pop(digest, None)
            else:
                known[digest] = identity
            for gone in [d for d in known if not blob_path_in(self.blobs_dir, d).exists()]:
                del known[gone]
            self._verified = known
            self._write(known)

    def _read(self) -> dict[str, Identity]:
        try:
            with open(self.record, "rb") as handle:
                data = json.loads(handle.read(_MAX_RECORD_BYTES + 1))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s (blobs are hashed again): %s", self.record, exc)
            return {}
        known: dict[str, Identity] = {}
        for digest, value in data.items() if isinstance(data, dict) else []:
            with contextlib.suppress(ModelhubError, ValueError, TypeError):
                if isinstance(value, list) and len(value) == 5:
                    a, b, c, d, e = (int(v) for v in value)
                    known[parse_digest(digest)] = (a, b, c, d, e)
        return known

    def _write(self, known: dict[str, Identity]) -> None:
        temp = self.record.with_name(f".{self.record.name}.{os.getpid()}.tmp")
        try:
            temp.write_text(json.dumps({d: list(i) for d, i in sorted(known.items())}))
            os.replace(temp, self.record)
        except OSError as exc:  # only a cache: the next load hashes again
            log.warning("could not write %s: %s", self.record, exc)
            with contextlib.suppress(OSError):
                temp.unlink()


def _identity(path: Path) -> Identity:
    info = os.stat(path)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
