"""The drafting state kept per weights blob (``<models>/drafting/<hex>/``): where it is, and that
it goes when its blob goes (rm, an overwrite, prune) and stays while a copy still uses the blob.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.synthetic import write_tiny_llama

from devtools.daemons import Daemon
from modelhub.errors import InvalidDigestError
from modelhub.store import MEDIA_CONFIG, MEDIA_MODEL, Layer, Manifest, Store, parse_name

HEX = "ab" * 32


def build(store: Store, weights: bytes) -> Manifest:
    config = Layer(MEDIA_CONFIG, *store.put_bytes(b'{"model_format":"gguf"}'))
    return Manifest(config, [Layer(MEDIA_MODEL, *store.put_bytes(weights))])


def remember(store: Store, digest: str) -> Path:
    """What a runner leaves: a file in the blob's drafting folder."""
    folder = store.drafting_dir(digest)
    folder.mkdir(parents=True)
    (folder / "ngram.pool").write_bytes(b"saved")
    return folder


def test_the_folder_is_named_by_the_digest_and_nothing_else(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert store.drafting_dir(f"sha256:{HEX}") == store.root / "drafting" / HEX
    assert not (store.root / "drafting").exists()  # not created until something is kept
    for bad in (f"sha256-{HEX}", HEX, f"sha256:{HEX.upper()}", "sha256:../../etc", ""):
        with pytest.raises(InvalidDigestError, match="invalid digest format"):
            store.drafting_dir(bad)


def test_the_state_goes_with_the_last_model_using_the_blob(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = build(store, b"weights")
    weights = manifest.layers[0].digest
    store.write_manifest(parse_name("a"), manifest)
    folder = remember(store, weights)
    store.copy(parse_name("a"), parse_name("b"))
    store.delete(parse_name("a"))
    assert (folder / "ngram.pool").read_bytes() == b"saved"  # b still uses the weights
    store.delete(parse_name("b"))
    assert not folder.exists() and not store.has_blob(weights)


def test_an_overwrite_that_frees_the_weights_drops_their_state(tmp_path: Path) -> None:
    store = Store(tmp_path)
    old = build(store, b"old weights")
    store.write_manifest(parse_name("m"), old)
    old_state = remember(store, old.layers[0].digest)
    new = build(store, b"new weights")
    new_state = remember(store, new.layers[0].digest)
    store.write_manifest(parse_name("m"), new)
    assert not old_state.exists() and new_state.exists()


def test_prune_drops_state_whose_blob_is_gone_and_leaves_the_rest(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = build(store, b"weights")
    store.write_manifest(parse_name("m"), manifest)
    kept = remember(store, manifest.layers[0].digest)
    orphan = remember(store, f"sha256:{HEX}")  # saved by a runner after its model was removed
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    linked = store.root / "drafting" / ("cd" * 32)
    os.symlink(outside, linked)
    notes = store.root / "drafting" / "notes"
    notes.mkdir()
    store.prune()
    assert kept.exists() and notes.exists()
    assert not orphan.exists() and not os.path.lexists(linked)
    assert (outside / "precious").read_text() == "x"  # a link is removed, never followed


def test_rm_through_the_daemon_removes_the_state_unless_a_copy_keeps_it(
    fresh_daemon: Daemon, tmp_path: Path
) -> None:
    gguf = write_tiny_llama(tmp_path / "tiny.gguf")
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM {gguf}\n")
    d = fresh_daemon
    assert d.cli("create", "tiny", "-f", str(modelfile)).returncode == 0
    store = Store(d.models)
    (layer,) = store.get(parse_name("tiny")).manifest.layers_of(MEDIA_MODEL)
    folder = remember(store, layer.digest)

    assert d.cli("cp", "tiny", "tiny-copy").returncode == 0
    rm = d.cli("rm", "tiny")
    assert rm.returncode == 0, rm.stderr
    assert (folder / "ngram.pool").read_bytes() == b"saved"  # the copy uses the same weights

    rm = d.cli("rm", "tiny-copy")
    assert rm.returncode == 0, rm.stderr
    assert not folder.exists() and not store.has_blob(layer.digest)
