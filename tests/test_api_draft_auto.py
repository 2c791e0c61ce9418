"""Drafting on by default (``DRAFT auto``): a model created without a ``DRAFT`` line drafts with
the drafters it has, chosen by measurement, with the same output as drafting off; ``DRAFT
none``, ``options.draft: "off"`` and ``MODELHUB_DRAFT=off`` draft nothing; a request may name a
drafter (400 for one the model lacks); what drafting learned survives a daemon restart; the
catalog's suggestion finds a draft model in the store. Through the real daemon (SPEC-16)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.pullservers import FileServer, HFServer
from devtools.realmodels import smollm2_q4_1
from modelhub.library.views import ModelViews
from modelhub.runtime.planning import DraftSettings, plan
from modelhub.store import Store, parse_name
from tests.fixtures.synthetic import write_tiny_llama_pair, write_tiny_mtp
from tests.fixtures.synthetic_drafters import write_tiny_gemma4, write_tiny_gemma4_assistant
from tests.fixtures.synthetic_hybrid import write_tiny_qwen35

pytestmark = pytest.mark.slow

# A prompt whose answer copies text the model has just read: n-gram drafting's case.
EDIT = (
    "Copy this text exactly, word for word:\n"
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump. The five boxing wizards jump quickly.\n"
)
GREEDY = {"temperature": 0, "num_predict": 48}


def create(d: Daemon, tmp: Path, name: str, text: str) -> None:
    mf = tmp / f"{name}.Modelfile"
    mf.write_text(text)
    d.create(name, mf)


def generate(c: httpx.Client, model: str, options: dict[str, Any], prompt: str = EDIT) -> Any:
    r = c.post(
        "/api/generate",
        json={"model": model, "prompt": prompt, "options": options, "stream": False},
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("auto")
    d = start_daemon(base / "models", base / "daemon.log", {"MODELHUB_KEEP_ALIVE": "10m"})
    create(d, base, "smol", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 1024\n")
    create(d, base, "smol-none", "FROM smol\nDRAFT none\n")
    yield d
    d.stop()


def test_a_model_without_draft_drafts_with_the_same_text(served: Daemon) -> None:
    with served.client() as c:
        drafted = generate(c, "smol", GREEDY)
        plain = generate(c, "smol", {**GREEDY, "draft": "off"})
        chat = c.post(
            "/v1/chat/completions",
            json={
                "model": "smol",
                "messages": [{"role": "user", "content": EDIT}],
                "temperature": 0,
                "max_tokens": 48,
            },
        ).json()
        ps = c.get("/api/ps").json()["models"]
        show = c.post("/api/show", json={"model": "smol"}).json()
    assert drafted["response"] == plain["response"]
    assert drafted["draft_count"] >= drafted["draft_accepted_count"] > 0, drafted
    assert drafted["drafter"] == "ngram"
    assert sum(drafted["draft_count_by_position"]) == drafted["draft_count"]
    assert sum(drafted["draft_accepted_by_position"]) == drafted["draft_accepted_count"]
    assert drafted["draft_speedup"] > 0
    assert "draft_count" not in plain and "drafter" not in plain
    timings = chat["timings"]
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0, chat
    entry = next(m for m in ps if m["name"] == "smol:latest")
    assert entry["draft"]["kind"] == "auto" and entry["draft"]["drafters"] == ["ngram"]
    assert entry["draft"]["draft_accepted_count"] > 0 and entry["draft"]["in_use"] == "ngram"
    assert show["drafting"]["mode"] == "auto"
    assert [d["name"] for d in show["drafting"]["drafters"]] == ["ngram"]
    measured = show["drafting"]["measured"]  # asked of the loaded runner
    assert any(r["name"] == "ngram" and r["rounds"] > 0 for r in measured["drafters"]), measured
    out = served.cli("show", "smol").stdout
    assert "Drafting" in out and "auto" in out and "ngram" in out
    assert "auto: ngram" in served.cli("ps").stdout


def test_draft_none_and_draft_off_draft_nothing(served: Daemon) -> None:
    with served.client() as c:
        none = generate(c, "smol-none", GREEDY)
        show = c.post("/api/show", json={"model": "smol-none"}).json()
        # Fixed length: the subject is that a request may name a drafter, not whether the
        # controller finds drafting worth it on a host other processes keep busy.
        fixed = {**GREEDY, "draft": "ngram", "draft_adaptive": False}
        asked = generate(c, "smol-none", fixed)
    assert "draft_count" not in none, none
    assert show["drafting"]["mode"] == "none"
    assert asked["response"] == none["response"] and asked["draft_accepted_count"] > 0, asked
    assert asked["drafter"] == "ngram"


def test_a_drafter_the_model_lacks_is_a_400_that_lists_its_drafters(served: Daemon) -> None:
    with served.client() as c:
        bad = c.post(
            "/api/generate",
            json={"model": "smol", "prompt": "hi", "options": {"draft": "eagle3"}},
        )
        bad_v1 = c.post(
            "/v1/chat/completions",
            json={"model": "smol", "messages": [{"role": "user", "content": "hi"}], "draft": "mtp"},
        )
        wrong_type = c.post(
            "/api/generate", json={"model": "smol", "prompt": "hi", "options": {"draft": 3}}
        )
    assert bad.status_code == 400 and "'eagle3'" in bad.json()["error"], bad.text
    assert "ngram" in bad.json()["error"] and "auto, off" in bad.json()["error"]
    assert bad_v1.status_code == 400 and "'mtp'" in bad_v1.text
    assert wrong_type.status_code == 400 and "draft" in wrong_type.json()["error"]


def test_modelhub_draft_off_is_the_daemon_wide_default(tmp_path: Path) -> None:
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_DRAFT": "off"})
    try:
        create(d, tmp_path, "smol", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 1024\n")
        create(d, tmp_path, "smol-auto", "FROM smol\nDRAFT auto\n")
        with d.client() as c:
            off = generate(c, "smol", GREEDY)
            auto = generate(c, "smol-auto", GREEDY)
    finally:
        d.stop()
    assert "draft_count" not in off
    assert auto["response"] == off["response"] and auto["draft_accepted_count"] > 0


def test_what_drafting_learned_survives_a_restart(tmp_path: Path) -> None:
    models = tmp_path / "models"
    d = start_daemon(models, tmp_path / "daemon.log")
    # Drafting at a fixed length: what the two answers accept then depends on what the pool
    # proposes, not on the controller's choices from timings (a busy machine changes those).
    fixed = "PARAMETER draft_adaptive false\n"
    try:
        create(d, tmp_path, "smol", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 1024\n{fixed}")
        with d.client() as c:
            first = generate(c, "smol", GREEDY)
            generate(c, "smol", GREEDY, prompt="Name three colours.")
    finally:
        d.stop()  # the runner is shut down: it keeps what it learned
    (state,) = (models / "drafting").iterdir()
    doc = json.loads((state / "drafting.json").read_text())
    assert doc["total_requests"] == 2 and (state / "ngram.bin").stat().st_size > 0
    d = start_daemon(models, tmp_path / "daemon2.log")
    try:
        with d.client() as c:
            show = c.post("/api/show", json={"model": "smol"}).json()  # not loaded: from disk
            again = generate(c, "smol", GREEDY)
    finally:
        d.stop()
    measured = show["drafting"]["measured"]
    assert measured["requests"] == 2 and measured["drafters"][0]["name"] == "ngram", measured
    assert again["response"] == first["response"]
    # The pool remembers the first answer: the repeat drafts more of it than the first time.
    assert again["draft_accepted_count"] > first["draft_accepted_count"], (first, again)


def test_no_ngram_pool_is_kept_with_persistence_off(tmp_path: Path) -> None:
    models = tmp_path / "models"
    d = start_daemon(models, tmp_path / "daemon.log", {"MODELHUB_NGRAM_PERSIST": "0"})
    try:
        create(d, tmp_path, "smol", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 1024\n")
        with d.client() as c:
            assert generate(c, "smol", GREEDY)["draft_accepted_count"] > 0
    finally:
        d.stop()
    (state,) = (models / "drafting").iterdir()
    assert (state / "drafting.json").exists() and not (state / "ngram.bin").exists()


def test_mtp_heads_and_store_drafts_are_candidates(tmp_path: Path) -> None:
    """The synthetic NextN model drafts with its own heads without a DRAFT line; a tiny target
    finds its draft model in the store through the catalog's suggestion."""
    target, draft = write_tiny_llama_pair(tmp_path)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "version: 1\nmodels:\n  tiny-target:latest:\n    description: a test target\n"
        "    family: llama\n    sources:\n      - file: /nonexistent.gguf\n"
        "        pinned: false\n    drafts: [tiny-draft]\n"
    )
    d = start_daemon(
        tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_CATALOG": str(catalog)}
    )
    try:
        create(d, tmp_path, "tiny-mtp", f"FROM {write_tiny_mtp(tmp_path / 'mtp.gguf')}\n")
        hybrid = write_tiny_qwen35(tmp_path / "qwen35.gguf")
        create(d, tmp_path, "tiny-hybrid", f"FROM {hybrid}\n")
        create(d, tmp_path, "tiny-target", f"FROM {target}\n")
        create(d, tmp_path, "tiny-draft", f"FROM {draft}\n")
        prompt = "the cat sat on the mat and the dog"
        opts = {"temperature": 0, "num_predict": 24}
        with d.client() as c:
            show_mtp = c.post("/api/show", json={"model": "tiny-mtp"}).json()["drafting"]
            show_target = c.post("/api/show", json={"model": "tiny-target"}).json()["drafting"]
            mtp = generate(c, "tiny-mtp", {**opts, "draft": "mtp"}, prompt)
            mtp_off = generate(c, "tiny-mtp", {**opts, "draft": "off"}, prompt)
            mtp_auto = generate(c, "tiny-mtp", opts, prompt)
            hybrid_mtp = generate(c, "tiny-hybrid", {**opts, "draft": "mtp"}, prompt)
            hybrid_off = generate(c, "tiny-hybrid", {**opts, "draft": "off"}, prompt)
            paired = generate(c, "tiny-target", {**opts, "draft": "tiny-draft:latest"}, prompt)
            paired_off = generate(c, "tiny-target", {**opts, "draft": "off"}, prompt)
    finally:
        d.stop()
    assert [x["name"] for x in show_mtp["drafters"]] == ["mtp", "ngram"], show_mtp
    assert [x["name"] for x in show_target["drafters"]] == ["tiny-draft:latest", "ngram"]
    assert mtp["response"] == mtp_off["response"] == mtp_auto["response"]
    assert mtp["drafter"] == "mtp" and mtp["draft_count"] > 0, mtp
    assert hybrid_mtp["response"] == hybrid_off["response"]
    assert hybrid_mtp["drafter"] == "mtp" and hybrid_mtp["draft_count"] > 0, hybrid_mtp
    assert paired["response"] == paired_off["response"]
    assert paired["drafter"] == "tiny-draft:latest" and paired["draft_count"] > 0, paired


