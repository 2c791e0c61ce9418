"""Bounds-checked reading of a GGUF header, the untrusted part of a model file.

Every count and length in the header is checked against the bytes that actually remain before
anything is allocated, arrays are capped and nesting is limited, so a hostile header is rejected
with a ``GGUFError`` in milliseconds and bounded memory. Tensor data is never read; tensor extents
are checked against the file size (a tensor that claims bytes beyond the end of the file is an
error, not an out-of-bounds read later). :mod:`modelhub.gguf.info` turns a header into what the
rest of the project asks about a model.

gguf.GGUFReader is deliberately not used here: it memory-maps the file and trusts the header.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from modelhub.errors import GGUFError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)

MAX_KV_COUNT = 1_000_000
MAX_TENSOR_COUNT = 1_000_000
MAX_ARRAY_ITEMS = 10_000_000
MAX_STRING_BYTES = 16 * 1024 * 1024
MAX_TENSOR_NAME_BYTES = 1024
MAX_NESTING = 3  # an array of arrays of arrays; real files use at most 1
MAX_DIMS = 4  # GGML_MAX_DIMS
SHORT_ARRAY = 5  # longer arrays are summarised unless asked for in full

_CHUNK = 1 << 20

# GGUF value types: id -> (name, struct code or None, size in bytes of the smallest element).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL = range(8)
_STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = 8, 9, 10, 11, 12
_VALUE_TYPES: dict[int, tuple[str, str | None, int]] = {
    _UINT8: ("uint8", "B", 1),
    _INT8: ("int8", "b", 1),
    _UINT16: ("uint16", "H", 2),
    _INT16: ("int16", "h", 2),
    _UINT32: ("uint32", "I", 4),
    _INT32: ("int32", "i", 4),
    _FLOAT32: ("float32", "f", 4),
    _BOOL: ("bool", "?", 1),
    _STRING: ("string", None, 8),  # u64 length + bytes
    _ARRAY: ("array", None, 12),  # u32 item type + u64 count
    _UINT64: ("uint64", "Q", 8),
    _INT64: ("int64", "q", 8),
    _FLOAT64: ("float64", "d", 8),
}
_INTEGER_TYPES = {_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _UINT64, _INT64}

TOKENS_KEY = "tokenizer.ggml.tokens"
TOKEN_TYPES_KEY = "tokenizer.ggml.token_type"


@dataclass(frozen=True)
class ArraySummary:
    """Stands in for a long metadata array that was skipped rather than kept."""

    element_type: str
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    type_name: str

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Cursor:
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


@dataclass
class Metadata:
    kv: dict[str, Any]
    kv_types: dict[str, int]
    token_bytes: list[bytes] | None  # only when asked for
    token_count: int
    tokens_digest: str


@dataclass(frozen=True)
class _Extent:
    name: str
    offset: int  # relative to the start of tensor data
    nbytes: int
    at: int  # where the tensor's entry starts in the tensor table


@dataclass
class Header:
    version: int
    meta: Metadata
    tensors: list[TensorInfo]
    data_offset: int


def _check_count(cur: _Cursor, count: int, limit: int, min_size: int, what: str, at: int) -> None:
    if count > limit:
        cur.fail(f"{what} is {count}, more than the limit of {limit}", at)
    if count * min_size > cur.remaining:
        cur.fail(
            f"{what} is {count}, but {count} entries need at least {count * min_size} bytes "
            f"and only {cur.remaining} remain",
            at,
        )


def _float32_clean(values: Iterable[float]) -> list[float]:
    # Shortest decimal that round-trips the float32, so 1e-5 reads as 1e-05, not 9.99999974e-06.
    return [float(str(np.float32(v))) for v in values]


def _read_value(cur: _Cursor, vtype: int, what: str, depth: int, keep: bool) -> Any:
    _, code, _ = _VALUE_TYPES[vtype]
    if code is not None:
        value = cur.scalar(code, what)
        return _float32_clean([value])[0] if vtype == _FLOAT32 else value
    if vtype == _STRING:
        return cur.string(what)
    return _read_array(cur, what, depth, keep)


def _read_array(cur: _Cursor, what: str, depth: int, keep: bool) -> Any:
    """An array value; a long one becomes an ArraySummary unless ``keep``."""
    if depth >= MAX_NESTING:
        cur.fail(f"{what}: arrays nested more than {MAX_NESTING} deep")
    type_at = cur.pos
    item_type = cur.u32(f"item type of {what}")
    if item_type not in _VALUE_TYPES:
        cur.fail(f"{what}: unknown array item type {item_type}", type_at)
    count_at = cur.pos
    count = cur.u64(f"length of {what}")
    item_name, item_code, item_size = _VALUE_TYPES[item_type]
    _check_count(cur, count, MAX_ARRAY_ITEMS, item_size, f"length of array {what}", count_at)
    keep_all, keep = keep, keep or count <= SHORT_ARRAY
    summary = ArraySummary(item_name, count)
    if item_code is not None:
        nbytes = count * item_size
        if not keep:
            cur.skip(nbytes, what)
            return summary
        items = list(struct.unpack(f"{cur.endian}{count}{item_code}", cur.take(nbytes, what)))
        return _float32_clean(items) if item_type == _FLOAT32 else items
    if item_type == _STRING:
        strings = cur.string_array(count, what, keep)
        if not keep:
            return summary
        return [s.decode("utf-8", errors="replace") for s in strings]
    nested = [_read_array(cur, f"{what}[{i}]", depth + 1, keep_all) for i in range(count)]
    short = keep and not any(isinstance(item, ArraySummary) for item in nested)
    return nested if short else summary


def _read_kv(cur: _Cursor, n_kv: int, full_arrays: bool, with_tokens: bool) -> Metadata:
    kv: dict[str, Any] = {}
    kv_types: dict[str, int] = {}
    token_bytes: list[bytes] = []
    token_count = 0
    # Separate digests, so the fingerprint does not depend on the order of the keys.
    texts_digest, types_digest = hashlib.sha256(), hashlib.sha256()
    for i in range(n_kv):
        key_at = cur.pos
        key = cur.string(f"key of metadata entry {i}", limit=65536)
        if key in kv:
            cur.fail(f"metadata key {key!r} appears twice", key_at)
        type_at = cur.pos
        vtype = cur.u32(f"value type of {key!r}")
        if vtype not in _VALUE_TYPES:
            cur.fail(f"metadata key {key!r} has unknown value type {vtype}", type_at)
        kv_types[key] = vtype
        if vtype != _ARRAY:
            kv[key] = _read_value(cur, vtype, repr(key), 0, full_arrays)
        elif key == TOKENS_KEY:
            keep = with_tokens or full_arrays
            token_bytes, token_count = _read_token_texts(cur, texts_digest, keep)
            kv[key] = (
                [t.decode("utf-8", errors="replace") for t in token_bytes]
                if keep or token_count <= SHORT_ARRAY
                else ArraySummary("string", token_count)
            )
        elif key == TOKEN_TYPES_KEY:
            kv[key] = _read_token_types(cur, types_digest, with_tokens or full_arrays)
        else:
            kv[key] = _read_array(cur, repr(key), 0, full_arrays)
    fingerprint = hashlib.sha256(
        f"{texts_digest.hexdigest()}:{types_digest.hexdigest()}".encode()
    ).hexdigest()
    tokens = token_bytes if with_tokens else None
    return Metadata(kv, kv_types, tokens, token_count, fingerprint)


def _read_token_texts(cur: _Cursor, digest: Any, keep: bool) -> tuple[list[bytes], int]:
    type_at = cur.pos
    item_type = cur.u32("item type of the token list")
    if item_type != _STRING:
        cur.fail(f"{TOKENS_KEY} must be an array of strings, not of type {item_type}", type_at)
    count_at = cur.pos
    count = cur.u64("length of the token list")
    _check_count(cur, count, MAX_ARRAY_ITEMS, 8, "length of the token list", count_at)
    return cur.string_array(count, TOKENS_KEY, keep or count <= SHORT_ARRAY, digest), count


def _read_token_types(cur: _Cursor, digest: Any, keep: bool) -> Any:
    """The token-type array, hashed as int64 LE values whatever its integer width."""
    start = cur.pos
    item_type = cur.u32(f"item type of {TOKEN_TYPES_KEY}")
    count = cur.u64(f"length of {TOKEN_TYPES_KEY}")
    if item_type not in _INTEGER_TYPES:
        cur.pos = start  # not integers: read it like any array, outside the fingerprint
        return _read_array(cur, repr(TOKEN_TYPES_KEY), 0, keep)
    name, code, size = _VALUE_TYPES[item_type]
    _check_count(cur, count, MAX_ARRAY_ITEMS, size, f"length of {TOKEN_TYPES_KEY}", start + 4)
    values = np.frombuffer(cur.take(count * size, TOKEN_TYPES_KEY), dtype=cur.endian + str(code))
    digest.update(values.astype("<i8").tobytes())
    if keep or count <= SHORT_ARRAY:
        return [int(v) for v in values.tolist()]
    return ArraySummary(name, count)


def _ggml_type(cur: _Cursor, type_id: int, tensor: str, at: int) -> tuple[str, int, int]:
    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        cur.fail(f"tensor {tensor!r} has unknown ggml type {type_id}", at)
    block, type_size = GGML_QUANT_SIZES[qtype]
    return qtype.name, block, type_size


def _read_tensor_infos(cur: _Cursor, n_tensors: int) -> tuple[list[TensorInfo], list[_Extent]]:
    tensors: list[TensorInfo] = []
    extents: list[_Extent] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        at = cur.pos
        name = cur.string(f"name of tensor {i}", limit=MAX_TENSOR_NAME_BYTES)
        if name in seen:
            cur.fail(f"tensor {name!r} appears twice", at)
        seen.add(name)
        dims_at = cur.pos
        n_dims = cur.u32(f"dimension count of tensor {name!r}")
        if n_dims > MAX_DIMS:
            cur.fail(
                f"tensor {name!r} has {n_dims} dimensions, at most {MAX_DIMS} allowed", dims_at
            )
        shape = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
        n_elements = 1
        for d in shape:
            n_elements *= d
        if n_elements >= 1 << 63:
            cur.fail(f"tensor {name!r} shape {list(shape)} has too many elements", dims_at)
        type_at = cur.pos
        type_id = cur.u32(f"type of tensor {name!r}")
        type_name, block, type_size = _ggml_type(cur, type_id, name, type_at)
        if shape and shape[0] % block:
            cur.fail(
                f"tensor {name!r}: first dimension {shape[0]} is not a multiple of the "
                f"{type_name} block size {block}",
                dims_at,
            )
        offset = cur.u64(f"data offset of tensor {name!r}")
        extents.append(_Extent(name, offset, n_elements // block * type_size, at))
        tensors.append(TensorInfo(name, shape, type_id, type_name))
    return tensors, extents


def _check_tensor_extents(cur: _Cursor, extents: list[_Extent], align: int) -> int:
    """Where tensor data starts; every tensor must be aligned, inside the file, and alone."""
    data_offset = -(-cur.pos // align) * align
    if extents and data_offset > cur.size:
        cur.fail(f"tensor data should start at {data_offset}, past the end of the file")
    previous_end, previous = 0, ""
    for t in sorted(extents, key=lambda e: e.offset):
        if t.offset % align:
            cur.fail(f"tensor {t.name!r} data offset {t.offset} is not a multiple of {align}", t.at)
        end = data_offset + t.offset + t.nbytes
        if end > cur.size:
            cur.fail(
                f"tensor {t.name!r} data ({t.nbytes} bytes at {data_offset + t.offset}) ends at "
                f"{end}, beyond the end of the file ({cur.size} bytes): truncated or corrupt",
                t.at,
            )
        if t.offset < previous_end:
            cur.fail(f"tensor {t.name!r} data overlaps tensor {previous!r}", t.at)
        previous_end, previous = t.offset + t.nbytes, t.name
    return data_offset


def _read_header(
    f: BinaryIO, path: Path, size: int, full_arrays: bool, with_tokens: bool
) -> Header:
    cur = _Cursor(f, size, path)
    if size == 0:
        cur.fail("the file is empty (0 bytes)", 0)
    magic = cur.take(min(4, size), "magic")
    if magic != GGUF_MAGIC:
        cur.fail(f"expected magic b'GGUF', found {magic!r}", 0)
    raw_version = cur.take(4, "version")
    version = struct.unpack("<I", raw_version)[0]
    if version not in SUPPORTED_VERSIONS:
        swapped = struct.unpack(">I", raw_version)[0]
        if swapped in SUPPORTED_VERSIONS:  # a big-endian file
            cur.endian, version = ">", swapped
        else:
            hint = "GGUF v1 is obsolete; convert the model again" if version == 1 else ""
            cur.fail(f"unsupported GGUF version {version} (supported: 2, 3) {hint}".strip(), 4)
    counts_at = cur.pos
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata entry count")
    # Each entry needs at least: key length + type + a 1-byte value; tensor: name len, n_dims,
    # type, offset.
    _check_count(cur, n_kv, MAX_KV_COUNT, 13, "metadata entry count", counts_at + 8)
    _check_count(cur, n_tensors, MAX_TENSOR_COUNT, 24, "tensor count", counts_at)
    meta = _read_kv(cur, n_kv, full_arrays, with_tokens)
    align = meta.kv.get("general.alignment", 32)
    if meta.kv_types.get("general.alignment", _UINT32) not in _INTEGER_TYPES or not (
        isinstance(align, int) and align > 0 and align & (align - 1) == 0
    ):
        cur.fail(f"general.alignment must be a power of two, not {align!r}")
    tensors, extents = _read_tensor_infos(cur, n_tensors)
    data_offset = _check_tensor_extents(cur, extents, align)
    return Header(version, meta, tensors, data_offset)


def read_header_file(path: Path, full_arrays: bool, with_tokens: bool) -> tuple[Header, int]:
    """The header of the file at ``path`` and the file's size; GGUFError when it is malformed."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return _read_header(f, path, size, full_arrays, with_tokens), size
    except IsADirectoryError:
        raise GGUFError(f"{path} is a directory, not a GGUF file") from None
    except OSError as e:
        raise GGUFError(f"cannot read {path}: {e.strerror or e}") from None
