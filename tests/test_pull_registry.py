"""Pulling from an OCI registry on loopback: statuses, cache hits, auth, hostile registries."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from devtools.pullservers import (
    MEDIA_CONFIG,
    MEDIA_MANIFEST,
    MEDIA_MODEL,
    Fault,
    FileServer,
    Recorder,
    RegistryServer,
    fast_policy,
    gzip_bomb,
    sha256,
)
from modelhub.errors import (
    DigestMismatchError,
    ForbiddenError,
    InvalidDigestError,
    ModelhubError,
    NotFoundError,
    SourceUnavailableError,
)
from modelhub.library.pulled import installer
from modelhub.pull import MANIFEST_NOT_FOUND, pull_model
from modelhub.store import MEDIA_TEMPLATE, Store, parse_name

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "models")


@pytest.fixture
def registry() -> RegistryServer:
    with RegistryServer() as server:
        yield server


def pull(store: Store, ref: str, recorder: Recorder | None = None, **kw: object) -> str:
    kw.setdefault("insecure", True)
    kw.setdefault("policy", fast_policy())
    kw.setdefault("install", installer(store))
    name = pull_model(store, ref, progress=recorder or Recorder(), **kw)  # type: ignore[arg-type]
    return name.display


def assert_invariant(store: Store) -> None:
    assert store.verify(rehash=True) == []
    leftovers = [
        p.name
        for p in store.blobs_dir.iterdir()
        if not p.name.startswith("sha256-") or p.name.endswith("partial") or "-partial-" in p.name
    ]
    assert leftovers == []


def test_pull_streams_ollama_statuses_and_stores_the_manifest_verbatim(store, registry):
    weights, template = os.urandom(2 << 20), b"{{ .Prompt }}"
    raw = registry.add_model(
        "library/tiny", "v1", [(MEDIA_MODEL, weights), (MEDIA_TEMPLATE, template)]
    )
    recorder = Recorder()
    name = pull(store, f"{registry.host}/library/tiny:v1", recorder)

    assert name == f"{registry.host}/library/tiny:v1"
    weights_hex, template_hex = sha256(weights)[7:19], sha256(template)[7:19]
    config_hex = json.loads(raw)["config"]["digest"][7:19]
    assert recorder.compact() == [
        "pulling manifest",
        f"pulling {weights_hex}",
        f"pulling {template_hex}",
        f"pulling {config_hex}",
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    weight_lines = [i for i in recorder.items if i["status"] == f"pulling {weights_hex}"]
    assert weight_lines[-1] == {
        "status": f"pulling {weights_hex}",
        "digest": sha256(weights),
        "total": len(weights),
        "completed": len(weights),
    }
    assert all(i.get("completed", 0) <= i["total"] for i in weight_lines)
    stored = store.get(parse_name(name))
    assert stored.raw == raw  # the registry's bytes, verbatim (the model ID is their hash)
    assert store.blob_path(sha256(weights)).read_bytes() == weights
    assert_invariant(store)


def test_second_pull_is_all_cache_hits_and_downloads_nothing(store, registry):
    registry.add_model("library/tiny", "latest", [(MEDIA_MODEL, os.urandom(300_000))])
    pull(store, f"{registry.host}/library/tiny")
    blob_requests = len(registry.hits("/blobs/"))
    recorder = Recorder()
    pull(store, f"{registry.host}/library/tiny", recorder)
    assert len(registry.hits("/blobs/")) == blob_requests
    pulling = [i for i in recorder.items if i["status"].startswith("pulling ") and "digest" in i]
    assert len(pulling) == 2
    assert all(i["completed"] == i["total"] for i in pulling)  # one object per cached layer


def test_missing_model_gives_the_exact_ollama_error(store, registry):
    recorder = Recorder()
    with pytest.raises(NotFoundError) as error:
        pull(store, f"{registry.host}/library/nothing:here", recorder)
    assert str(error.value) == MANIFEST_NOT_FOUND == "pull model manifest: file does not exist"
    assert recorder.statuses == ["pulling manifest"]


def test_registry_over_plain_http_needs_insecure(store, registry):
    registry.add_model("library/tiny", "latest", [(MEDIA_MODEL, b"x" * 10)])
    with pytest.raises(SourceUnavailableError, match="pull model manifest"):
        pull(store, f"{registry.host}/library/tiny", insecure=False)
    assert store.list_models() == []


def test_bearer_token_flow_and_credentials_stay_on_the_registry_origin(store):
    with FileServer() as cdn, RegistryServer(token="s3cret", cdn=cdn) as registry:
        weights = os.urandom(600_000)
        registry.add_model("library/tiny", "latest", [(MEDIA_MODEL, weights)])
        pull(store, f"{registry.host}/library/tiny")
        assert registry.hits("/token")  # the 401 was answered with a token
        authorised = [h for h in registry.hits("/v2/") if "authorization" in h.headers]
        assert authorised and all(h.headers["authorization"] == "Bearer s3cret" for h in authorised)
        assert cdn.hits("/cdn/")  # blobs came from the CDN the registry redirected to...
        assert all("authorization" not in h.headers for h in cdn.log)  # ...without the token
    assert store.blob_path(sha256(weights)).read_bytes() == weights


def test_token_realm_on_another_host_is_refused_before_contacting_it(store):
    with FileServer() as attacker, RegistryServer(token="t", realm="") as registry:
        registry.realm = f"{attacker.url}/token"
        registry.add_model("library/tiny", "latest", [(MEDIA_MODEL, b"x")])
        with pytest.raises(ModelhubError, match=r"realm host .* does not match"):
            pull(store, f"{registry.host}/library/tiny")
        assert attacker.log == []


@pytest.mark.parametrize(
    "location",
    [
        "file:///etc/passwd",
        "ftp://127.0.0.1/x",
        "gopher://127.0.0.1/",
        "http://169.254.169.254/x",
        "http://[::ffff:169.254.169.254]/x",
        "http://0.0.0.0:9/x",
        "http://[fe80::1]/x",
    ],
)
def test_blob_redirects_to_other_schemes_or_metadata_addresses_are_refused(store, location):
    with FileServer() as cdn, RegistryServer(cdn=cdn) as registry:
        weights = os.urandom(1000)
        registry.add_model("library/tiny", "latest", [(MEDIA_MODEL, weights)])
        registry.cdn = None
        registry.faults[sha256(weights)] = Fault(redirect=location)
        with pytest.raises(ForbiddenError, match="refusing a redirect"):
            pull(store, f"{registry.host}/library/tiny")
    assert store.list_models() == []
    assert_invariant(store)


HOSTILE_DIGESTS = [
    "../x",
    "sha256:../../x",
    "sha256:" + "a" * 63,
    "sha256:" + "a" * 65,
    "sha256:" + "a" * 64 + "/x",
    "sha256:" + "a" * 63 + "\x00",
    "sha512:" + "a" * 128,
    "",
    "sha256:" + "A" * 64,
    "sha256-" + "a" * 64,
]


@pytest.mark.parametrize("digest", HOSTILE_DIGESTS)
def test_hostile_digests_are_refused_before_any_blob_request(store, registry, tmp_path, digest):
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": sha256(b"{}"), "size": 2},
        "layers": [{"mediaType": MEDIA_MODEL, "digest": digest, "size": 1}],
    }
    registry.manifests["library/evil:latest"] = json.dumps(manifest).encode()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InvalidDigestError, match="invalid digest"):
        pull(store, f"{registry.host}/library/evil")
    assert registry.hits("/blobs/") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert list(store.blobs_dir.iterdir()) == []


@pytest.mark.parametrize("fault", ["oversize", "gzip-bomb"])
def test_oversized_manifests_are_refused_with_bounded_memory(store, registry, fault):
    import resource

    registry.manifest_faults["library/big:latest"] = fault
    gzip_bomb()  # built before the request, so that the server answers at once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelhubError, match="manifest too large"):
        pull(store, f"{registry.host}/library/big")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 64
    assert registry.hits("/blobs/") == []


def test_duplicate_digest_with_wrong_bytes_is_still_verified(store, registry):
    """SEC-13: config == layer digest, the server sends other bytes: no blob, no manifest."""
    good = os.urandom(5000)
    digest = sha256(good)
    registry.blobs[digest] = os.urandom(5000)  # wrong bytes under that name
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": digest, "size": 5000},
        "layers": [{"mediaType": MEDIA_MODEL, "digest": digest, "size": 5000}],
    }
    registry.manifests["library/dup:latest"] = json.dumps(manifest).encode()
    with pytest.raises(DigestMismatchError, match="file must be downloaded again"):
        pull(store, f"{registry.host}/library/dup")
    assert not store.has_blob(digest)
    assert store.list_models() == []
    assert_invariant(store)


def test_a_server_sending_more_than_the_declared_size_is_cut_off(store, registry):
    """STO-04: the manifest's size rules; an endless body is refused after that many bytes."""
    weights = os.urandom(200_000)
    registry.add_model(
        "library/fat",
        "latest",
        [(MEDIA_MODEL, weights)],
    )
    registry.faults[sha256(weights)] = Fault(endless=True, ignore_range=True)
    with pytest.raises(ModelhubError, match="more than the 200000 bytes"):
        pull(store, f"{registry.host}/library/fat")
    assert not store.has_blob(sha256(weights))


