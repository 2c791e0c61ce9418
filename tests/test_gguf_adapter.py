"""LoRA adapter checks from the headers (``modelhub.gguf.adapter``): what llama.cpp's loader
would refuse is refused at create time, naming what differs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from modelhub.errors import InputError
from modelhub.gguf.adapter import adapter_facts, check_adapter, exactness_warning
from modelhub.gguf.info import GGUFInfo, read_gguf_info
from tests.fixtures.synthetic import (
    lora_targets,
    write_lora,
    write_other_arch_lora,
    write_smollm2_lora,
    write_tiny_llama,
    write_tiny_llama_lora,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("adapters")
    return {
        "tiny": write_tiny_llama(d / "tiny.gguf"),
        "tiny_lora": write_tiny_llama_lora(d / "tiny-lora.gguf"),
        "smollm2_lora": write_smollm2_lora(d / "smollm2-lora.gguf"),
        "other_arch": write_other_arch_lora(d / "gemma3-lora.gguf"),
    }


def info(files: dict[str, Path], key: str) -> GGUFInfo:
    return read_gguf_info(files[key])


def test_a_lora_for_its_base_passes_and_is_described(files: dict[str, Path]) -> None:
    facts = check_adapter(info(files, "tiny"), info(files, "tiny_lora"), "tiny-lora.gguf")
    assert facts.as_dict() == {
        "architecture": "llama",
        "adapter_type": "lora",
        "rank": 8,
        "tensors": 6,  # attn_q, attn_v, ffn_up of 2 blocks
        "alpha": 16.0,
    }
    assert adapter_facts(info(files, "smollm2_lora")).tensors == 12


def test_other_widths_are_refused_naming_the_tensor_and_shapes(files: dict[str, Path]) -> None:
    with pytest.raises(InputError) as exc:
        check_adapter(info(files, "tiny"), info(files, "smollm2_lora"), "big.gguf")
    message = exc.value.message
    assert message.startswith("ADAPTER big.gguf: tensor 'blk.0.attn_q.weight.lora_a'")
    assert "has shape [576, 8]" in message and "is [64, 64]" in message
    assert "[64, 8] was expected" in message
    assert "use an adapter trained for this base model" in message


def test_another_architecture_is_refused(files: dict[str, Path]) -> None:
    with pytest.raises(InputError, match=r"for a 'gemma3' model but the base model is 'llama'"):
        check_adapter(info(files, "tiny"), info(files, "other_arch"), "g.gguf")


def test_a_model_is_not_an_adapter(files: dict[str, Path]) -> None:
    with pytest.raises(InputError, match=r"not an adapter \(general.type is 'model'.*FROM"):
        check_adapter(info(files, "tiny"), info(files, "tiny"), "tiny.gguf")


def test_a_block_the_base_lacks_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    deep = write_lora(tmp_path / "deep.gguf", lora_targets((64, 32, 128), blocks=(0, 5)))
    with pytest.raises(InputError, match=r"'blk.5.attn_q.weight', which the base model does not"):
        check_adapter(info(files, "tiny"), read_gguf_info(deep), "deep.gguf")


def _raw_adapter(path: Path, tensors: dict[str, np.ndarray], kind: str = "lora") -> GGUFInfo:
    writer = GGUFWriter(path, "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", kind)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return read_gguf_info(path)


def test_broken_lora_files_are_refused(files: dict[str, Path], tmp_path: Path) -> None:
    base = info(files, "tiny")
    a = np.zeros((8, 64), np.float32)
    half = _raw_adapter(tmp_path / "half.gguf", {"blk.0.attn_q.weight.lora_a": a})
    with pytest.raises(InputError, match=r"'blk.0.attn_q.weight.lora_b' is missing"):
        check_adapter(base, half, "half.gguf")
    stray = _raw_adapter(tmp_path / "stray.gguf", {"blk.0.attn_q.weight": a})
    with pytest.raises(InputError, match=r"'blk.0.attn_q.weight' is not a LoRA tensor"):
        check_adapter(base, stray, "stray.gguf")
    empty = _raw_adapter(tmp_path / "empty.gguf", {"blk.0.attn_norm.weight": a[0]})
    with pytest.raises(InputError, match=r"has no LoRA tensors"):
        check_adapter(base, empty, "empty.gguf")
    cvec = _raw_adapter(tmp_path / "cvec.gguf", {}, kind="control_vector")
    with pytest.raises(InputError, match=r"adapter.type is 'control_vector'; only LoRA"):
        check_adapter(base, cvec, "cvec.gguf")


def test_f32_pairs_of_an_odd_rank_get_an_exactness_warning(tmp_path: Path) -> None:
    targets = lora_targets((64, 32, 128), blocks=(0,))
    f32_r8 = write_lora(tmp_path / "a.gguf", targets, quant="F32")
    f32_r16 = write_lora(tmp_path / "b.gguf", targets, quant="F32", rank=16)
    f16_r8 = write_lora(tmp_path / "c.gguf", targets, quant="F16")
    warning = exactness_warning(read_gguf_info(f32_r8))
    assert warning is not None and "rank 8" in warning and "--outtype f16" in warning
    assert exactness_warning(read_gguf_info(f32_r16)) is None
    assert exactness_warning(read_gguf_info(f16_r8)) is None
