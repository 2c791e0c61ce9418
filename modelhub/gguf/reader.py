"""Bounds-checked reading of a GGUF header, the untrusted part of a model file.

Every count and length in the header is checked against the bytes that actually remain before
anything is allocated, arrays are capped and nesting is limited, so a hostile header is rejected
with a ``GGUFError`` in milliseconds and bounded memory. Tensor data is never read; tensor extents
are checked against the file size (a tensor that claims bytes beyond the end of the file is an
error, not an out-of-bounds read later). :mod:`modelhub.gguf.info` turns a header into what the
rest of the project asks about a model.

gguf.GGUFReader is deliberately not used here: it memory-maps the file and trusts the header.

This module reads the fixed fields and puts the header together; the bounded reading itself is
:mod:`modelhub.gguf.cursor`, the key/value section :mod:`modelhub.gguf.metadata`, and the tensor
table with its extent checks :mod:`modelhub.gguf.tensors`.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from modelhub.errors import GGUFError
from modelhub.gguf.cursor import MAX_STRING_BYTES, Cursor, check_count
from modelhub.gguf.metadata import (
    MAX_ARRAY_ITEMS,
    MAX_NESTING,
    SHORT_ARRAY,
    TOKEN_TYPES_KEY,
    TOKENS_KEY,
    ArraySummary,
    Metadata,
    alignment,
    read_kv,
)
from modelhub.gguf.tensors import (
    MAX_DIMS,
    MAX_TENSOR_NAME_BYTES,
    TensorInfo,
    check_tensor_extents,
    read_tensor_infos,
)

__all__ = [
    "GGUF_MAGIC",
    "MAX_ARRAY_ITEMS",
    "MAX_DIMS",
    "MAX_KV_COUNT",
    "MAX_NESTING",
    "MAX_STRING_BYTES",
    "MAX_TENSOR_COUNT",
    "MAX_TENSOR_NAME_BYTES",
    "SHORT_ARRAY",
    "SUPPORTED_VERSIONS",
    "TOKENS_KEY",
    "TOKEN_TYPES_KEY",
    "ArraySummary",
    "Header",
    "Metadata",
    "TensorInfo",
    "read_header_file",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)

MAX_KV_COUNT = 1_000_000
MAX_TENSOR_COUNT = 1_000_000


@dataclass
class Header:
    version: int
    meta: Metadata
    tensors: list[TensorInfo]
    data_offset: int


def _read_header(
    f: BinaryIO, path: Path, size: int, full_arrays: bool, with_tokens: bool
) -> Header:
    cur = Cursor(f, size, path)
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
    check_count(cur, n_kv, MAX_KV_COUNT, 13, "metadata entry count", counts_at + 8)
    check_count(cur, n_tensors, MAX_TENSOR_COUNT, 24, "tensor count", counts_at)
    meta = read_kv(cur, n_kv, full_arrays, with_tokens)
    align = alignment(cur, meta)
    tensors, extents = read_tensor_infos(cur, n_tensors)
    data_offset = check_tensor_extents(cur, extents, align)
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
