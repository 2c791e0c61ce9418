"""gguf_info: metadata of real and synthetic GGUFs, and hostile headers rejected fast."""

from __future__ import annotations

import dataclasses
import json
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFReader, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools import realmodels
from modelhub.errors import GGUFError
from modelhub.gguf.info import (
    GGUFInfo,
    capabilities,
    format_parameter_count,
    is_gguf,
    model_info_for_show,
    read_gguf_info,
    read_tokens,
)
from modelhub.gguf.reader import ArraySummary
from tests.fixtures.synthetic import (
    CHAT_TEMPLATE,
    MALFORMED_CASES,
    malformed_bytes,
    tiny_vocab,
    write_malformed,
    write_tiny_llama,
    write_tiny_mtp,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    return {
        "llama": write_tiny_llama(d / "llama.gguf"),
        "llama_f32": write_tiny_llama(d / "llama-f32.gguf", quant="F32"),
        "mtp1": write_tiny_mtp(d / "mtp1.gguf"),
        "mtp2": write_tiny_mtp(d / "mtp2.gguf", heads=2),
        "trunk_only": write_tiny_mtp(d / "trunk.gguf", trunk_only=True),
        "mtp_only": write_tiny_mtp(d / "heads.gguf", mtp_only=True),
    }


def reference_parameter_count(path: Path) -> int:
    return sum(int(np.prod([int(x) for x in t.shape])) for t in GGUFReader(path).tensors)


def test_tiny_llama_metadata(files: dict[str, Path]) -> None:
    path = files["llama"]
    info = read_gguf_info(path)
    vocab = tiny_vocab()
    assert (info.architecture, info.version, info.general_type) == ("llama", 3, "model")
    assert info.name == "tiny-llama"
    assert (info.context_length, info.embedding_length, info.block_count) == (256, 64, 2)
    assert info.file_size == path.stat().st_size
    assert info.file_type == "Q8_0"
    assert info.parameter_count == reference_parameter_count(path)
    assert info.vocab_size == len(vocab) == 340
    assert (info.tokenizer_model, info.tokenizer_pre) == ("llama", "default")
    assert (info.bos_id, info.eos_id, info.eot_id, info.pad_id) == (1, 2, None, None)
    assert (info.add_bos, info.add_eos) == (True, False)
    assert info.chat_template == CHAT_TEMPLATE
    assert info.nextn_layers == 0 and not info.has_mtp_heads and not info.is_mtp_drafter
    assert info.pooling_type is None and info.split_count is None
    assert info.tokens is None
    # the tensor table agrees with gguf's own reader
    reader = GGUFReader(path)
    assert [(t.name, t.shape, t.ggml_type) for t in info.tensors] == [
        (t.name, tuple(int(x) for x in t.shape), int(t.tensor_type)) for t in reader.tensors
    ]
    assert info.data_offset == reader.data_offset
    assert {t.type_name for t in info.tensors} == {"Q8_0", "F32"}


def test_long_arrays_are_summarised_unless_asked(files: dict[str, Path]) -> None:
    info = read_gguf_info(files["llama"])
    assert info.kv["tokenizer.ggml.tokens"] == ArraySummary("string", 340)
    assert info.kv["tokenizer.ggml.scores"] == ArraySummary("float32", 340)
    assert info.kv["tokenizer.ggml.token_type"] == ArraySummary("int32", 340)
    full = read_gguf_info(files["llama"], full_arrays=True)
    vocab = tiny_vocab()
    assert full.kv["tokenizer.ggml.tokens"] == list(vocab.tokens)
    assert full.kv["tokenizer.ggml.scores"] == list(vocab.scores)
    assert full.kv["tokenizer.ggml.token_type"] == list(vocab.types)
    # float32 values read back as their shortest decimal
    assert full.kv["llama.attention.layer_norm_rms_epsilon"] == 1e-5


def test_tokens_and_fingerprint(files: dict[str, Path], tmp_path: Path) -> None:
    vocab = tiny_vocab()
    texts, types = read_tokens(files["llama"])
    assert texts == list(vocab.tokens) and types == list(vocab.types)
    with_tokens = read_gguf_info(files["llama"], with_tokens=True)
    assert with_tokens.tokens == texts and with_tokens.token_types == types
    plain = read_gguf_info(files["llama"])
    # same vocabulary: same fingerprint, whatever the weights or the way it was read
    assert plain.tokens_fingerprint == with_tokens.tokens_fingerprint
    assert plain.tokens_fingerprint == read_gguf_info(files["mtp1"]).tokens_fingerprint
    assert len(plain.tokens_fingerprint) == 64
    # one token's text, or one token's type, changes it
    renamed = write_tiny_llama(tmp_path / "renamed.gguf", vocab=vocab.with_text(300, "▁q"))
    assert read_gguf_info(renamed).tokens_fingerprint != plain.tokens_fingerprint
    retyped = dataclasses.replace(vocab, types=(*vocab.types[:-1], 4))
    retyped_path = write_tiny_llama(tmp_path / "retyped.gguf", vocab=retyped)
    assert read_gguf_info(retyped_path).tokens_fingerprint != plain.tokens_fingerprint


def test_quant_names(files: dict[str, Path]) -> None:
    assert read_gguf_info(files["llama_f32"]).file_type == "F32"


def test_file_type_falls_back_to_dominant_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "no-ftype.gguf"
    w = GGUFWriter(path, "llama")
    w.add_tensor("a", np.zeros((4, 32), np.float16))
    w.add_tensor("b", np.zeros(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = read_gguf_info(path)
    assert info.file_type == "F16"
    assert info.parameter_count == 4 * 32 + 32
    assert info.vocab_size == 0 and info.tokenizer_model is None


def test_big_endian_file_reads_like_little_endian(tmp_path: Path) -> None:
    def write(path: Path, endian: GGUFEndian) -> Path:
        w = GGUFWriter(path, "llama", endianess=endian)
        w.add_uint32("llama.block_count", 7)
        w.add_float32("llama.rope.freq_base", 10000.0)
        w.add_array("tokenizer.ggml.tokens", ["<unk>", "a", "b", "c", "d", "e", "f"])
        w.add_array("tokenizer.ggml.token_type", [2, 1, 1, 1, 1, 1, 1])
        w.add_tensor("t", np.arange(64, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    little = read_gguf_info(write(tmp_path / "le.gguf", GGUFEndian.LITTLE), full_arrays=True)
    big = read_gguf_info(write(tmp_path / "be.gguf", GGUFEndian.BIG), full_arrays=True)
    assert big.kv == little.kv
    assert big.tokens_fingerprint == little.tokens_fingerprint
    assert big.block_count == 7 and big.tensors == little.tensors


def test_mtp_heads(files: dict[str, Path]) -> None:
    one = read_gguf_info(files["mtp1"])
    assert one.architecture == "hy_v3"
    assert (one.block_count, one.nextn_layers, one.has_mtp_heads) == (3, 1, True)
    two = read_gguf_info(files["mtp2"])
    assert (two.block_count, two.nextn_layers, two.has_mtp_heads) == (4, 2, True)
    assert not one.is_mtp_drafter
    trunk = read_gguf_info(files["trunk_only"])
    assert trunk.nextn_layers == 1 and not trunk.has_mtp_heads
    heads = read_gguf_info(files["mtp_only"])
    assert heads.has_mtp_heads and heads.is_mtp_only and heads.is_mtp_drafter
    assert not one.is_mtp_only and not trunk.is_mtp_only and not trunk.is_mtp_drafter


def test_mtp_drafter_architectures(files: dict[str, Path]) -> None:
    info = read_gguf_info(files["llama"])
    for arch, expected in [
        ("gemma4-assistant", True),
        ("future-assistant", True),
        ("qwen9_mtp", True),
        ("gemma4", False),
        ("llama", False),
    ]:
        assert dataclasses.replace(info, architecture=arch).is_mtp_drafter is expected, arch


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (0, "0"),
        (999, "999"),
        (1_000, "1K"),
        (12_345, "12K"),
        (999_999, "1000K"),
        (1_000_000, "1M"),
        (22_570_000, "22.57M"),
        (134_515_008, "134.52M"),
        (137_000_000, "137M"),
        (1_000_000_000, "1B"),
        (3_210_000_000, "3.2B"),
        (7_000_000_000, "7B"),
        (8_030_261_248, "8.0B"),
        (70_553_706_496, "70.6B"),
    ],
)
def test_parameter_size(count: int, expected: str) -> None:
    assert format_parameter_count(count) == expected


def test_parameter_size_property(files: dict[str, Path]) -> None:
    info = read_gguf_info(files["llama"])
    assert info.parameter_size == format_parameter_count(info.parameter_count)
    assert info.parameter_size.endswith("K")


def test_model_info_for_show(files: dict[str, Path]) -> None:
    info = read_gguf_info(files["llama"])
    short = model_info_for_show(info, verbose=False)
    assert "general.name" not in short and "tokenizer.chat_template" not in short
    assert short["general.parameter_count"] == info.parameter_count
    assert short["general.architecture"] == "llama"
    assert short["llama.block_count"] == 2
    assert short["tokenizer.ggml.tokens"] == [] and short["tokenizer.ggml.scores"] == []
    verbose = model_info_for_show(info, verbose=True)
    assert verbose["tokenizer.ggml.tokens"] == list(tiny_vocab().tokens)
    assert set(verbose) == set(short)


def test_nested_arrays_and_non_finite_floats(tmp_path: Path) -> None:
    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    def u8_array(items: list[int]) -> bytes:  # an array value without its leading type
        return struct.pack("<IQ", 0, len(items)) + bytes(items)

    kvs = [
        string("general.architecture") + struct.pack("<I", 8) + string("llama"),
        string("x.long_inner") + struct.pack("<IIQ", 9, 9, 2) + u8_array([1] * 7) + u8_array([2]),
        string("x.short") + struct.pack("<IIQ", 9, 9, 2) + u8_array([1, 2]) + u8_array([3]),
        string("x.nan") + struct.pack("<If", 6, float("nan")),
    ]
    path = tmp_path / "nested.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    info = read_gguf_info(path)
    assert info.kv["x.long_inner"] == ArraySummary("array", 2)
    assert info.kv["x.short"] == [[1, 2], [3]]
    assert read_gguf_info(path, full_arrays=True).kv["x.long_inner"] == [[1] * 7, [2]]
    shown = model_info_for_show(info, verbose=False)
    assert shown["x.long_inner"] == [] and shown["x.short"] == [[1, 2], [3]]
    assert shown["x.nan"] is None
    json.dumps(shown, allow_nan=False)
    assert model_info_for_show(info, verbose=True)["x.long_inner"] == [[1] * 7, [2]]


def test_capabilities(files: dict[str, Path]) -> None:
    info = read_gguf_info(files["llama"])
    assert capabilities(info, None) == ["completion"]
    assert capabilities(info, "{{ .Prompt }}") == ["completion"]
    go_tools = "{{ if .Tools }}{{ .Tools }}{{ end }}{{ .Prompt }}"
    assert capabilities(info, go_tools) == ["completion", "tools"]
    jinja_tools = "{% if tools %}{{ tools | tojson }}{% endif %}"
    assert "tools" in capabilities(info, jinja_tools)
    assert capabilities(info, "<PRE> {{ .Prompt }} <SUF>{{ .Suffix }}") == [
        "completion",
        "insert",
    ]
    assert "thinking" in capabilities(info, "{{ if .Thinking }}<think>{{ .Thinking }}</think>")
    assert "thinking" in capabilities(info, "{% if enable_thinking %}<think>{% endif %}")
    embedding = dataclasses.replace(info, pooling_type=1)
    assert capabilities(embedding, go_tools) == ["embedding"]
    vision = dataclasses.replace(info, kv={**info.kv, "llama.vision.block_count": 2})
    assert capabilities(vision, None) == ["completion"]  # images are not served


def test_is_gguf(files: dict[str, Path], tmp_path: Path) -> None:
    assert is_gguf(files["llama"]) and is_gguf(str(files["llama"]))
    assert is_gguf(b"GGUF\x03\x00\x00\x00") and not is_gguf(b"PK\x03\x04") and not is_gguf(b"")
    assert not is_gguf(tmp_path / "missing.gguf")
    assert not is_gguf(tmp_path)
    assert not is_gguf(write_malformed(tmp_path, "wrong_magic"))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot read"):
        read_gguf_info(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="directory"):
        read_gguf_info(tmp_path)


def test_no_architecture_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "noarch.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    with pytest.raises(GGUFError, match=r"general\.architecture"):
        read_gguf_info(path)


# What each malformed case's error must say (so the right check fires, not a later one).
EXPECTED_ERROR = {
    "wrong_magic": "magic",
    "version_99": "version 99",
    "truncated_kv": "truncated",
    "n_kv_huge": "metadata entry count",
    "string_length_huge": "claims 4611686018427387904 bytes",
    "array_length_huge": "length of array",
    "nested_arrays": "nested",
    "unknown_value_type": "unknown value type 99",
    "n_tensors_huge": "tensor count",
    "n_dims_100": "100 dimensions",
    "empty": "empty",
    "tensor_past_eof": "beyond the end of the file",
    "tensor_offset_wrap": "beyond the end of the file",
    "unknown_ggml_type": "unknown ggml type 9999",
    "overlapping_tensors": "overlaps",
    "shape_overflow": "too many elements",
    "misaligned_offset": "not a multiple of 32",
    "duplicate_key": "appears twice",
}


def test_every_malformed_case_has_an_expectation() -> None:
    assert set(EXPECTED_ERROR) == set(MALFORMED_CASES)


@pytest.mark.parametrize("case", MALFORMED_CASES)
def test_malformed_header_is_rejected_fast_with_bounded_memory(case: str, tmp_path: Path) -> None:
    path = write_malformed(tmp_path, case)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(GGUFError) as err:
            read_gguf_info(path)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert EXPECTED_ERROR[case] in message, message
    assert path.name in message
    assert "offset" in message
    assert elapsed < 1.0
    assert peak < 50 * 2**20
    assert err.value.status == 400


def test_malformed_cases_are_small() -> None:
    for case in MALFORMED_CASES:
        limit = 16 * 1024 if case == "nested_arrays" else 1024
        assert len(malformed_bytes(case)) < limit, case


def test_truncation_anywhere_is_a_clear_error(files: dict[str, Path], tmp_path: Path) -> None:
    data = files["llama"].read_bytes()
    info = read_gguf_info(files["llama"])
    cut = tmp_path / "cut.gguf"
    # every byte of the fixed header and first entries, then a sample of the rest
    lengths = [*range(0, 300), *range(300, info.data_offset + 1, 61)]
    lengths += range(info.data_offset, len(data), 4093)
    for n in lengths:
        cut.write_bytes(data[:n])
        with pytest.raises(GGUFError):
            read_gguf_info(cut)
    cut.write_bytes(data + b"trailing bytes are fine")
    assert read_gguf_info(cut).parameter_count == info.parameter_count


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_header_never_escapes_as_another_exception(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Random byte overwrites in the header: the reader answers or raises GGUFError."""
    source = _fuzz_source(tmp_path_factory)
    raw = bytearray(source.read_bytes())
    header_end = read_gguf_info(source).data_offset
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, header_end - 1))
        width = data.draw(st.sampled_from([1, 4, 8]))
        value = data.draw(st.sampled_from([0, 1, 0xFF, 2**31, 2**63, 2**64 - 1]))
        raw[pos : pos + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
    target = tmp_path_factory.getbasetemp() / "fuzzed.gguf"
    target.write_bytes(bytes(raw))
    start = time.perf_counter()
    try:
        info = read_gguf_info(target)
    except GGUFError:
        pass
    else:
        assert isinstance(info, GGUFInfo)
    assert time.perf_counter() - start < 1.0


def _fuzz_source(factory: pytest.TempPathFactory) -> Path:
    path = factory.getbasetemp() / "fuzz-source.gguf"
    if not path.exists():
        write_tiny_llama(path)
    return path


# -- real models (downloaded once, cached by devtools/realmodels.py) --------------------


@pytest.mark.slow
def test_real_smollm2() -> None:
    path = realmodels.smollm2_q4_1()
    start = time.perf_counter()
    info = read_gguf_info(path)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"inspecting SmolLM2 took {elapsed:.3f} s"
    assert (info.architecture, info.file_type, info.parameter_count) == ("llama", "Q4_1", 134515008)
    assert info.parameter_size == "134.52M"
    assert (info.context_length, info.embedding_length, info.block_count) == (8192, 576, 30)
    assert (info.tokenizer_model, info.tokenizer_pre, info.vocab_size) == ("gpt2", "smollm", 49152)
    assert (info.bos_id, info.eos_id, info.add_bos) == (1, 2, False)
    assert info.chat_template is not None and "<|im_start|>" in info.chat_template
    assert not info.has_mtp_heads
    assert capabilities(info, None) == ["completion"]
    # token texts and types agree with gguf's own (memory-mapping) reader
    texts, types = read_tokens(path)
    reader = GGUFReader(path)
    field = reader.fields["tokenizer.ggml.tokens"]
    assert texts == [bytes(field.parts[i]).decode() for i in field.data]
    types_field = reader.fields["tokenizer.ggml.token_type"]
    assert types == [int(types_field.parts[i][0]) for i in types_field.data]


@pytest.mark.slow
def test_real_gemma3_is_another_tokenizer() -> None:
    gemma = read_gguf_info(realmodels.gemma3_270m())
    assert (gemma.architecture, gemma.file_type, gemma.vocab_size) == ("gemma3", "Q4_K_M", 262144)
    assert gemma.tokenizer_model == "llama"
    smol = read_gguf_info(realmodels.smollm2_q4_1())
    assert gemma.tokens_fingerprint != smol.tokens_fingerprint
