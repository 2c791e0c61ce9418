"""The fields Ollama's API gained in 2025-2026, through the real daemon with the official
``ollama`` client where it has them: ``think`` levels up to ``"max"`` (and the /v1 efforts
clamped onto them), ``/api/show``'s ``capabilities``, ``modified_at``, ``renderer``, ``parser``
and ``requires`` (REQUIRES checked against this version), ``/api/ps``'s ``context_length``,
``/api/embed``'s ``dimensions``, ``/api/create``'s ``draft_files`` and ``draft_quantize``."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from devtools.daemons import Daemon
from devtools.realmodels import smollm2_q4_1, smollm2_q8_0
from modelhub import __version__

pytestmark = pytest.mark.slow

LEVEL_TEMPLATE = """{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ if .Think }}Reasoning: {{ .ThinkLevel }}
<think>{{ end }}"""


def _create(d: Daemon, tmp: Path, name: str, text: str) -> Any:
    mf = tmp / f"{name}.Modelfile"
    mf.write_text(text)
    return d.cli("create", name, "-f", str(mf))


def _rendered(c: httpx.Client, path: str, body: dict[str, Any]) -> str:
    r = c.post(path, json={**body, "_debug_render_only": True, "stream": False})
    assert r.status_code == 200, r.text
    doc = r.json()
    info = doc.get("debug_info") or doc.get("_debug_info")
    return str(info["rendered_template"])


def test_think_levels(daemon: Daemon, tmp_path: Path) -> None:
    head = f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 512\n"
    made = _create(daemon, tmp_path, "lv-think", f'{head}TEMPLATE """{LEVEL_TEMPLATE}"""\n')
    assert made.returncode == 0, made.stderr
    assert _create(daemon, tmp_path, "lv-plain", head).returncode == 0
    hi = [{"role": "user", "content": "Hi"}]
    client = ollama.Client(host=daemon.url)
    reply = client.chat(model="lv-think", messages=hi, think="max", options={"num_predict": 4})
    assert reply.done
    with pytest.raises(ollama.ResponseError, match="does not support thinking") as refused:
        client.chat(model="lv-plain", messages=hi, think="max")
    assert refused.value.status_code == 400
    with daemon.client() as c:
        for path, field, value, level in (
            ("/api/chat", "think", "max", "max"),  # a Go template sees the level as sent
            ("/api/chat", "think", True, "medium"),  # true is "medium", as Ollama
            ("/v1/chat/completions", "reasoning_effort", "xhigh", "max"),  # as Ollama's /v1
            ("/v1/chat/completions", "reasoning_effort", "minimal", "low"),
        ):
            text = _rendered(c, path, {"model": "lv-think", "messages": hi, field: value})
            assert f"Reasoning: {level}\n<think>" in text, (field, value, text)
        r = c.post("/api/chat", json={"model": "lv-think", "messages": hi, "think": "ultra"})
        assert r.status_code == 400
        assert r.json()["error"] == (
            'invalid think value: "ultra" (must be "high", "medium", "low", "max", true, or false)'
        )


def test_show_ps_and_embed_fields(daemon: Daemon, tmp_path: Path) -> None:
    text = (
        f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 384\n"
        f"RENDERER qwen3-coder\nPARSER qwen3-coder\nREQUIRES v{__version__}\n"
    )
    r = _create(daemon, tmp_path, "fields-smol", text)
    assert r.returncode == 0, r.stderr
    client = ollama.Client(host=daemon.url)
    show = client.show("fields-smol")
    assert show.capabilities == ["completion"]  # SmolLM2's template: no tools, no .Suffix
    assert isinstance(show.modified_at, datetime)
    assert "RENDERER qwen3-coder\nPARSER qwen3-coder\n" in (show.modelfile or "")
    raw = httpx.post(daemon.url + "/api/show", json={"model": "fields-smol"}).json()
    assert (raw["renderer"], raw["parser"], raw["requires"]) == (
        "qwen3-coder",
        "qwen3-coder",
        __version__,
    )

    newer = _create(daemon, tmp_path, "fields-newer", "FROM fields-smol\nREQUIRES 99.1\n")
    assert newer.returncode != 0
    assert (
        f"requires version 99.1 or later (REQUIRES 99.1), and this is modelhub {__version__}"
        in (newer.stderr)
    )

    embedded = client.embed(model="fields-smol", input=["a red fox", "a blue whale"], dimensions=8)
    assert [len(v) for v in embedded.embeddings] == [8, 8]
    assert all(math.isclose(math.hypot(*v), 1.0, rel_tol=1e-5) for v in embedded.embeddings)
    whole = client.embed(model="fields-smol", input="a red fox")
    assert len(whole.embeddings[0]) == 576
    (loaded,) = [m for m in client.ps().models if m.model == "fields-smol:latest"]
    assert loaded.context_length == 384


def test_create_with_draft_files_and_draft_quantize(daemon: Daemon, tmp_path: Path) -> None:
    assert _create(daemon, tmp_path, "fields-q8", f"FROM {smollm2_q8_0()}\n").returncode == 0
    digest = ollama.Client(host=daemon.url).create_blob(smollm2_q4_1())
    body: dict[str, Any] = {"model": "fields-drafted", "from": "fields-q8", "stream": False}
    with daemon.client() as c:
        r = c.post("/api/create", json={**body, "draft_files": {"draft.gguf": digest}})
        assert r.status_code == 200 and r.json()["status"] == "success", r.text
        show = c.post("/api/show", json={"model": "fields-drafted"}).json()
        assert show["details"]["draft"]["kind"] == "draft_model"
        assert "\nDRAFT " in show["modelfile"]
        quantized = {**body, "draft_files": {"draft.gguf": digest}, "draft_quantize": "q8_0"}
        r = c.post("/api/create", json=quantized)
        assert "draft quantization requires an unquantized draft model, got Q4_1" in r.text
        r = c.post("/api/create", json={**body, "draft_quantize": "q8_0"})
        assert r.status_code == 400 and "requires a DRAFT model" in r.json()["error"]
