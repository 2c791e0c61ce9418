"""Manifests and the store: round trips, reference counting, fail-closed GC, path safety.

Covers SEC-04, SEC-07, STO-08/09/10/11/13/15 at the store level (no daemon, no models).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from pathlib import Path

import pytest

from modelhub.errors import (
    InvalidDigestError,
    InvalidNameError,
    ManifestFormatError,
    NotFoundError,
    StoreError,
)
from modelhub.store import (
    MEDIA_CONFIG,
    MEDIA_DRAFT,
    MEDIA_MANIFEST,
    MEDIA_MODEL,
    MEDIA_PARAMS,
    MEDIA_TEMPLATE,
    Layer,
    Manifest,
    ModelName,
    Store,
    parse_name,
)
from modelhub.store.blobs import TEMP_PREFIX

OLD = time.time() - 7200  # older than the default one-hour grace period


def build(store: Store, weights: bytes, template: bytes = b"{{ .Prompt }}") -> Manifest:
    """A small but complete manifest whose blobs are all in the store."""
    config = Layer(MEDIA_CONFIG, *store.put_bytes(b'{"model_format":"gguf"}'))
    return Manifest(
        config,
        [
            Layer(MEDIA_MODEL, *store.put_bytes(weights), from_="weights.gguf"),
            Layer(MEDIA_TEMPLATE, *store.put_bytes(template)),
        ],
    )


def blobs(store: Store) -> set[str]:
    return {p.name for p in store.blobs_dir.iterdir()}


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def plant_manifest(store: Store, name: str, raw: bytes) -> Path:
    path = store.manifests_dir.joinpath(*parse_name(name).manifest_relpath().parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return path


# ----- manifest JSON ---------------------------------------------------------------------------


def test_manifest_json_is_ollamas_shape() -> None:
    digest = "sha256:" + "a" * 64
    manifest = Manifest(
        Layer(MEDIA_CONFIG, digest, 485),
        [Layer(MEDIA_MODEL, digest, 10, from_="llama3.2:latest"), Layer(MEDIA_PARAMS, digest, 59)],
    )
    raw = manifest.to_json()
    assert raw == (
        b'{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",'
        b'"config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"'
        + digest.encode()
        + b'","size":485},"layers":[{"mediaType":"application/vnd.ollama.image.model",'
        b'"digest":"' + digest.encode() + b'","size":10,"from":"llama3.2:latest"},'
        b'{"mediaType":"application/vnd.ollama.image.params","digest":"'
        + digest.encode()
        + b'","size":59}]}\n'
    )
    assert Manifest.from_json(raw) == manifest
    assert Manifest.from_json(raw).to_json() == raw
    assert manifest.digests() == {digest}
    assert manifest.layers_of(MEDIA_PARAMS) == [manifest.layers[1]]
    assert manifest.layers_of(MEDIA_DRAFT) == []
    # Sizes count each blob once: here every layer names the same blob.
    assert manifest.total_size == 485
    other = "sha256:" + "b" * 64
    distinct = Manifest(Layer(MEDIA_CONFIG, digest, 485), [Layer(MEDIA_MODEL, other, 10)] * 2)
    assert distinct.total_size == 485 + 10


def test_manifest_reads_registry_form() -> None:
    # Pretty-printed, extra keys (safetensors "name", annotations) and no mediaType: accepted.
    digest = "sha256:" + "b" * 64
    doc = {
        "schemaVersion": 2,
        "config": {"mediaType": MEDIA_CONFIG, "digest": digest, "size": 1},
        "layers": [{"mediaType": MEDIA_MODEL, "digest": digest, "size": 2, "name": "t"}],
        "annotations": {"x": "y"},
    }
    manifest = Manifest.from_json(json.dumps(doc, indent=2).encode())
    assert manifest.media_type == MEDIA_MANIFEST
    assert manifest.layers == [Layer(MEDIA_MODEL, digest, 2)]


GOOD_LAYER = {"mediaType": MEDIA_CONFIG, "digest": "sha256:" + "c" * 64, "size": 1}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"[]",
        b"null",
        b'"x"',
        b"\xff\xfe\x00garbage",
        b"[" * 100_000 + b"]" * 100_000,
        json.dumps({"schemaVersion": 1, "config": GOOD_LAYER, "layers": []}).encode(),
        json.dumps({"schemaVersion": True, "config": GOOD_LAYER, "layers": []}).encode(),
        json.dumps({"schemaVersion": 2, "layers": []}).encode(),
        json.dumps({"schemaVersion": 2, "config": GOOD_LAYER}).encode(),
        json.dumps({"schemaVersion": 2, "config": GOOD_LAYER, "layers": {}}).encode(),
        json.dumps({"schemaVersion": 2, "config": GOOD_LAYER, "layers": [1]}).encode(),
        json.dumps(
            {"schemaVersion": 2, "config": {**GOOD_LAYER, "size": -1}, "layers": []}
        ).encode(),
        json.dumps(
            {"schemaVersion": 2, "config": {**GOOD_LAYER, "size": 1.5}, "layers": []}
        ).encode(),
        json.dumps(
            {"schemaVersion": 2, "config": {**GOOD_LAYER, "size": "1"}, "layers": []}
        ).encode(),
        json.dumps(
            {"schemaVersion": 2, "config": {**GOOD_LAYER, "from": 3}, "layers": []}
        ).encode(),
        json.dumps(
            {
                "schemaVersion": 2,
                "config": {"digest": GOOD_LAYER["digest"], "size": 1},
                "layers": [],
            }
        ).encode(),
        b'{"schemaVersion":2,"config":{"mediaType":"x","digest":"sha256:'
        + b"c" * 64
        + b'","size":1'
        + b"0" * 5000
        + b'},"layers":[]}',
        b" " * (4 << 20) + b"{}",
    ],
)
def test_manifest_shape_errors(raw: bytes) -> None:
    with pytest.raises(ManifestFormatError, match="invalid manifest"):
        Manifest.from_json(raw)


@pytest.mark.parametrize(
    "digest",
    ["../../victim", "sha256:../../x", "sha256:" + "c" * 63, "sha256:" + "C" * 64, "", None, 5],
)
def test_manifest_digests_are_strict(digest: object) -> None:
    doc = {"schemaVersion": 2, "config": GOOD_LAYER, "layers": [{**GOOD_LAYER, "digest": digest}]}
    with pytest.raises((InvalidDigestError, ManifestFormatError)):
        Manifest.from_json(json.dumps(doc).encode())


# ----- write / read ----------------------------------------------------------------------------


def test_write_read_round_trip_byte_exact(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = build(store, b"weights")
    name = parse_name("smollm2:135m")
    assert store.write_manifest(name, manifest) == []
    path = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    assert path.read_bytes() == manifest.to_json()
    model = store.get(name)
    assert model.raw == manifest.to_json() and model.manifest == manifest
    assert model.digest == hashlib.sha256(model.raw).hexdigest()
    assert model.size == manifest.total_size
    assert model.modified == path.stat().st_mtime
    assert model.name == name
    assert store.verify() == []
    assert not [p for p in path.parent.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_raw_registry_bytes_kept_verbatim(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = build(store, b"weights")
    raw = json.dumps(json.loads(manifest.to_json()), indent=3).encode()
    store.write_manifest(parse_name("m"), manifest, raw=raw)
    model = store.get(parse_name("m"))
    assert model.raw == raw and model.digest == hashlib.sha256(raw).hexdigest()
    other = build(store, b"other weights")
    with pytest.raises(StoreError, match="do not match"):
        store.write_manifest(parse_name("m"), other, raw=raw)


def test_missing_blob_refused(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = build(store, b"weights")
    manifest.layers.append(Layer(MEDIA_DRAFT, "sha256:" + "d" * 64, 5))
    with pytest.raises(StoreError, match=r'blob "sha256:d{64}" is missing'):
        store.write_manifest(parse_name("m"), manifest)
    assert store.list_models() == [] and store.resolve(parse_name("m")) is None
    assert list(store.manifests_dir.rglob("*")) == []


def test_wrong_size_refused(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = build(store, b"weights")
    manifest.layers[0].size += 1
    with pytest.raises(StoreError, match="has 7 bytes, the manifest declares 8"):
        store.write_manifest(parse_name("m"), manifest)
    assert store.list_models() == []


def test_get_missing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(NotFoundError, match="model 'nothing:latest' not found"):
        store.get(parse_name("nothing"))
    with pytest.raises(NotFoundError, match="model 'x/nothing:v1' not found"):
        store.delete(parse_name("x/nothing:v1"))
    with pytest.raises(NotFoundError):
        store.copy(parse_name("nothing"), parse_name("other"))


def test_list_newest_first_and_corrupt_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path)
    for i, raw_name in enumerate(["a", "b", "ns/c:v1"]):
        store.write_manifest(parse_name(raw_name), build(store, b"w%d" % i))
        os.utime(
            store.manifests_dir.joinpath(*parse_name(raw_name).manifest_relpath().parts),
            (1000 + i, 1000 + i),
        )
    plant_manifest(store, "broken", b"")
    plant_manifest(store, "evil", _evil_manifest(store))
    (store.manifests_dir / "stray-file").write_text("x")
    with caplog.at_level(logging.WARNING, logger="modelhub.store"):
        names = [m.name.display for m in store.list_models()]
    assert names == ["ns/c:v1", "b:latest", "a:latest"]
    assert "broken" in caplog.text and "evil" in caplog.text


def test_get_corrupt_manifest_explains(tmp_path: Path) -> None:
    store = Store(tmp_path)
    plant_manifest(store, "broken", b'{"schemaVersion":2')
    with pytest.raises(StoreError, match=r"manifest of 'broken:latest' is unreadable.*modelhub rm"):
        store.get(parse_name("broken"))


# ----- delete / copy / overwrite / noprune -----------------------------------------------------


def test_delete_prunes_only_unreferenced(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a = build(store, b"shared weights", b"template A")
    b = build(store, b"shared weights", b"template B")
    store.write_manifest(parse_name("a"), a)
    store.write_manifest(parse_name("b"), b)
    removed = store.delete(parse_name("a"))
    assert removed == [a.layers[1].digest]  # only A's own template
    assert store.has_blob(a.layers[0].digest) and store.has_blob(a.config.digest)
    assert store.verify() == []
    assert sorted(store.delete(parse_name("b"))) == sorted(b.digests())
    assert blobs(store) == set()
    assert list(store.manifests_dir.iterdir()) == []  # empty directories removed


def test_delete_ignores_noprune(tmp_path: Path) -> None:
    store = Store(tmp_path, noprune=True)
    store.write_manifest(parse_name("a"), build(store, b"w"))
    assert len(store.delete(parse_name("a"))) == 3
    assert blobs(store) == set()


def test_delete_keeps_sibling_tags_directory(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.write_manifest(parse_name("m:v1"), build(store, b"w1"))
    store.write_manifest(parse_name("m:v2"), build(store, b"w2"))
    store.delete(parse_name("M:V1"))  # case-insensitive
    assert [m.name.display for m in store.list_models()] == ["m:v2"]
    assert store.verify() == []


def test_copy_shares_blobs(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = build(store, b"w")
    store.write_manifest(parse_name("src"), manifest)
    before = blobs(store)
    store.copy(parse_name("SRC"), parse_name("user/dst:v1"))
    assert blobs(store) == before
    src, dst = store.get(parse_name("src")), store.get(parse_name("user/dst:v1"))
    assert dst.raw == src.raw and dst.digest == src.digest
    store.delete(parse_name("src"))
    assert blobs(store) == before  # still used by the copy
    assert store.verify() == []


def test_copy_same_path_is_noop(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.write_manifest(parse_name("Foo"), build(store, b"w"))
    path = store.manifests_dir / "registry.ollama.ai" / "library" / "Foo" / "latest"
    os.utime(path, (5, 5))
    assert store.copy(parse_name("Foo"), parse_name("foo:LATEST")) == []
    assert path.stat().st_mtime == 5
    assert len(store.list_models()) == 1


def test_copy_over_existing_frees_its_blobs(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.write_manifest(parse_name("a"), build(store, b"A"))
    old_b = build(store, b"B")
    store.write_manifest(parse_name("b"), old_b)
    removed = store.copy(parse_name("a"), parse_name("b"))
    assert removed == [old_b.layers[0].digest]
    assert store.get(parse_name("b")).raw == store.get(parse_name("a")).raw
    assert store.verify() == []


def test_overwrite_prunes_old_only_blobs(tmp_path: Path) -> None:
    store = Store(tmp_path)
    first = build(store, b"old gguf")
    store.write_manifest(parse_name("m"), first)
    store.write_manifest(parse_name("keeper"), build(store, b"kept gguf", b"{{ .Prompt }}"))
    second = build(store, b"new gguf")
    removed = store.write_manifest(parse_name("m"), second)
    assert removed == [first.layers[0].digest]  # template and config are still in use
    assert not store.has_blob(first.layers[0].digest)
    assert store.verify() == []


def test_overwrite_keeps_blob_another_model_uses(tmp_path: Path) -> None:
    store = Store(tmp_path)
    shared = build(store, b"shared gguf")
    store.write_manifest(parse_name("m"), shared)
    store.write_manifest(parse_name("other"), shared)
    assert store.write_manifest(parse_name("m"), build(store, b"new gguf")) == []
    assert store.has_blob(shared.layers[0].digest)


def test_noprune_keeps_old_blobs_on_overwrite(tmp_path: Path) -> None:
    store = Store(tmp_path, noprune=True)
    first = build(store, b"old gguf")
    store.write_manifest(parse_name("m"), first)
    assert store.write_manifest(parse_name("m"), build(store, b"new gguf")) == []
    assert store.has_blob(first.layers[0].digest)
    for path in store.blobs_dir.iterdir():
        os.utime(path, (OLD, OLD))
    assert store.prune() == ["sha256-" + first.layers[0].digest.removeprefix("sha256:")]


# ----- garbage collection ----------------------------------------------------------------------


def test_prune_grace_period(tmp_path: Path) -> None:
    store = Store(tmp_path)
    used = build(store, b"used")
    store.write_manifest(parse_name("m"), used)
    fresh, _ = store.put_bytes(b"uploaded for a create in progress")
    stale, _ = store.put_bytes(b"orphan")
    os.utime(store.blob_path(stale), (OLD, OLD))
    for digest in used.digests():
        os.utime(store.blob_path(digest), (OLD, OLD))
    assert store.prune() == [store.blob_path(stale).name]
    assert store.has_blob(fresh) and all(store.has_blob(d) for d in used.digests())
    assert store.prune(grace_seconds=0) == [store.blob_path(fresh).name]
    assert store.verify() == []


def test_killed_writer_temp_never_becomes_blob(tmp_path: Path) -> None:
    store = Store(tmp_path)
    # A writer "killed" mid-way: its temp file (named as BlobWriter names them) stays behind.
    writer = store.blob_writer()
    writer.write(b"half of a blob")
    writer._file.flush()
    temp = writer.temp_path
    leftovers = [temp, store.blobs_dir / f"{TEMP_PREFIX}deadbeef"]
    leftovers[1].write_bytes(b"x")
    partial = store.blobs_dir / ("sha256-" + "e" * 64 + "-partial")
    partial_state = store.blobs_dir / ("sha256-" + "e" * 64 + "-partial-0")
    partial.write_bytes(b"p")
    partial_state.write_bytes(b"{}")
    leftovers += [partial, partial_state]

    new_store = Store(tmp_path)  # a restart
    assert new_store.list_models() == []
    assert all(not new_store.has_blob(d) for d in ["sha256:" + "e" * 64])
    assert new_store.verify() == []  # debris is not a broken invariant
    assert new_store.prune() == []  # too young: might belong to a live writer
    assert all(p.exists() for p in leftovers)
    for path in leftovers:
        os.utime(path, (OLD, OLD))
    assert sorted(new_store.prune()) == sorted(p.name for p in leftovers)
    assert blobs(new_store) == set()


def test_prune_leaves_unknown_files_and_directories(tmp_path: Path) -> None:
    store = Store(tmp_path)
    odd = [store.blobs_dir / "README", store.blobs_dir / ("sha256-" + "F" * 64)]
    for path in odd:
        path.write_text("not ours")
        os.utime(path, (OLD, OLD))
    (store.blobs_dir / ("sha256-" + "a" * 64)).mkdir()
    assert store.prune(grace_seconds=0) == []
    assert all(p.exists() for p in odd)
    problems = store.verify()
    assert any("README" in p for p in problems) and any("not a regular file" in p for p in problems)


def test_prune_removes_empty_manifest_dirs_and_stale_manifest_temps(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.write_manifest(parse_name("keep"), build(store, b"w"))
    empty = store.manifests_dir / "example.com" / "ns" / "gone"
    empty.mkdir(parents=True)
    tag_dir = store.manifests_dir / "registry.ollama.ai" / "library" / "keep"
    crashed = tag_dir / f"{TEMP_PREFIX}abc"
    crashed.write_bytes(b'{"half')
    os.utime(crashed, (OLD, OLD))
    store.prune()
    assert not (store.manifests_dir / "example.com").exists()
    assert not crashed.exists()
    assert [m.name.display for m in store.list_models()] == ["keep:latest"]


def test_legacy_colon_blob_names_migrated(tmp_path: Path) -> None:
    data = b"legacy"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (tmp_path / "blobs").mkdir(parents=True)
    (tmp_path / "blobs" / digest).write_bytes(data)
    store = Store(tmp_path)
    assert store.has_blob(digest) and not (tmp_path / "blobs" / digest).exists()


# ----- fail-closed GC and planted manifests (STO-09, SEC-07) ----------------------------------


def _evil_manifest(store: Store) -> bytes:
    config_digest, config_size = store.put_bytes(b"{}")
    doc = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [
            {"mediaType": MEDIA_MODEL, "digest": "../../victim", "size": 1},
            {"mediaType": MEDIA_MODEL, "digest": "sha256:../../../victim", "size": 1},
        ],
    }
    return json.dumps(doc).encode()


def test_planted_traversal_digest_never_touches_outside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "home" / "models"
    store = Store(root)
    victims = [tmp_path / "victim", tmp_path / "home" / "victim", root / "victim"]
    for victim in victims:
        victim.write_text("precious")
    store.write_manifest(parse_name("good"), build(store, b"w"))
    plant_manifest(store, "evil", _evil_manifest(store))
    outside = {p: p.read_bytes() for p in victims}

    with pytest.raises(StoreError, match="invalid digest"):
        store.get(parse_name("evil"))
    for path in store.blobs_dir.iterdir():
        os.utime(path, (OLD, OLD))
    with caplog.at_level(logging.WARNING, logger="modelhub.store"):
        assert store.prune(grace_seconds=0) == []  # refuses: a manifest is unreadable
        assert "invalid digest" in caplog.text
        caplog.clear()
        assert store.delete(parse_name("evil")) == []  # removes the manifest, frees nothing
        assert "invalid digest" in caplog.text
    assert {p: p.read_bytes() for p in victims} == outside
    assert store.resolve(parse_name("evil")) is None
    assert store.verify() == []
    # With the planted manifest gone, a full prune keeps everything "good" needs.
    store.prune(grace_seconds=0)
    assert store.get(parse_name("good")) and store.verify() == []
    assert {p: p.read_bytes() for p in victims} == outside


def test_corrupt_manifest_blocks_freeing_shared_blobs(tmp_path: Path) -> None:
    store = Store(tmp_path)
    shared = build(store, b"shared gguf")
    store.write_manifest(parse_name("a"), shared)
    store.write_manifest(parse_name("b"), shared)
    b_path = store.manifests_dir.joinpath(*parse_name("b").manifest_relpath().parts)
    b_path.write_bytes(b"")  # truncated by a crash
    assert store.delete(parse_name("a")) == []
    assert all(store.has_blob(d) for d in shared.digests())
    problems = store.verify()
    assert len(problems) == 1 and "library/b/latest" in problems[0]
    # Repair B (re-pull): it is usable again and nothing was lost.
    store.write_manifest(parse_name("b"), shared)
    assert store.get(parse_name("b")).manifest == shared and store.verify() == []


def test_overwrite_with_corrupt_old_manifest(tmp_path: Path) -> None:
    store = Store(tmp_path)
    plant_manifest(store, "m", b"garbage")
    manifest = build(store, b"w")
    assert store.write_manifest(parse_name("m"), manifest) == []
    assert store.get(parse_name("m")).manifest == manifest


# ----- verify ----------------------------------------------------------------------------------


def test_verify_detects_problems(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = build(store, b"weights!")
    store.write_manifest(parse_name("m"), manifest)
    assert store.verify(rehash=True) == []
    weights = store.blob_path(manifest.layers[0].digest)
    weights.write_bytes(b"weights?")  # bit rot, same size
    assert store.verify() == []
    assert store.verify(rehash=True) == [
        f"blob {manifest.layers[0].digest} is corrupt: its content hashes to "
        f"sha256:{hashlib.sha256(b'weights?').hexdigest()}"
    ]
    weights.write_bytes(b"short")
    assert any("has 5 bytes, the manifest declares 8" in p for p in store.verify())
    weights.unlink()
    assert any("is missing" in p for p in store.verify())


# ----- path safety (SEC-04) --------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", ["../../x", "a/../../b", "x:..", "/abs/x", "C:\\x", "x" * 300, "../evil", "a/b/c/d/e"]
)
def test_hostile_names_never_reach_the_filesystem(tmp_path: Path, raw: str) -> None:
    root = tmp_path / "models"
    store = Store(root)
    store.write_manifest(parse_name("good"), build(store, b"w"))
    before = snapshot(tmp_path)
    with pytest.raises(InvalidNameError):
        store.copy(parse_name("good"), parse_name(raw))
    assert snapshot(tmp_path) == before


def test_symlinked_directory_cannot_redirect_writes(tmp_path: Path) -> None:
    store = Store(tmp_path / "models")
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.manifests_dir / "registry.ollama.ai").mkdir()
    (store.manifests_dir / "registry.ollama.ai" / "library").symlink_to(outside)
    manifest = build(store, b"w")
    with pytest.raises(StoreError, match="leaves the store"):
        store.write_manifest(parse_name("m"), manifest)
    assert list(outside.iterdir()) == []


def test_model_name_parts_are_stored_as_directories(tmp_path: Path) -> None:
    store = Store(tmp_path)
    name = ModelName.from_parts("localhost:5000", "ns", "m", "v1")
    store.write_manifest(name, build(store, b"w"))
    assert (tmp_path / "manifests" / "localhost:5000" / "ns" / "m" / "v1").is_file()
    assert store.get(parse_name("http://localhost:5000/ns/m:v1")).name == name
    assert oct((tmp_path / "manifests" / "localhost:5000").stat().st_mode & 0o777) == oct(
        0o755 & ~_umask()
    )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_lock_timeout_is_a_clear_error(tmp_path: Path) -> None:
    import filelock

    store = Store(tmp_path, lock_timeout=0.2)
    holder = filelock.FileLock(str(tmp_path / ".lock"))
    with holder, pytest.raises(StoreError, match="busy"):
        store.write_manifest(parse_name("m"), build(store, b"w"))
    store.write_manifest(parse_name("m"), build(store, b"w"))


MANIFEST_LOOP = """
import sys
from pathlib import Path
from modelhub.store import MEDIA_CONFIG, Layer, Manifest, Store, parse_name
store = Store(Path(sys.argv[1]))
config = Layer(MEDIA_CONFIG, *store.put_bytes(b"{}"))
layers = [Layer("application/vnd.ollama.image.license", *store.put_bytes(b"L%d" % i))
          for i in range(50)]
print("ready", flush=True)
i = 0
while True:  # overwrite one name with manifests of varying length (up to ~600 KB) until killed
    i += 1
    store.write_manifest(parse_name("crashy"), Manifest(config, layers * (i % 40)))
"""


def test_kill_during_manifest_writes_never_leaves_half_a_manifest(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    rng = random.Random(7)
    for cycle in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-c", MANIFEST_LOOP, str(tmp_path)], stdout=subprocess.PIPE, env=env
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.05, 0.4))
        proc.kill()  # SIGKILL: no cleanup of any kind
        proc.wait(timeout=30)
        store = Store(tmp_path)  # the restart
        model = store.get(parse_name("crashy"))  # whole: an older or a newer version
        assert Manifest.from_json(model.raw).to_json() == model.raw, cycle
        assert store.verify() == [], cycle
    store.prune(grace_seconds=0)
    assert [p for p in store.manifests_dir.rglob(TEMP_PREFIX + "*")] == []
    assert store.get(parse_name("crashy")).raw == model.raw and store.verify() == []
