"""Damaged models (issue 26, item 16): a model whose blob is missing, a flipped byte in its
weights, an unreadable manifest. Each is listed with its state (``/api/tags``, ``modelhub
list``), a request for it says what is damaged and how to repair it (never "model not found",
never an answer from wrong bytes), ``modelhub verify`` finds it, and pulling or creating the
model again repairs it.

What the daemon finds in its store, and the CLI's listing, verify and repair, run in-process
over fake runners (``app``; the CLI in-process too). The weights hashed before a load (the
daemon's checked runner, before its process starts) run on a real daemon (``served``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from modelhub.store import MEDIA_MODEL, MEDIA_TEMPLATE, Store, parse_name
from tests.fakes.daemon import FakeDaemon, fake_daemon
from tests.fixtures.synthetic import write_tiny_llama

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    with fake_daemon(tmp_path_factory.mktemp("damaged-fake")) as d:
        yield d


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("damaged")
    d = start_daemon(base / "models", base / "daemon.log", {"MODELHUB_NUM_PARALLEL": "1"})
    yield d
    d.stop()


def create(d: Daemon | FakeDaemon, name: str, directory: Path, seed: int, extra: str = "") -> Path:
    """``name`` from a tiny GGUF of its own (``seed``): no blob shared with other models."""
    weights = directory / f"{name}.gguf"
    if not weights.exists():
        write_tiny_llama(weights, seed=seed)
    mf = directory / f"{name}.Modelfile"
    mf.write_text(f"FROM {weights}\nPARAMETER num_ctx 256\n{extra}")
    d.create(name, mf)
    return mf


def blob(d: Daemon | FakeDaemon, name: str, media: str = MEDIA_MODEL) -> Path:
    store = Store(d.models)
    (layer,) = store.get(parse_name(name)).manifest.layers_of(media)
    return store.blob_path(layer.digest)


def generate(c: httpx.Client, name: str) -> httpx.Response:
    body = {"model": name, "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
    return c.post("/api/generate", json=body)


def tag(c: httpx.Client, name: str) -> dict[str, Any]:
    (entry,) = [m for m in c.get("/api/tags").json()["models"] if m["name"] == name]
    return dict(entry)


def assert_damaged(r: httpx.Response, name: str, *words: str) -> str:
    assert r.status_code == 500, r.text
    error = str(r.json()["error"])
    assert f"model '{name}' is damaged: " in error, error
    assert f"`modelhub pull {name}`" in error and f"`modelhub create {name}" in error, error
    assert "not found" not in error, error
    for word in words:
        assert word in error, error
    return error


def test_a_missing_blob_is_named_listed_and_repaired_by_create(
    app: FakeDaemon, tmp_path: Path
) -> None:
    mf = create(app, "gone", tmp_path, seed=11, extra='TEMPLATE "{{ .Prompt }}"\n')
    create(app, "healthy", tmp_path, seed=12)
    blob(app, "gone", MEDIA_TEMPLATE).unlink()  # the case that answered "model not found"
    weights = blob(app, "gone")
    weights.unlink()
    with app.http_client() as c:
        error = assert_damaged(generate(c, "gone"), "gone:latest", "missing from the store")
        assert "its template blob" in error and "its weights blob" in error, error
        shown = c.post("/api/show", json={"model": "gone"})
        assert shown.status_code == 500 and "is damaged" in shown.json()["error"]
        entry = tag(c, "gone:latest")
        assert entry["state"] == "damaged" and "its weights blob" in entry["damage"], entry
        assert "state" not in tag(c, "healthy:latest")
    listing = app.cli("list")
    assert listing.returncode == 0, listing.stderr
    assert "STATE" in listing.stdout and "damaged" in listing.stdout, listing.stdout
    assert "model 'gone:latest' is damaged: its weights blob" in listing.stdout, listing.stdout
    checked = app.cli("verify")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "gone:latest: damaged" in checked.stdout and "healthy:latest: ok" in checked.stdout
    assert "to repair: pull it again" in checked.stdout, checked.stdout
    assert "Error: 1 of" in checked.stderr, checked.stderr

    r = app.cli("create", "gone", "-f", str(mf))  # the repair the message names
    assert r.returncode == 0, r.stderr
    with app.http_client() as c:
        assert generate(c, "gone").status_code == 200
        assert "state" not in tag(c, "gone:latest")
        c.post("/api/generate", json={"model": "gone", "keep_alive": 0})


def test_a_flipped_byte_in_the_weights_is_never_served(served: Daemon, tmp_path: Path) -> None:
    """The weights are hashed before each load (once per state of the file): a byte flipped
    between two loads, even with the modification time put back, fails the load with the
    model, the part and the repair; the corrupt blob leaves the store, and create restores it."""
    mf = create(served, "flipped", tmp_path, seed=21)
    with served.client() as c:
        assert generate(c, "flipped").status_code == 200
        c.post("/api/generate", json={"model": "flipped", "keep_alive": 0})
        path = blob(served, "flipped")
        # found right once, remembered (with the file's identity) for later loads and daemons
        record = json.loads((Path(served.models) / "verified.json").read_text())
        assert "sha256:" + path.name.removeprefix("sha256-") in record
        before = path.stat()
        data = bytearray(path.read_bytes())
        data[len(data) - 100] ^= 0x01  # in the tensor data: the GGUF header still reads
        path.chmod(0o644)
        path.write_bytes(bytes(data))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        error = assert_damaged(generate(c, "flipped"), "flipped:latest", "its weights blob")
        assert "is corrupt: its content hashes to sha256:" in error, error
        assert "it was removed from the store" in error, error
        assert not path.exists()
        assert tag(c, "flipped:latest")["state"] == "damaged"
        assert not c.get("/api/ps").json()["models"]
    served.create("flipped", mf)
    with served.client() as c:
        assert generate(c, "flipped").status_code == 200
        c.post("/api/generate", json={"model": "flipped", "keep_alive": 0})


def test_verify_finds_a_corrupt_blob_without_a_load(app: FakeDaemon, tmp_path: Path) -> None:
    create(app, "rotten", tmp_path, seed=31)
    loads = len(app.runners.loads())
    path = blob(app, "rotten")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x80
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with app.http_client() as c:
        answer = c.post("/api/verify", json={"model": "rotten"}).json()
        (report,) = answer["models"]
        assert report["name"] == "rotten:latest" and report["state"] == "damaged", report
        assert "its weights blob" in report["problems"][0], report
        assert "is corrupt" in report["problems"][0], report
        assert report["repair"].startswith("pull it again (`modelhub pull rotten:latest`)")
        missing = c.post("/api/verify", json={"model": "no-such-model"})
        assert missing.status_code == 404, missing.text
    assert not path.exists()
    r = app.cli("verify", "rotten")
    assert r.returncode == 1 and "rotten:latest: damaged" in r.stdout, r.stdout + r.stderr
    assert len(app.runners.loads()) == loads  # found without a load


def test_an_unreadable_manifest_is_listed_as_damaged(app: FakeDaemon, tmp_path: Path) -> None:
    create(app, "garbled", tmp_path, seed=41)
    manifest = Path(app.models) / "manifests/registry.ollama.ai/library/garbled/latest"
    manifest.write_text("{not json")
    with app.http_client() as c:
        entry = tag(c, "garbled:latest")
        assert entry["state"] == "damaged", entry
        assert "unreadable" in entry["damage"] and "modelhub rm" in entry["damage"], entry
        r = generate(c, "garbled")
        assert r.status_code == 500 and "unreadable" in r.json()["error"], r.text
    assert app.cli("rm", "garbled").returncode == 0
