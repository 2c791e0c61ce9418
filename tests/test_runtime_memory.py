"""Memory planning (reliability RUN-02, SPEC-13): estimates from GGUF headers, and a daemon that
refuses what cannot fit and unloads idle models to make room, before any runner starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from modelhub.config import parse_size
from modelhub.errors import InputError
from modelhub.gguf.info import read_gguf_info
from modelhub.runtime.memory import estimate
from tests.fixtures.synthetic import write_tiny_llama, write_tiny_mamba, write_tiny_mtp

MIB = 1 << 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("memory")
    return {
        "a": write_tiny_llama(d / "a.gguf", seed=0),
        "b": write_tiny_llama(d / "b.gguf", seed=5),
        "mtp": write_tiny_mtp(d / "mtp.gguf"),
        "mamba": write_tiny_mamba(d / "mamba.gguf"),
    }


def test_kv_cache_grows_linearly_with_the_context(tiny: dict[str, Path]) -> None:
    info = read_gguf_info(tiny["a"])
    small, large = estimate(info, 128, 64), estimate(info, 256, 64)
    # 2 layers x 2 KV heads x (16 + 16) x 2 bytes per position
    assert large.kv_cache == 2 * small.kv_cache == 256 * 2 * 2 * 32 * 2
    assert small.weights == large.weights == info.file_size
    assert small.compute == large.compute > 0
    assert estimate(info, 128, 128).compute == 2 * small.compute  # batch-sized buffers


def test_a_draft_adds_its_own_estimate(tiny: dict[str, Path]) -> None:
    target, draft = (
        estimate(read_gguf_info(tiny["a"]), 256, 64),
        estimate(read_gguf_info(tiny["b"]), 256, 64),
    )
    both = target + draft
    assert both.weights == target.weights + draft.weights
    assert both.kv_cache == target.kv_cache + draft.kv_cache
    assert both.total == target.total + draft.total


def test_nextn_layers_and_recurrent_models(tiny: dict[str, Path]) -> None:
    mtp = read_gguf_info(tiny["mtp"])  # 2 trunk blocks + 1 NextN block: 2 layers of KV
    assert estimate(mtp, 100, 1).kv_cache == 2 * 100 * 2 * 32 * 2
    assert estimate(read_gguf_info(tiny["mamba"]), 256, 64).kv_cache == 0  # no attention


def test_parse_size() -> None:
    assert parse_size("1024") == 1024
    assert parse_size("512MB") == parse_size("512MiB") == parse_size("512m") == 512 * MIB
    assert parse_size("1.5GiB") == 3 * (1 << 29)
    for bad in ("", "lots", "-1G", "5 PB"):
        with pytest.raises(InputError, match="invalid size"):
            parse_size(bad)


def _create(daemon: Daemon, tmp: Path, name: str, gguf: Path) -> None:
    modelfile = tmp / f"{name}.Modelfile"
    modelfile.write_text(f"FROM {gguf}\n")
    daemon.create(name, modelfile)


def _generate(client: httpx.Client, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "the hello", "raw": True, "stream": False}
    return client.post("/api/generate", json={**body, "options": {"num_predict": 4}})


@pytest.fixture
def limited(tmp_path: Path, tiny: dict[str, Path]) -> Iterator[Daemon]:
    """A daemon whose memory limit fits one tiny model at a time, not two."""
    one = estimate(read_gguf_info(tiny["a"]), 256, 512).total
    d = start_daemon(
        tmp_path / "models",
        tmp_path / "daemon.log",
        {"MODELHUB_MEMORY_LIMIT": str(one * 3 // 2)},
    )
    yield d
    d.stop()


def test_limit_unloads_idle_models_to_make_room(
    limited: Daemon, tiny: dict[str, Path], tmp_path: Path
) -> None:
    daemon = limited
    _create(daemon, tmp_path, "first", tiny["a"])
    _create(daemon, tmp_path, "second", tiny["b"])
    with daemon.client() as c:
        assert _generate(c, "first").status_code == 200
        assert [m["name"] for m in c.get("/api/ps").json()["models"]] == ["first:latest"]
        assert _generate(c, "second").status_code == 200  # MAX_LOADED_MODELS is 3: memory decides
        assert [m["name"] for m in c.get("/api/ps").json()["models"]] == ["second:latest"]
    assert "to make memory for second:latest" in daemon.log.read_text()


def test_the_draft_counts_towards_the_limit_and_goes_first(
    limited: Daemon, tiny: dict[str, Path], tmp_path: Path
) -> None:
    """Each model fits alone; the pair (target + draft model) does not (SPEC-13): the draft
    model goes first, and the model serves without it, saying so, rather than being refused."""
    daemon = limited
    modelfile = tmp_path / "paired.Modelfile"
    modelfile.write_text(f"FROM {tiny['a']}\nDRAFT {tiny['b']}\n")
    daemon.create("paired", modelfile)
    with daemon.client() as c:
        r = _generate(c, "paired")
        assert r.status_code == 200, r.text
        assert "was not loaded: there was not memory enough for it" in r.json()["draft_note"]
        (entry,) = c.get("/api/ps").json()["models"]
        assert entry["name"] == "paired:latest" and "not loaded" in entry["draft_note"]


def test_a_model_that_cannot_fit_is_refused_before_it_loads(
    tmp_path: Path, tiny: dict[str, Path]
) -> None:
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_MEMORY_LIMIT": "1MB"})
    try:
        _create(d, tmp_path, "tiny", tiny["a"])
        with d.client() as c:
            r = _generate(c, "tiny")
            assert r.status_code == 500
            assert r.json()["error"].startswith("model requires more system memory (")
            assert "than is available (0.0 GiB)" in r.json()["error"]
            assert c.get("/api/ps").json()["models"] == []  # no runner was started
        assert "loaded tiny" not in d.log.read_text()
    finally:
        d.stop()


def test_a_bad_limit_stops_the_daemon_with_the_variable_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="MODELHUB_MEMORY_LIMIT: invalid size 'plenty'"):
        start_daemon(
            tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_MEMORY_LIMIT": "plenty"}
        )
