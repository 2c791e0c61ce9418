"""The tensor-info table of a GGUF header, and the check that every tensor's data is aligned,
inside the file and overlaps no other (tensor data itself is never read).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from modelhub.gguf.cursor import Cursor

MAX_TENSOR_NAME_BYTES = 1024
MAX_DIMS = 4  # GGML_MAX_DIMS


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


@dataclass(frozen=True)
class _Extent:
    name: str
    offset: int  # relative to the start of tensor data
    nbytes: int
    at: int  # where the tensor's entry starts in the tensor table


def _ggml_type(cur: Cursor, type_id: int, tensor: str, at: int) -> tuple[str, int, int]:
    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        cur.fail(f"tensor {tensor!r} has unknown ggml type {type_id}", at)
    block, type_size = GGML_QUANT_SIZES[qtype]
    return qtype.name, block, type_size


def read_tensor_infos(cur: Cursor, n_tensors: int) -> tuple[list[TensorInfo], list[_Extent]]:
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


def check_tensor_extents(cur: Cursor, extents: list[_Extent], align: int) -> int:
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
