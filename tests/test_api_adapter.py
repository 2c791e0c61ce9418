"""ADAPTER through the real daemon and CLI: create checks the adapter against its base, a model
with an adapter generates the adapted model's output (alone and with DRAFT ngram), and show
lists it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q4_1
from tests.fixtures.synthetic import (
    write_other_arch_lora,
    write_smollm2_lora,
    write_tiny_llama_lora,
)

pytestmark = pytest.mark.slow

PROMPT = "Write a short poem about the sea."
GREEDY = {"temperature": 0, "num_predict": 20}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with ``smol`` (SmolLM2) and ``smol-lora`` (SmolLM2 + the LoRA fixture)."""
    base = tmp_path_factory.mktemp("adapter-daemon")
    d = start_daemon(base / "models", base / "daemon.log", {"MODELHUB_NUM_PARALLEL": "1"})
    (base / "smol.gguf").symlink_to(smollm2_q4_1())
    write_smollm2_lora(base / "lora.gguf")
    for name, text in (
        ("smol", "FROM ./smol.gguf\nPARAMETER num_ctx 512\n"),
        ("smol-lora", "FROM ./smol.gguf\nADAPTER ./lora.gguf\nPARAMETER num_ctx 512\n"),
    ):
        (base / "Modelfile").write_text(text)
        d.create(name, base / "Modelfile")
    yield d
    d.stop()


def generate(d: Daemon, model: str, options: dict[str, Any] = GREEDY) -> dict[str, Any]:
    with d.client() as c:
        r = c.post(
            "/api/generate",
            json={"model": model, "prompt": PROMPT, "options": options, "stream": False},
        )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def loaded(d: Daemon) -> set[str]:
    with d.client() as c:
        return {m["name"] for m in c.get("/api/ps").json()["models"]}


def test_a_model_with_an_adapter_generates_the_adapted_output(served: Daemon) -> None:
    plain = generate(served, "smol")
    adapted, again = generate(served, "smol-lora"), generate(served, "smol-lora")
    assert adapted["response"] != plain["response"]
    assert adapted["response"] == again["response"]
    # The adapter is part of the runner's load options: the same weights without it are
    # another runner (the scheduler keeps one per weights file), never the adapted one.
    assert "smol-lora:latest" in loaded(served) and "smol:latest" not in loaded(served)


def test_drafting_with_an_adapter_is_lossless(served: Daemon, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text("FROM smol-lora\nDRAFT ngram\n")
    served.create("smol-lora-ngram", tmp_path / "Modelfile")
    alone = generate(served, "smol-lora")
    # From the second time the n-gram pool holds the answer; adaptive drafting may still sit a
    # request out on a busy machine, so ask until one drafts (every answer must be the same).
    runs = []
    for _ in range(5):
        runs.append(generate(served, "smol-lora-ngram"))
        if len(runs) > 1 and runs[-1].get("draft_accepted_count", 0) > 0:
            break
    assert all(r["response"] == alone["response"] for r in runs)
    assert runs[-1]["draft_count"] >= runs[-1]["draft_accepted_count"] > 0


def test_show_lists_the_adapter(served: Daemon) -> None:
    with served.client() as c:
        show = c.post("/api/show", json={"model": "smol-lora"}).json()
    (adapter,) = show["adapters"]
    blob = served.models / "blobs" / adapter["digest"].replace(":", "-")
    assert f"\nADAPTER {blob}\n" in show["modelfile"]
    assert show["details"]["adapters"] == ["lora.gguf"]
    assert adapter["from"] == "lora.gguf" and adapter["rank"] == 8
    assert adapter["architecture"] == "llama" and adapter["tensors"] == 12
    summary = served.cli("show", "smol-lora")
    assert summary.returncode == 0, summary.stderr
    assert "Adapter" in summary.stdout and "lora.gguf" in summary.stdout


@pytest.mark.parametrize(
    ("writer", "expected"),
    [
        (write_tiny_llama_lora, "tensor 'blk.0.attn_q.weight.lora_a' has shape [64, 8]"),
        (write_other_arch_lora, "the adapter is for a 'gemma3' model but the base model is"),
    ],
)
def test_a_mismatched_adapter_is_refused_at_create(
    served: Daemon, tmp_path: Path, writer: Any, expected: str
) -> None:
    writer(tmp_path / "wrong.gguf")
    (tmp_path / "Modelfile").write_text("FROM smol\nADAPTER ./wrong.gguf\n")
    r = served.cli("create", "smol-wrong", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode != 0
    assert r.stderr.startswith("Error: ADAPTER wrong.gguf: ") and expected in r.stderr
    assert "Traceback" not in r.stderr
    with served.client() as c:
        body = c.post(
            "/api/create",
            json={
                "model": "smol-wrong",
                "from": "smol",
                "adapters": _uploaded(c, tmp_path),
                "stream": False,
            },
        )
        assert body.status_code == 400 and expected in json.loads(body.text)["error"]
        assert c.post("/api/show", json={"model": "smol-wrong"}).status_code == 404


def _uploaded(c: Any, tmp_path: Path) -> dict[str, str]:
    import hashlib

    data = (tmp_path / "wrong.gguf").read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert c.post(f"/api/blobs/{digest}", content=data).status_code in (200, 201)
    return {"wrong.gguf": digest}
