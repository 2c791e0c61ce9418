"""The on-disk form of an n-gram pool: a small, bounded, versioned file written atomically.

Layout (little-endian), version 1::

    offset  size      field
    0       8         magic  b"MHNGRAM\\0"
    8       4         version (u32) = 1
    12      4         n_match of the pool that wrote it (u32, for people; any pool can load it)
    16      8         hash fingerprint (u64): the key of a fixed 16-gram, so a file written with
                      another n-gram hash is recognised as such rather than misread
    24      4         count N (u32)
    28      4         CRC-32 of the payload (u32)
    32      8 N       keys (u64), ascending, never 0
    32+8N   4 N       next tokens (i32, >= 0)
    32+12N  N         hits (u8, >= 1)

So a file is ``32 + 13 N`` bytes. The writer keeps ``N`` under a byte budget
(:data:`DEFAULT_MAX_BYTES`, 4 MiB: 322,638 entries); :func:`read_entries` refuses anything that is
not exactly such a file, and anything larger than :data:`MAX_READ_BYTES`, before reading it.
The file holds hashes of token n-grams and the token ids that followed them: text a model read
and wrote, in a form that takes that model's tokenizer to turn back into words.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import tempfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

log = logging.getLogger("modelhub.engine")

MAGIC = b"MHNGRAM\0"
VERSION = 1
HEADER = struct.Struct("<8sIIQII")
ENTRY_BYTES = 8 + 4 + 1
DEFAULT_MAX_BYTES = 4 << 20
MAX_READ_BYTES = 64 << 20  # a file above this is not read at all (no version writes one)


class NgramFileError(ValueError):
    """A pool file that cannot be used; the message says why (logged, never raised to users)."""


@dataclass(frozen=True)
class NgramEntries:
    """Table entries: parallel arrays of keys, next tokens and hit counts."""

    keys: npt.NDArray[np.uint64]
    tokens: npt.NDArray[np.int32]
    hits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def max_entries(max_bytes: int) -> int:
    """How many entries a file of at most ``max_bytes`` holds."""
    if max_bytes < HEADER.size:
        raise ValueError(f"max_bytes must be at least {HEADER.size} (the header)")
    return (max_bytes - HEADER.size) // ENTRY_BYTES


def select_entries(
    table: NgramEntries, recent_keys: Iterable[int], shift: int, limit: int
) -> NgramEntries:
    """At most ``limit`` of a table's entries (slot ``i`` at index ``i``; key 0: empty).

    All of them when they fit. Otherwise first those that ``recent_keys`` (the keys of the
    latest material, most recent first) still find in their slot, up to half of ``limit``; then
    those with the most hits (ties: in slot order).
    """
    used = table.keys != 0
    if int(used.sum()) > limit:
        keep = np.zeros(len(table), dtype=np.bool_)
        found, budget = 0, limit // 2
        for key in recent_keys:
            if found >= budget:
                break
            slot = key >> shift
            if table.keys[slot] == key and not keep[slot]:
                keep[slot] = True
                found += 1
        rest = np.flatnonzero(used & ~keep)
        by_hits = rest[np.argsort(-table.hits[rest].astype(np.int16), kind="stable")]
        keep[by_hits[: limit - found]] = True
        used = keep
    return NgramEntries(table.keys[used], table.tokens[used], table.hits[used])


def slots_for(
    entries: NgramEntries, shift: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Where saved entries go in a table whose slot is ``key >> shift``: the slots, and the
    index of the entry each receives (of two for one slot, the one with more hits)."""
    slots = (entries.keys >> np.uint64(shift)).astype(np.int64)
    order = np.lexsort((-entries.hits.astype(np.int16), slots))
    unique, first = np.unique(slots[order], return_index=True)
    return unique.astype(np.int64), order[first].astype(np.int64)


def encode(entries: NgramEntries, *, n_match: int, fingerprint: int) -> bytes:
    order = np.argsort(entries.keys, kind="stable")
    payload = b"".join(
        (
            entries.keys[order].astype("<u8").tobytes(),
            entries.tokens[order].astype("<i4").tobytes(),
            entries.hits[order].astype("u1").tobytes(),
        )
    )
    header = HEADER.pack(
        MAGIC, VERSION, n_match, fingerprint, len(entries), zlib.crc32(payload) & 0xFFFFFFFF
    )
    return header + payload


def decode(data: bytes, *, fingerprint: int) -> NgramEntries:
    """The entries of a pool file; NgramFileError says what is wrong with one that is not."""
    if len(data) < HEADER.size:
        raise NgramFileError(f"truncated: {len(data)} bytes, shorter than the header")
    magic, version, _n_match, written_with, count, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise NgramFileError("not an n-gram pool file (wrong magic)")
    if version != VERSION:
        raise NgramFileError(f"format version {version}; this modelhub reads version {VERSION}")
    if written_with != fingerprint:
        raise NgramFileError("written with another n-gram hash than this modelhub's")
    expected = HEADER.size + ENTRY_BYTES * count
    if len(data) != expected:
        raise NgramFileError(f"{len(data)} bytes where {count} entries take {expected}")
    payload = memoryview(data)[HEADER.size :]
    if zlib.crc32(payload) & 0xFFFFFFFF != crc:
        raise NgramFileError("checksum mismatch (the file is corrupt)")
    keys = np.frombuffer(payload, "<u8", count, 0).astype(np.uint64)
    tokens = np.frombuffer(payload, "<i4", count, 8 * count).astype(np.int32)
    hits = np.frombuffer(payload, "u1", count, 12 * count).astype(np.uint8)
    if count and (not keys.all() or tokens.min() < 0 or not hits.all()):
        raise NgramFileError("an entry has a zero key, a negative token or no hits")
    return NgramEntries(keys, tokens, hits)


def read_entries(path: Path, *, fingerprint: int) -> NgramEntries | None:
    """The entries saved at ``path``, or None (logged) when there are none to use."""
    try:
        size = path.stat().st_size
        if size > MAX_READ_BYTES:
            raise NgramFileError(f"{size} bytes, more than any pool file ({MAX_READ_BYTES})")
        data = path.read_bytes()
        return decode(data, fingerprint=fingerprint)
    except FileNotFoundError:
        log.info("no saved n-gram pool at %s; starting with an empty one", path)
    except (OSError, NgramFileError) as exc:
        reason = str(exc)
        if isinstance(exc, OSError) and exc.strerror:
            reason = exc.strerror
        log.warning(
            "ignoring the saved n-gram pool %s (%s); starting with an empty one; "
            "the next save replaces it",
            path,
            reason,
        )
    return None


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file in the same folder, fsync, rename, fsync the
    folder. The folder is created (owner-only) if missing; OSError propagates, and no temp
    file is left behind."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with contextlib.suppress(OSError):
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
