"""ADAPTER through create, the model view, the load plan and show, in process (tiny GGUFs): the
adapter is checked against the base, stored, passed to the runner config, counted in memory,
and listed by show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelhub.cli.render import show_summary
from modelhub.errors import InputError, NotFoundError
from modelhub.library.create import CreateRequest, Creator, ProgressEvent
from modelhub.library.views import ModelViews
from modelhub.runtime.planning import plan
from modelhub.server.routes_models import show_payload
from modelhub.store import MEDIA_ADAPTER, Store, parse_name
from tests.fixtures.synthetic import (
    lora_targets,
    write_lora,
    write_smollm2_lora,
    write_tiny_llama,
    write_tiny_llama_lora,
)


class Library:
    def __init__(self, root: Path) -> None:
        self.store = Store(root / "models")
        self.views = ModelViews(self.store)
        self.events: list[ProgressEvent] = []

    def upload(self, path: Path) -> str:
        return self.store.import_file(path)[0]

    def create(self, name: str, **kw: Any) -> None:
        Creator(self.store, self.views, self.events.append).run(
            CreateRequest(model=parse_name(name), **kw)
        )


@pytest.fixture
def lib(tmp_path: Path) -> Library:
    return Library(tmp_path)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lib-adapters")
    return {
        "tiny": write_tiny_llama(d / "tiny.gguf"),
        "lora": write_tiny_llama_lora(d / "lora.gguf"),
        "smollm2_lora": write_smollm2_lora(d / "smollm2-lora.gguf"),
    }


def test_create_stores_the_adapter_and_the_plan_loads_it(
    lib: Library, files: dict[str, Path]
) -> None:
    model, lora = lib.upload(files["tiny"]), lib.upload(files["lora"])
    lib.create("tl", files={"tiny.gguf": model}, adapters={"lora.gguf": lora})
    assert ProgressEvent("checking adapter") in lib.events
    view = lib.views.get(parse_name("tl"))
    (layer,) = view.adapters
    assert layer.media_type == MEDIA_ADAPTER and layer.digest == lora
    assert layer.from_ == "lora.gguf"

    spec = plan(view, None).spec
    assert spec.config.adapter_paths == (str(lib.store.blob_path(lora)),)
    plain = lib.upload(files["tiny"])
    lib.create("t", files={"tiny.gguf": plain})
    base_spec = plan(lib.views.get(parse_name("t")), None).spec
    assert base_spec.config.adapter_paths == ()
    assert spec.key != base_spec.key
    assert spec.memory.weights == base_spec.memory.weights + files["lora"].stat().st_size


def test_a_model_from_a_model_keeps_its_adapter(lib: Library, files: dict[str, Path]) -> None:
    lib.create(
        "tl",
        files={"tiny.gguf": lib.upload(files["tiny"])},
        adapters={"lora.gguf": lib.upload(files["lora"])},
    )
    lib.create("tl-ngram", from_="tl", draft="ngram")
    view = lib.views.get(parse_name("tl-ngram"))
    assert [a.from_ for a in view.adapters] == ["lora.gguf"]
    assert plan(view, None).spec.config.draft_kind == "ngram"


def test_a_mismatched_adapter_is_refused_and_nothing_is_written(
    lib: Library, files: dict[str, Path]
) -> None:
    model, lora = lib.upload(files["tiny"]), lib.upload(files["smollm2_lora"])
    with pytest.raises(InputError, match=r"ADAPTER smollm2-lora.gguf: tensor .* has shape"):
        lib.create("bad", files={"tiny.gguf": model}, adapters={"smollm2-lora.gguf": lora})
    with pytest.raises(NotFoundError):
        lib.store.get(parse_name("bad"))


def test_an_f32_adapter_of_rank_8_is_created_with_a_warning(
    lib: Library, files: dict[str, Path], tmp_path: Path
) -> None:
    f32 = write_lora(tmp_path / "f32.gguf", lora_targets((64, 32, 128), (0,)), quant="F32")
    lib.create(
        "tl32",
        files={"tiny.gguf": lib.upload(files["tiny"])},
        adapters={"f32.gguf": lib.upload(f32)},
    )
    warnings = [e.warning for e in lib.events if e.warning and e.warning.startswith("ADAPTER")]
    assert len(warnings) == 1 and "F32 LoRA tensors of rank 8" in warnings[0]


def test_show_lists_the_adapter(lib: Library, files: dict[str, Path]) -> None:
    lora = lib.upload(files["lora"])
    lib.create("tl", files={"tiny.gguf": lib.upload(files["tiny"])}, adapters={"lora.gguf": lora})
    payload = show_payload(lib.views.get(parse_name("tl")), False, None, {})
    assert f"\nADAPTER {lib.store.blob_path(lora)}\n" in payload["modelfile"]
    assert payload["details"]["adapters"] == ["lora.gguf"]
    assert payload["adapters"] == [
        {
            "digest": lora,
            "from": "lora.gguf",
            "size": files["lora"].stat().st_size,
            "architecture": "llama",
            "adapter_type": "lora",
            "rank": 8,
            "tensors": 6,
            "alpha": 16.0,
        }
    ]
    text = show_summary(payload)
    assert "Adapter" in text and "lora.gguf" in text and "rank" in text