def test_a_pulled_gemma4_assistant_drafts_by_default(tmp_path: Path) -> None:
    """A Gemma 4 repo with its assistant: pulled from a loopback Hugging Face, the model drafts
    with the assistant without a DRAFT line, with the text of drafting off."""
    target = write_tiny_gemma4(tmp_path / "target.gguf")
    assistant = write_tiny_gemma4_assistant(tmp_path / "assistant.gguf", target)
    files = {
        "gemma-4-tiny-it-Q8_0.gguf": target.read_bytes(),
        "gemma-4-tiny-it-assistant-Q8_0.gguf": assistant.read_bytes(),
    }
    name = "hf.co/org/gemma-4-tiny-it-GGUF:Q8_0"
    with FileServer() as cdn, HFServer(cdn) as hub:
        hub.add_repo("org/gemma-4-tiny-it-GGUF", files)
        d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", {"HF_ENDPOINT": hub.url})
        try:
            assert d.cli("pull", name).returncode == 0
            prompt = "the cat sat on the mat and the dog"
            opts = {"temperature": 0, "num_predict": 24}
            with d.client() as c:
                drafting = c.post("/api/show", json={"model": name}).json()["drafting"]
                assisted = generate(c, name, {**opts, "draft": "mtp_drafter"}, prompt)
                auto = generate(c, name, opts, prompt)
                off = generate(c, name, {**opts, "draft": "off"}, prompt)
        finally:
            d.stop()
    assert drafting["mode"] == "auto"
    assert [x["name"] for x in drafting["drafters"]] == ["mtp_drafter", "ngram"], drafting
    assert assisted["response"] == auto["response"] == off["response"]
    assert assisted["drafter"] == "mtp_drafter" and assisted["draft_count"] > 0, assisted


