"""Projectors (mmproj) in pulls, on loopback: a registry manifest's projector layer is kept, a
Hugging Face repo's ``mmproj-*.gguf`` beside the chosen weights becomes the model's projector
layer, verified like every blob, and one that cannot serve the model is left out with a
warning (issue 23)."""

from __future__ import annotations

import pytest

from devtools.pullservers import MEDIA_MODEL, Fault, Recorder, RegistryServer, sha256
from modelhub.library.views import ModelViews
from modelhub.pull.sources.hf import RepoFile, choose_projector
from modelhub.server.images import projector_facts
from modelhub.store import MEDIA_DRAFT, MEDIA_PROJECTOR, Store, parse_name
from tests.fixtures import pull_loopback
from tests.fixtures.pull_loopback import assert_the_pull_fails_on_corruption, pull, tiny_ggufs
from tests.fixtures.synthetic_projector import write_projector

pytestmark = pytest.mark.timeout(120)
store, hub = pull_loopback.store, pull_loopback.hub  # fixtures


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The tiny llama (64 wide), a projector for it, one for a 576-wide model, a draft."""
    base = tmp_path_factory.mktemp("ggufs")
    return {
        **tiny_ggufs(base),
        "mmproj": write_projector(base / "p64.gguf", n_embd_text=64).read_bytes(),
        "mmproj-576": write_projector(base / "p576.gguf").read_bytes(),
    }


def assert_vision(store: Store, name: str, projector: bytes) -> None:
    model = store.get(parse_name(name))
    (layer,) = model.manifest.layers_of(MEDIA_PROJECTOR)
    assert layer.digest == sha256(projector)
    assert store.blob_path(layer.digest).read_bytes() == projector
    view = ModelViews(store).get(parse_name(name))
    capabilities, info = projector_facts(view)
    assert capabilities == ["vision"] and info is not None
    assert info["clip.projector_type"] == "mlp"
    assert store.verify(rehash=True) == []


# ----- the Ollama registry ---------------------------------------------------------------------


def test_registry_projector_layer_is_kept_and_verified(store: Store, ggufs) -> None:
    with RegistryServer() as registry:
        registry.add_model(
            "library/seer",
            "latest",
            [(MEDIA_MODEL, ggufs["Q8_0"]), (MEDIA_PROJECTOR, ggufs["mmproj"])],
        )
        recorder = Recorder()
        name = pull(store, f"{registry.host}/library/seer", recorder, insecure=True)
        assert f"pulling {sha256(ggufs['mmproj'])[7:19]}" in recorder.statuses
        assert_vision(store, name, ggufs["mmproj"])
        # no_draft leaves drafts out, never the projector
        again = pull(store, f"{registry.host}/library/seer", insecure=True, no_draft=True)
        assert store.get(parse_name(again)).manifest.layers_of(MEDIA_PROJECTOR)


def test_registry_corrupt_projector_blob_fails_the_pull(store: Store, ggufs) -> None:
    with RegistryServer() as registry:
        registry.add_model(
            "library/bad-eyes",
            "latest",
            [(MEDIA_MODEL, ggufs["Q8_0"]), (MEDIA_PROJECTOR, ggufs["mmproj"])],
        )
        registry.faults[sha256(ggufs["mmproj"])] = Fault(corrupt_at=100)
        assert_the_pull_fails_on_corruption(
            store, f"{registry.host}/library/bad-eyes", insecure=True
        )


# ----- Hugging Face ----------------------------------------------------------------------------


def test_hf_mmproj_beside_the_weights_is_attached(store: Store, hub, ggufs) -> None:
    hub.add_repo(
        "org/seer",
        {
            "seer-Q8_0.gguf": ggufs["Q8_0"],
            "seer-draft-Q8_0.gguf": ggufs["draft"],
            "mmproj-seer-F16.gguf": ggufs["mmproj"],
        },
    )
    recorder = Recorder()
    name = pull(store, "hf.co/org/seer", recorder)
    assert f"pulling {sha256(ggufs['mmproj'])[7:19]}" in recorder.statuses
    assert not [w for w in recorder.warnings if "projector" in w]
    assert_vision(store, name, ggufs["mmproj"])
    (layer,) = store.get(parse_name(name)).manifest.layers_of(MEDIA_PROJECTOR)
    assert layer.from_ == "mmproj-seer-F16.gguf"
    assert store.get(parse_name(name)).manifest.layers_of(MEDIA_DRAFT)  # the draft still comes


def test_hf_corrupt_projector_download_fails_the_pull(store: Store, hub, ggufs) -> None:
    hub.add_repo(
        "org/blurry",
        {"seer-Q8_0.gguf": ggufs["Q8_0"], "mmproj-seer-F16.gguf": ggufs["mmproj"]},
        faults={"mmproj-seer-F16.gguf": Fault(corrupt_at=100)},
    )
    assert_the_pull_fails_on_corruption(store, "hf.co/org/blurry")


@pytest.mark.parametrize("case", ["another width", "not a projector"])
def test_hf_projector_that_cannot_serve_is_left_out_with_a_warning(
    store: Store, hub, ggufs, case: str
) -> None:
    data = ggufs["mmproj-576"] if case == "another width" else ggufs["draft"]
    hub.add_repo(
        "org/odd-eyes",
        {
            "seer-Q8_0.gguf": ggufs["Q8_0"],
            "seer-draft-Q8_0.gguf": ggufs["draft"],
            "mmproj-seer-F16.gguf": data,
        },
    )
    recorder = Recorder()
    name = pull(store, "hf.co/org/odd-eyes", recorder)
    model = store.get(parse_name(name))
    assert model.manifest.layers_of(MEDIA_PROJECTOR) == []
    assert model.manifest.layers_of(MEDIA_DRAFT)  # the good draft is kept
    (warning,) = [w for w in recorder.warnings if w.startswith("the projector")]
    assert warning.startswith(
        "the projector mmproj-seer-F16.gguf that came with the model is not used "
        "(the model was installed without it): "
    )
    assert f"warning: {warning}" in recorder.statuses
    assert ("width 576" if case == "another width" else "not a projector") in warning
    assert recorder.statuses[-1] == "success"


@pytest.mark.parametrize(
    ("files", "weights", "chosen"),
    [
        # the weights' quant, else F16, else BF16, ..., else one naming no quant
        (["mmproj-m-Q8_0.gguf", "mmproj-m-F16.gguf"], "m-Q8_0.gguf", "mmproj-m-Q8_0.gguf"),
        (["mmproj-m-Q8_0.gguf", "mmproj-m-F16.gguf"], "m-Q4_K_M.gguf", "mmproj-m-F16.gguf"),
        (["mmproj-m-F32.gguf", "mmproj-m-BF16.gguf"], "m-Q4_K_M.gguf", "mmproj-m-BF16.gguf"),
        (["mmproj.gguf", "mmproj-m-Q4_0.gguf"], "m-Q4_K_M.gguf", "mmproj.gguf"),
        # beside the weights first
        (["a/mmproj-F16.gguf", "b/mmproj-F32.gguf"], "b/m-Q4_K_M.gguf", "b/mmproj-F32.gguf"),
        # none, or only split or non-GGUF ones
        (["m-Q4_K_M.gguf", "imatrix.gguf"], "m-Q4_K_M.gguf", None),
        (["mmproj-F16-00001-of-00002.gguf", "mmproj.bin"], "m-Q4_K_M.gguf", None),
    ],
)
def test_hf_projector_choice(files: list[str], weights: str, chosen: str | None) -> None:
    listing = [RepoFile(path, 100, None) for path in files]
    found = choose_projector(listing, weights)
    assert (found.path if found else None) == chosen
