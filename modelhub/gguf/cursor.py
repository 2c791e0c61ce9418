"""Bounded forward reading of a binary file: the cursor the GGUF header parser reads through.

Every read, or promise to read (``need``, ``check_count``), is checked against the bytes that
actually remain, so a lying length or count fails with a ``GGUFError`` naming the offset.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from modelhub.errors import GGUFError

MAX_STRING_BYTES = 16 * 1024 * 1024

_CHUNK = 1 << 20


class Cursor:
    """Forward reader over a file that refuses to read, or promise to read, past its end."""

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self._f = f
        self.size = size
        self.path = path
        self.pos = 0
        self.endian = "<"
        self._buf = b""
        self._buf_start = 0

    def fail(self, what: str, offset: int | None = None) -> NoReturn:
        at = self.pos if offset is None else offset
        raise GGUFError(f"{self.path.name}: not a valid GGUF file: {what} (at offset {at})")

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.remaining:
            self.fail(
                f"{what} needs {n} bytes but only {self.remaining} remain "
                "(the file is truncated or its header is corrupt)"
            )

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        off = self.pos - self._buf_start
        if off < 0 or off + n > len(self._buf):
            self._f.seek(self.pos)
            self._buf = self._f.read(min(max(n, _CHUNK), self.remaining))
            self._buf_start = self.pos
            off = 0
            if len(self._buf) < n:
                self.fail(f"{what}: the file ended early (was it changed while being read?)")
        self.pos += n
        return self._buf[off : off + n]

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def scalar(self, code: str, what: str) -> Any:
        fmt = struct.Struct(self.endian + code)
        return fmt.unpack(self.take(fmt.size, what))[0]

    def u32(self, what: str) -> int:
        value: int = self.scalar("I", what)
        return value

    def u64(self, what: str) -> int:
        value: int = self.scalar("Q", what)
        return value

    def raw_string(self, what: str, limit: int = MAX_STRING_BYTES) -> bytes:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > limit:
            self.fail(f"{what} claims {n} bytes, more than the limit of {limit}", start)
        return self.take(n, what)

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        return self.raw_string(what, limit).decode("utf-8", errors="replace")

    def string_array(self, count: int, what: str, keep: bool, digest: Any = None) -> list[bytes]:
        """Read (or step over) ``count`` strings, optionally hashing them as (u64 LE length,
        bytes) pairs. The loop works on the buffer directly: this is the hot path for
        vocabularies and merges."""
        if digest is not None and self.endian != "<":
            strings = self.string_array(count, what, True)
            for item in strings:
                digest.update(len(item).to_bytes(8, "little") + item)
            return strings if keep else []
        out: list[bytes] = []
        unpack = struct.Struct("<Q").unpack_from
        buf, base = self._buf, self._buf_start
        off = seg = self.pos - base
        end = len(buf)
        for i in range(count):
            if off + 8 <= end:
                nxt = off + 8 + unpack(buf, off)[0]
                if nxt <= end:
                    if keep:
                        out.append(buf[off + 8 : nxt])
                    off = nxt
                    continue
            # Slow path: the string crosses the buffer's end (or lies about its length).
            if digest is not None:
                digest.update(memoryview(buf)[seg:off])
            self.pos = base + off
            item = self.raw_string(f"{what}[{i}]")
            if keep:
                out.append(item)
            if digest is not None:
                digest.update(len(item).to_bytes(8, "little") + item)
            buf, base = self._buf, self._buf_start
            off = seg = self.pos - base
            end = len(buf)
        if digest is not None:
            digest.update(memoryview(buf)[seg:off])
        self.pos = base + off
        return out


def check_count(cur: Cursor, count: int, limit: int, min_size: int, what: str, at: int) -> None:
    """Refuse a count over ``limit``, or one whose entries (``min_size`` bytes each at least)
    cannot fit in what remains of the file."""
    if count > limit:
        cur.fail(f"{what} is {count}, more than the limit of {limit}", at)
    if count * min_size > cur.remaining:
        cur.fail(
            f"{what} is {count}, but {count} entries need at least {count * min_size} bytes "
            f"and only {cur.remaining} remain",
            at,
        )
