"""Pull through the real daemon: /api/pull's stream, the CLI, and a daemon killed mid-pull."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
from fixtures.synthetic import write_tiny_llama
from fixtures.synthetic_drafters import write_tiny_gemma4, write_tiny_gemma4_assistant

from devtools.daemons import start_daemon
from devtools.pullservers import MEDIA_MODEL, Fault, FileServer, HFServer, RegistryServer, sha256
from modelhub.pull import partial_downloads
from modelhub.store import Store

pytestmark = pytest.mark.timeout(180)


def stream_pull(url: str, body: dict[str, object]) -> list[dict[str, object]]:
    lines = []
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", url + "/api/pull", json=body) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.strip():
                lines.append(json.loads(line))
    return lines


def test_api_pull_streams_ollama_progress_and_the_cli_shows_success(fresh_daemon, tmp_path):
    with RegistryServer() as registry:
        weights = write_tiny_llama(tmp_path / "tiny.gguf").read_bytes()  # /api/tags reads it
        registry.add_model("library/tiny", "latest", [(MEDIA_MODEL, weights)])
        name = f"{registry.host}/library/tiny:latest"
        lines = stream_pull(fresh_daemon.url, {"model": name, "insecure": True})
        statuses = [str(line.get("status")) for line in lines]
        assert statuses[0] == "pulling manifest"
        assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
        layer = [line for line in lines if line.get("digest") == sha256(weights)]
        assert layer[-1]["completed"] == layer[-1]["total"] == len(weights)

        with httpx.Client(base_url=fresh_daemon.url, timeout=30) as client:
            tags = client.get("/api/tags").json()["models"]
            assert [m["name"] for m in tags] == [name]
            missing = client.post(
                "/api/pull",
                json={"model": f"{registry.host}/library/no", "insecure": True, "stream": False},
            )
            assert missing.json() == {"error": "pull model manifest: file does not exist"}

        registry.add_model("library/other", "v1", [(MEDIA_MODEL, os.urandom(1000))])
        result = fresh_daemon.cli("pull", "--insecure", f"{registry.host}/library/other:v1")
        assert result.returncode == 0, result.stderr
        assert "success" in result.stdout


def test_a_hugging_face_pull_brings_the_sidecar_drafter_unless_no_draft(tmp_path: Path):
    """A Gemma 4 repo with its assistant drafter and an mmproj file: the drafter is attached (show
    lists it), the mmproj file (not a projector here) is never taken for the weights or the
    drafter and is left out with a warning, and `pull --no-draft` leaves the drafter."""
    target = write_tiny_gemma4(tmp_path / "target.gguf")
    assistant = write_tiny_gemma4_assistant(tmp_path / "assistant.gguf", target)
    files = {
        "gemma-4-tiny-it-Q8_0.gguf": target.read_bytes(),
        "gemma-4-tiny-it-assistant-Q8_0.gguf": assistant.read_bytes(),
        "mmproj-gemma-4-tiny-it-F16.gguf": write_tiny_llama(tmp_path / "p.gguf").read_bytes(),
    }
    with FileServer() as cdn, HFServer(cdn) as hub:
        hub.add_repo("org/gemma-4-tiny-it-GGUF", files)
        daemon = start_daemon(
            tmp_path / "models", tmp_path / "daemon.log", {"HF_ENDPOINT": hub.url}
        )
        try:
            lines = stream_pull(daemon.url, {"model": "hf.co/org/gemma-4-tiny-it-GGUF:Q8_0"})
            assert lines[-1] == {"status": "success"}
            with daemon.client() as client:
                shown = client.post(
                    "/api/show", json={"model": "hf.co/org/gemma-4-tiny-it-GGUF:Q8_0"}
                ).json()
            assert shown["draft"]["from"] == "gemma-4-tiny-it-assistant-Q8_0.gguf"
            assert shown["draft"]["digest"] == sha256(files["gemma-4-tiny-it-assistant-Q8_0.gguf"])
            assert shown["draft"]["kind"] == "mtp_drafter"
            show = daemon.cli("show", "hf.co/org/gemma-4-tiny-it-GGUF:Q8_0")
            assert show.returncode == 0 and "mtp_drafter" in show.stdout, show.stdout
            assert "vision" not in shown["capabilities"] and "projector_info" not in shown
            assert any(
                str(line.get("warning", "")).startswith(
                    "the projector mmproj-gemma-4-tiny-it-F16.gguf that came with the "
                    "model is not used"
                )
                and line["status"] == f"warning: {line['warning']}"
                for line in lines
            )

            result = daemon.cli("pull", "--no-draft", "hf.co/org/gemma-4-tiny-it-GGUF")
            assert result.returncode == 0, result.stderr
            assert "not pulling the drafter gemma-4-tiny-it-assistant-Q8_0.gguf" in result.stdout
            with daemon.client() as client:
                plain = client.post(
                    "/api/show", json={"model": "hf.co/org/gemma-4-tiny-it-GGUF"}
                ).json()
            assert "draft" not in plain and "draft" not in plain["details"]
        finally:
            daemon.stop()


def test_a_daemon_killed_mid_pull_resumes_after_restart(tmp_path: Path):
    """STO-15 and resume: a killed daemon lists nothing half-pulled; the next pull resumes."""
    size = 4 << 20
    with RegistryServer() as registry:
        weights = os.urandom(size)
        registry.add_model("library/big", "latest", [(MEDIA_MODEL, weights)])
        digest = sha256(weights)
        registry.faults[digest] = Fault(rate=1_500_000)
        name = f"{registry.host}/library/big:latest"
        models = tmp_path / "models"
        daemon = start_daemon(models, tmp_path / "first.log")
        try:
            client_errors: list[BaseException] = []

            def pull_until_killed() -> None:
                try:
                    stream_pull(daemon.url, {"model": name, "insecure": True})
                except BaseException as exc:  # the daemon dies under it
                    client_errors.append(exc)

            thread = threading.Thread(target=pull_until_killed)
            thread.start()
            deadline = time.monotonic() + 30
            while registry.bytes_sent(digest[7:]) < size // 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            daemon.proc.kill()
            daemon.proc.wait(10)
            thread.join(30)
        finally:
            daemon.stop()
        time.sleep(0.3)
        sent_before = registry.bytes_sent(digest[7:])
        assert sent_before < size
        (partial,) = partial_downloads(Store(models))
        assert partial.digest == digest and 0 < partial.completed < size and not partial.live
        registry.faults.clear()

        restarted = start_daemon(models, tmp_path / "second.log")
        try:
            with httpx.Client(base_url=restarted.url, timeout=30) as client:
                assert client.get("/api/tags").json()["models"] == []  # nothing half-pulled
            lines = stream_pull(restarted.url, {"model": name, "insecure": True})
            assert lines[-1] == {"status": "success"}
        finally:
            restarted.stop()
        resumed = [h.headers.get("range", "") for h in registry.hits(digest[7:])][-1]
        assert resumed.startswith("bytes=") and not resumed.startswith("bytes=0-")
        assert registry.bytes_sent(digest[7:]) - sent_before < size
        assert Store(models).blob_path(digest).read_bytes() == weights
