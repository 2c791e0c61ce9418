"""Layers on an accelerator: a real GPU where the build has one, else the software lane (a
llama-cpp-python built with ``-DGGML_VULKAN=on`` on Mesa's lavapipe, which llama.cpp sees once
``GGML_VK_VISIBLE_DEVICES=0`` is set; .ci/run builds it). Everything goes through the real
daemon, whose runners see the device. lavapipe runs at a few tokens per second and its kernels
are not the CPU's, so generations are short and each is compared with the same backend. Its
batches of more than a few rows cost seconds (~5 s for SmolLM2 against ~0.8 s a token), so the
tests that are about placement send raw prompts of a few tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q4_1
from tests.fixtures.synthetic import write_tiny_llama, write_tiny_mtp

# llama.cpp's Vulkan backend skips CPU-type devices (lavapipe) unless they are listed.
LANE_ENV = {"GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0")}
FEW = {"temperature": 0, "num_predict": 2}
FIXED = "PARAMETER draft_adaptive false\n"  # draft every step, at the set length


def _offload_devices() -> list[str]:
    code = (
        "import json; from modelhub.engine.devices import list_devices; "
        "print(json.dumps([d.label for d in list_devices() if d.offloads]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **LANE_ENV},
        check=False,
        timeout=120,
    )
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []


DEVICES = _offload_devices()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.gpu,
    pytest.mark.skipif(
        not DEVICES,
        reason="no GPU, and no Vulkan software lane (llama-cpp-python built with "
        "-DGGML_VULKAN=on and Mesa's lavapipe: .ci/run builds it)",
    ),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("gpu")
    env = {**LANE_ENV, "MODELHUB_NUM_PARALLEL": "1", "MODELHUB_MAX_LOADED_MODELS": "1"}
    d = start_daemon(base / "models", base / "daemon.log", env)
    mf = base / "Modelfile"
    # The drafting models draft at fixed length (their plain references are requests with
    # drafting off): the subject is the device's output, not whether the controller thinks
    # drafting pays on a tiny model.
    mtp = write_tiny_mtp(base / "tiny-mtp.gguf")
    tiny = write_tiny_llama(base / "tiny.gguf")
    tiny_draft = write_tiny_llama(base / "tiny-draft.gguf", seed=1)
    for name, text in (
        ("gpu", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 256\nDRAFT none\n"),
        ("cpu", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 256\nPARAMETER num_gpu 0\n"),
        ("gpu-ngram", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 256\nDRAFT ngram\n{FIXED}"),
        ("mtp-drafting", f"FROM {mtp}\nPARAMETER num_ctx 256\nDRAFT mtp\n{FIXED}"),
        ("tiny-drafting", f"FROM {tiny}\nPARAMETER num_ctx 256\nDRAFT {tiny_draft}\n{FIXED}"),
    ):
        mf.write_text(text)
        d.create(name, mf)
    yield d
    d.stop()


def _generate(c: httpx.Client, model: str, prompt: str, **extra: object) -> dict:
    body = {"model": model, "prompt": prompt, "stream": False, "raw": True, "options": FEW}
    body.update(extra)
    r = c.post("/api/generate", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def _ps(c: httpx.Client, name: str) -> dict:
    return next(m for m in c.get("/api/ps").json()["models"] if m["name"] == f"{name}:latest")


def test_every_layer_is_offloaded_and_reported(daemon: Daemon) -> None:
    with daemon.client() as c:
        assert _generate(c, "gpu", "The sky is")["eval_count"] > 0
        entry = _ps(c, "gpu")
        assert entry["devices"] == DEVICES, entry
        assert entry["layers_offloaded"] == 31, entry  # 30 blocks and the output layer
        assert entry["kv_cache_type"] == "f16", entry  # auto: F16 on a GPU (engine.offload)
        assert 0 < entry["size_vram"] <= entry["size"], entry
        runtime = c.post("/api/show", json={"model": "gpu"}).json()["runtime"]
        assert runtime["devices"] == DEVICES and runtime["layers_offloaded"] == 31, runtime
        assert "automatic: 30/30 layers fit" in runtime["offload"], runtime
        ps = daemon.cli("ps")
        assert "GPU" in ps.stdout, ps.stdout
        assert _generate(c, "cpu", "The sky is")["eval_count"] > 0
        entry = _ps(c, "cpu")
        assert entry["size_vram"] == 0 and entry["layers_offloaded"] == 0, entry
        assert entry["kv_cache_type"] == "auto", entry
        assert "100% CPU" in daemon.cli("ps").stdout


def _drafted_like_plain(c: httpx.Client, model: str, prompt: str) -> None:
    """``model`` gives the same greedy text with drafts as with drafting off for the request
    (the drafted request reuses the plain one's prompt cache on the device)."""
    options = {"temperature": 0, "num_predict": 12}
    want = _generate(c, model, prompt, options={**options, "draft": "off"})
    got = _generate(c, model, prompt, options=options)
    assert "draft_count" not in want, want
    assert got["response"] == want["response"], (model, got, want)
    assert got.get("draft_count", 0) > 0, got


def test_drafting_on_the_device_keeps_its_greedy_output(daemon: Daemon) -> None:
    """Same backend, with and without drafting: n-grams on SmolLM2, the MTP head (which goes to
    the device with the target's layers) on the tiny MTP fixture, a draft model (which goes to
    the device too) on the tiny llama."""
    with daemon.client() as c:
        copy = "apples, pears, plums, apples, pears, plums, apples, pears,"
        _drafted_like_plain(c, "gpu-ngram", copy)
        _drafted_like_plain(c, "mtp-drafting", "hello world the model")
        assert _ps(c, "mtp-drafting")["layers_offloaded"] > 0
        _drafted_like_plain(c, "tiny-drafting", "hello world the model")
        entry = _ps(c, "tiny-drafting")
        assert entry["draft"]["devices"] == [d for d in DEVICES if not d.startswith("RPC")]


def test_info_lists_the_device(daemon: Daemon) -> None:
    with daemon.client() as c:
        system = c.get("/api/info").json()["system"]
    assert system["gpu_offload"] is True
    names = [d["name"] for d in system["devices"]]
    assert all(name in names for name in DEVICES), (names, DEVICES)
    shown = daemon.cli("info").stdout
    assert f"GPU offload:      possible: {DEVICES[0]}" in shown, shown


def test_partial_offload_and_host_memory_planning(tmp_path: Path) -> None:
    """num_gpu 10 puts 10 layers on the device (ps shows the split); with MODELHUB_MEMORY_LIMIT
    below the weights, the model is refused on the CPU before loading and served when its
    layers go to the device (only what stays here counts)."""
    env = {**LANE_ENV, "MODELHUB_NUM_PARALLEL": "1", "MODELHUB_MEMORY_LIMIT": "64MiB"}
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", env)
    try:
        mf = tmp_path / "Modelfile"
        for name, extra in (
            ("auto", ""),
            ("ten", "PARAMETER num_gpu 10\n"),
            ("cpu", "PARAMETER num_gpu 0\n"),
        ):
            mf.write_text(f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 256\n{extra}")
            d.create(name, mf)
        body = {"prompt": "Hi", "stream": False, "options": {"num_predict": 2}}
        with d.client() as c:
            refused = c.post("/api/generate", json={**body, "model": "cpu"}, timeout=600)
            assert refused.status_code == 500, refused.text
            assert "requires more system memory" in refused.json()["error"]
            assert _generate(c, "auto", "Hi")["eval_count"] > 0
            assert _ps(c, "auto")["size_vram"] > 64 << 20
            c.post("/api/generate", json={"model": "auto", "keep_alive": 0})
            # named layers are not refused before loading either: llama.cpp places them
            assert _generate(c, "ten", "Hi")["eval_count"] > 0
            entry = _ps(c, "ten")
        assert entry["layers_offloaded"] == 10, entry
        assert 0 < entry["size_vram"] < entry["size"], entry
        assert "CPU/GPU" in d.cli("ps").stdout
    finally:
        d.stop()