def test_a_manifest_size_that_lies_is_refused(store, registry):
    weights = os.urandom(100_000)
    raw = json.loads(registry.add_model("library/liar", "latest", [(MEDIA_MODEL, weights)]))
    raw["layers"][0]["size"] = 50_000  # smaller than the real blob
    registry.manifests["library/liar:latest"] = json.dumps(raw).encode()
    with pytest.raises(ModelhubError, match=r"100000 bytes, 50000 were expected|more than"):
        pull(store, f"{registry.host}/library/liar")
    assert store.list_models() == []
    assert_invariant(store)


def test_a_draft_layer_is_pulled_with_the_model(store, registry):
    draft = os.urandom(70_000)
    registry.add_model(
        "library/spec",
        "latest",
        [(MEDIA_MODEL, os.urandom(90_000)), ("application/vnd.ollama.image.draft", draft)],
    )
    pull(store, f"{registry.host}/library/spec")
    model = store.get(parse_name(f"{registry.host}/library/spec"))
    assert [layer.media_type for layer in model.manifest.layers][-1].endswith(".draft")
    assert store.blob_path(sha256(draft)).read_bytes() == draft


def test_no_draft_leaves_the_draft_layer_and_its_config_entry_out(store, registry):
    weights, draft = os.urandom(90_000), os.urandom(70_000)
    config = {"model_format": "gguf", "model_family": "llama", "draft": {"kind": "draft_model"}}
    raw = registry.add_model(
        "library/spec",
        "latest",
        [(MEDIA_MODEL, weights), ("application/vnd.ollama.image.draft", draft)],
        config=json.dumps(config).encode(),
    )
    recorder = Recorder()
    pull(store, f"{registry.host}/library/spec", recorder, no_draft=True)
    assert f"not pulling the draft layer {sha256(draft)[7:19]} (no_draft)" in recorder.statuses
    assert registry.hits(sha256(draft)[7:]) == []  # never requested
    model = store.get(parse_name(f"{registry.host}/library/spec"))
    assert [layer.digest for layer in model.manifest.layers] == [sha256(weights)]
    stored = json.loads(store.read_blob_bytes(model.manifest.config.digest))
    assert stored == {"model_format": "gguf", "model_family": "llama"}
    assert model.raw != raw and not store.has_blob(sha256(draft))
    assert_invariant(store)
    # without no_draft the same model comes whole, verbatim
    pull(store, f"{registry.host}/library/spec")
    assert store.get(parse_name(f"{registry.host}/library/spec")).raw == raw