def test_when_memory_is_short_the_draft_model_goes_first(tmp_path: Path) -> None:
    """With memory for the target but not for its store draft beside it, the model loads
    without the draft and the reply says so (instead of a refusal)."""
    target, draft = write_tiny_llama_pair(tmp_path)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "version: 1\nmodels:\n  tiny-target:latest:\n    description: a test target\n"
        "    sources:\n      - file: /nonexistent.gguf\n        pinned: false\n"
        "    drafts: [tiny-draft]\n"
    )
    models = tmp_path / "models"
    env = {"MODELHUB_CATALOG": str(catalog), "MODELHUB_NUM_PARALLEL": "1"}
    d = start_daemon(models, tmp_path / "daemon.log", env)
    try:
        create(d, tmp_path, "tiny-target", f"FROM {target}\n")
        create(d, tmp_path, "tiny-draft", f"FROM {draft}\n")
    finally:
        d.stop()
    views = ModelViews(Store(models))
    drafting = DraftSettings(views=views, catalog_drafts=lambda _view: ["tiny-draft"])
    plan_ = plan(views.get(parse_name("tiny-target")), None, drafting=drafting)
    assert plan_.spec.lean is not None
    full = plan_.spec.memory.with_sequences(1, "auto").total
    lean = plan_.spec.lean.memory.with_sequences(1, "auto").total
    limit = (full + lean) // 2
    d = start_daemon(models, tmp_path / "d2.log", {**env, "MODELHUB_MEMORY_LIMIT": str(limit)})
    try:
        with d.client() as c:
            answer = generate(c, "tiny-target", {"temperature": 0, "num_predict": 8}, "the cat")
            ps = c.get("/api/ps").json()["models"]
    finally:
        d.stop()
    d = start_daemon(models, tmp_path / "d3.log", env)  # memory enough: the draft is loaded
    try:
        with d.client() as c:
            drafted = generate(c, "tiny-target", {"temperature": 0, "num_predict": 8}, "the cat")
            entry = c.get("/api/ps").json()["models"][0]
    finally:
        d.stop()
    assert "draft_note" not in drafted and drafted["response"] == answer["response"]
    kv = entry["kv_cache_type"]  # the type in use: F16 (the tiny model's heads are not 32 wide)
    assert kv == "f16"
    in_use = plan_.spec.memory.with_sequences(1, kv).total
    assert entry["draft"]["size"] == in_use - plan_.spec.lean.memory.with_sequences(1, kv).total
    assert "'tiny-draft:latest' was not loaded" in answer["draft_note"], answer
    assert "not loaded" in ps[0]["draft_note"] and ps[0]["draft"]["drafters"] == ["ngram"]
