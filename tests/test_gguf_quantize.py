"""The quantizer (``modelhub.gguf.quantize``) on tiny GGUFs: types, refusals, clear errors.

Its output on a real model is checked in test_devtools_realmodels.py (the requantised test
models are built with it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize as gguf_quantize

from modelhub.errors import GGUFError, InputError, ModelhubError, NotFoundError
from modelhub.gguf.quantize import QUANT_TYPES, ftype_for, quantize_gguf


def write_tiny_gguf(path: Path, arch: str, weight_type: GGMLQuantizationType) -> Path:
    """A one-tensor GGUF: enough for the quantizer's own checks and for llama.cpp to reject."""
    writer = GGUFWriter(path, arch)
    writer.add_block_count(1)
    weights = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)
    if weight_type == GGMLQuantizationType.F32:
        writer.add_tensor("blk.0.ffn_up.weight", weights)
    else:
        data = gguf_quantize(weights, weight_type)
        writer.add_tensor("blk.0.ffn_up.weight", data, raw_dtype=weight_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_quant_types_are_llama_cpp_ftypes() -> None:
    import llama_cpp

    for name, value in QUANT_TYPES.items():
        constant = "LLAMA_FTYPE_ALL_F32" if name == "f32" else f"LLAMA_FTYPE_MOSTLY_{name.upper()}"
        assert getattr(llama_cpp, constant) == value, name


def test_type_names_are_case_insensitive_and_unknown_ones_list_the_choices() -> None:
    assert ftype_for("Q4_K_M") == ftype_for("q4_k_m") == 15
    with pytest.raises(InputError) as caught:
        ftype_for("q9_9")
    assert "'q9_9'" in caught.value.message
    assert "Q4_K_M" in caught.value.message and "Q8_0" in caught.value.message


def test_quantized_source_needs_allow_requantize(tmp_path: Path) -> None:
    src = write_tiny_gguf(tmp_path / "q.gguf", "llama", GGMLQuantizationType.Q8_0)
    dst = tmp_path / "out.gguf"
    with pytest.raises(InputError, match="only supported for F16, BF16 and F32 models") as caught:
        quantize_gguf(src, dst, "q4_0")
    assert "Q8_0" in caught.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.gguf"]


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="not found"):
        quantize_gguf(tmp_path / "missing.gguf", tmp_path / "o.gguf", "q8_0")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all")
    with pytest.raises(GGUFError, match="not a readable GGUF"):
        quantize_gguf(junk, tmp_path / "o.gguf", "q8_0")
    src = write_tiny_gguf(tmp_path / "f.gguf", "llama", GGMLQuantizationType.F32)
    with pytest.raises(InputError, match="output directory does not exist"):
        quantize_gguf(src, tmp_path / "no" / "o.gguf", "q8_0")
    with pytest.raises(InputError, match="onto itself"):
        quantize_gguf(src, src, "q8_0")


def test_llama_cpp_failure_is_reported_and_leaves_no_file(tmp_path: Path) -> None:
    src = write_tiny_gguf(tmp_path / "f.gguf", "no-such-architecture", GGMLQuantizationType.F32)
    dst = tmp_path / "out.gguf"
    with pytest.raises(ModelhubError) as caught:
        quantize_gguf(src, dst, "q8_0")
    assert caught.value.status == 500
    assert "f.gguf" in caught.value.message
    assert "architecture" in caught.value.message  # llama.cpp's own reason is passed on
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.gguf"]
