"""The metadata (key/value) section of a GGUF header: typed values, arrays (long ones are
summarised unless asked for), and the token list, fingerprinted as it is read.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelhub.gguf.cursor import Cursor, check_count

MAX_ARRAY_ITEMS = 10_000_000
MAX_NESTING = 3  # an array of arrays of arrays; real files use at most 1
SHORT_ARRAY = 5  # longer arrays are summarised unless asked for in full

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


@dataclass
class Metadata:
    kv: dict[str, Any]
    kv_types: dict[str, int]
    token_bytes: list[bytes] | None  # only when asked for
    token_count: int
    tokens_digest: str


def _float32_clean(values: Iterable[float]) -> list[float]:
    # Shortest decimal that round-trips the float32, so 1e-5 reads as 1e-05, not 9.99999974e-06.
    return [float(str(np.float32(v))) for v in values]


def _read_value(cur: Cursor, vtype: int, what: str, depth: int, keep: bool) -> Any:
    _, code, _ = _VALUE_TYPES[vtype]
    if code is not None:
        value = cur.scalar(code, what)
        return _float32_clean([value])[0] if vtype == _FLOAT32 else value
    if vtype == _STRING:
        return cur.string(what)
    return _read_array(cur, what, depth, keep)


def _read_array(cur: Cursor, what: str, depth: int, keep: bool) -> Any:
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
    check_count(cur, count, MAX_ARRAY_ITEMS, item_size, f"length of array {what}", count_at)
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


def read_kv(cur: Cursor, n_kv: int, full_arrays: bool, with_tokens: bool) -> Metadata:
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


def _read_token_texts(cur: Cursor, digest: Any, keep: bool) -> tuple[list[bytes], int]:
    type_at = cur.pos
    item_type = cur.u32("item type of the token list")
    if item_type != _STRING:
        cur.fail(f"{TOKENS_KEY} must be an array of strings, not of type {item_type}", type_at)
    count_at = cur.pos
    count = cur.u64("length of the token list")
    check_count(cur, count, MAX_ARRAY_ITEMS, 8, "length of the token list", count_at)
    return cur.string_array(count, TOKENS_KEY, keep or count <= SHORT_ARRAY, digest), count


def _read_token_types(cur: Cursor, digest: Any, keep: bool) -> Any:
    """The token-type array, hashed as int64 LE values whatever its integer width."""
    start = cur.pos
    item_type = cur.u32(f"item type of {TOKEN_TYPES_KEY}")
    count = cur.u64(f"length of {TOKEN_TYPES_KEY}")
    if item_type not in _INTEGER_TYPES:
        cur.pos = start  # not integers: read it like any array, outside the fingerprint
        return _read_array(cur, repr(TOKEN_TYPES_KEY), 0, keep)
    name, code, size = _VALUE_TYPES[item_type]
    check_count(cur, count, MAX_ARRAY_ITEMS, size, f"length of {TOKEN_TYPES_KEY}", start + 4)
    values = np.frombuffer(cur.take(count * size, TOKEN_TYPES_KEY), dtype=cur.endian + str(code))
    digest.update(values.astype("<i8").tobytes())
    if keep or count <= SHORT_ARRAY:
        return [int(v) for v in values.tolist()]
    return ArraySummary(name, count)


def alignment(cur: Cursor, meta: Metadata) -> int:
    """``general.alignment`` (32 when absent), which must be an integer power of two."""
    align = meta.kv.get("general.alignment", 32)
    if meta.kv_types.get("general.alignment", _UINT32) not in _INTEGER_TYPES or not (
        isinstance(align, int) and align > 0 and align & (align - 1) == 0
    ):
        cur.fail(f"general.alignment must be a power of two, not {align!r}")
    return align