def test_repulling_a_changed_tag_removes_unused_layers(store, registry):
    registry.add_model("library/m", "latest", [(MEDIA_MODEL, b"old weights" * 100)])
    pull(store, f"{registry.host}/library/m")
    registry.add_model("library/m", "latest", [(MEDIA_MODEL, b"new weights" * 100)])
    recorder = Recorder()
    pull(store, f"{registry.host}/library/m", recorder)
    assert recorder.statuses[-2:] == ["removing unused layers", "success"]
    assert not store.has_blob(sha256(b"old weights" * 100))


def test_unreachable_registry_fails_fast(store):
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(SourceUnavailableError, match="cannot connect"):
        pull(store, f"127.0.0.1:{port}/library/m")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("8.8.8.8", "public"),
        ("2606:4700:4700::1111", "public"),
        ("127.0.0.1", "local"),
        ("[::1]", "local"),
        ("localhost", "local"),
        ("api.localhost", "local"),
        ("10.1.2.3", "local"),
        ("192.168.0.7", "local"),
        ("::ffff:127.0.0.1", "local"),
        ("169.254.169.254", "forbidden"),
        ("::ffff:169.254.169.254", "forbidden"),
        ("fe80::1", "forbidden"),
        ("0.0.0.0", "forbidden"),
        ("224.0.0.1", "forbidden"),
    ],
)
def test_address_kinds(host, kind):
    from modelhub.pull.http import address_kind

    assert address_kind(host) == kind


def test_redirect_hops_from_a_public_start_may_not_turn_private_or_plain():
    from modelhub.pull.http import PUBLIC, HttpClient

    with HttpClient(fast_policy()) as client:
        start = "https://registry.example.org/v2/x/blobs/y"
        assert client.check_redirect(start, "https://8.8.8.8/blob", PUBLIC) == (
            "https://8.8.8.8/blob"
        )
        for target, reason in [
            ("https://127.0.0.1/blob", "public host to a private one"),
            ("https://10.0.0.5/blob", "public host to a private one"),
            ("http://8.8.8.8/blob", "from https to plain http"),
            ("//169.254.169.254/latest/meta-data", "link-local"),
            ("data:text/plain,hi", "non-HTTP"),
        ]:
            with pytest.raises(ForbiddenError, match=reason):
                client.check_redirect(start, target, PUBLIC)
