"""Models split across ggml RPC workers: two real workers (`modelhub rpc-worker`) on loopback
ports, a real daemon with MODELHUB_RPC_SERVERS, SmolLM2 with its layers on the workers.

Needs llama-cpp-python built with ``-DGGML_RPC=on`` (CI builds it: .ci/run); skipped with
that reason otherwise.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.daemons import Daemon, free_port, start_daemon
from devtools.realmodels import smollm2_q4_1


def _rpc_built() -> bool:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from modelhub.engine.devices import rpc_supported as r; print(r())",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() == "True"


pytestmark = pytest.mark.slow
needs_rpc = pytest.mark.skipif(
    not _rpc_built(),
    reason="llama-cpp-python was built without ggml's RPC backend (CMAKE_ARGS=-DGGML_RPC=on)",
)

REPEAT = (
    "Repeat this list exactly: apples, pears, plums, apples, pears, plums, apples, pears, "
    "plums, apples, pears, plums."
)
GREEDY = {"temperature": 0, "num_predict": 40}


class Worker:
    def __init__(self, log: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "modelhub", "rpc-worker", "--host", self.endpoint],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"worker on {self.endpoint} did not start:\n{log.read_text()}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    base = tmp_path_factory.mktemp("rpc")
    started = [Worker(base / f"worker{i}.log") for i in range(2)]
    yield started
    for w in started:
        w.kill()


@pytest.fixture(scope="module")
def daemon(workers: list[Worker], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("rpc-daemon")
    servers = ",".join(w.endpoint for w in workers)
    env = {"MODELHUB_RPC_SERVERS": servers, "MODELHUB_NUM_PARALLEL": "1"}
    d = start_daemon(base / "models", base / "daemon.log", env)
    mf = base / "Modelfile"
    weights = smollm2_q4_1()
    for name, extra in (
        ("split", ""),
        ("local", "PARAMETER num_gpu 0\n"),
        ("split-ngram", "DRAFT ngram\n"),
        ("split-partial", "PARAMETER num_gpu 20\n"),
    ):
        mf.write_text(f"FROM {weights}\nPARAMETER num_ctx 512\n{extra}")
        d.create(name, mf)
    yield d
    d.stop()


def _generate(c: httpx.Client, model: str, prompt: str, **options: object) -> dict:
    body = {"model": model, "prompt": prompt, "stream": False, "options": {**GREEDY, **options}}
    r = c.post("/api/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


@needs_rpc
def test_split_model_matches_the_local_run(daemon: Daemon, workers: list[Worker]) -> None:
    with daemon.client() as c:
        local = _generate(c, "local", "Why is the sky blue?")
        split = _generate(c, "split", "Why is the sky blue?")
        ps = c.get("/api/ps").json()["models"]
    assert split["response"] == local["response"] and split["eval_count"] > 10
    entry = next(m for m in ps if m["name"] == "split:latest")
    names = entry["devices"]
    assert names == [f"RPC{i}[{w.endpoint}]" for i, w in enumerate(workers)], names
    assert entry["layers_offloaded"] > 0, entry
    with daemon.client() as c:
        runtime = c.post("/api/show", json={"model": "split"}).json()["runtime"]
    assert runtime["devices"] == names and runtime["draft_devices"] == [], runtime
    assert 0 < entry["size_vram"] <= entry["size"], entry
    out = daemon.cli("ps")
    assert out.returncode == 0 and "GPU" in out.stdout, out.stdout
    shown = daemon.cli("show", "split").stdout
    assert "Loaded" in shown and names[0] in shown and "layers offloaded" in shown, shown
    with daemon.client() as c:  # 20 layers on the workers, the other 10 here
        partial = _generate(c, "split-partial", "Why is the sky blue?")
        entry = next(
            m for m in c.get("/api/ps").json()["models"] if m["name"] == "split-partial:latest"
        )
    assert partial["response"] == local["response"]
    assert entry["layers_offloaded"] == 20 and 0 < entry["size_vram"] < entry["size"], entry
    info = daemon.cli("info")
    assert info.returncode == 0, info.stderr
    assert "RPC:" in info.stdout and "compiled in" in info.stdout, info.stdout
    assert ", ".join(w.endpoint for w in workers) in info.stdout, info.stdout


@needs_rpc
def test_drafting_works_on_a_split_model(daemon: Daemon) -> None:
    with daemon.client() as c:
        local = _generate(c, "local", REPEAT, num_predict=48)
        first = _generate(c, "split-ngram", REPEAT, num_predict=48)
        again = _generate(c, "split-ngram", REPEAT, num_predict=48)
    assert first["response"] == again["response"] == local["response"]
    assert again.get("draft_count", 0) >= again.get("draft_accepted_count", 0) > 0, again


@needs_rpc
def test_a_worker_that_dies_fails_its_request_and_the_daemon_keeps_serving(
    daemon: Daemon, workers: list[Worker], tmp_path: Path
) -> None:
    victim = workers[1]
    with daemon.client() as c:
        _generate(c, "split", "Count from one to ten.", num_predict=4)  # loaded, workers used
        body = {
            "model": "split",
            "prompt": "Write a long story about the sea.",
            "stream": True,
            "options": {"temperature": 0, "num_predict": 2000},
        }
        events = []
        with c.stream("POST", "/api/generate", json=body, timeout=300) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.strip():
                    continue
                events.append(httpx.Response(200, content=line).json())
                if len(events) == 3:
                    victim.kill()
        final = events[-1]
        assert "error" in final, final
        assert "RPC" in final["error"] and "worker" in final["error"], final
        # The daemon serves on: a local model at once, the split one when its worker is back.
        assert _generate(c, "local", "Say hi.", num_predict=8)["response"]
        workers[1] = Worker(tmp_path / "worker-restarted.log", victim.port)
        assert _generate(c, "split", "Say hi.", num_predict=8)["response"]


@needs_rpc
def test_an_unreachable_worker_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    env = {"MODELHUB_RPC_SERVERS": f"127.0.0.1:{port}"}
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", env)
    try:
        mf = tmp_path / "Modelfile"
        mf.write_text(f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 256\n")
        d.create("split", mf)
        with d.client() as c:
            r = c.post(
                "/api/generate",
                json={"model": "split", "prompt": "hi", "stream": False},
                timeout=120,
            )
        assert r.status_code >= 400
        error = r.json()["error"]
        assert f"RPC worker 127.0.0.1:{port} is not reachable" in error, error
        assert "modelhub rpc-worker" in error, error
    finally:
        d.stop()


def test_the_worker_refuses_a_public_address_without_the_flag() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "modelhub", "rpc-worker", "--host", "0.0.0.0:50999"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1
    assert "no authentication" in r.stderr and "--allow-remote" in r.stderr, r.stderr


@needs_rpc
def test_memory_planning_counts_only_what_stays_on_this_machine(tmp_path: Path) -> None:
    """With MODELHUB_MEMORY_LIMIT below SmolLM2's 98 MB of weights, the model is refused on
    the CPU before loading, and served when its layers go to a worker."""
    worker = Worker(tmp_path / "worker.log")
    env = {"MODELHUB_RPC_SERVERS": worker.endpoint, "MODELHUB_MEMORY_LIMIT": "64MiB"}
    env["MODELHUB_NUM_PARALLEL"] = "1"
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", env)
    try:
        mf = tmp_path / "Modelfile"
        for name, extra in (("split", ""), ("local", "PARAMETER num_gpu 0\n")):
            mf.write_text(f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 256\n{extra}")
            d.create(name, mf)
        with d.client() as c:
            body = {"prompt": "Say hi.", "stream": False, "options": {"num_predict": 4}}
            refused = c.post("/api/generate", json={**body, "model": "local"}, timeout=120)
            assert refused.status_code == 500, refused.text
            assert "requires more system memory" in refused.json()["error"]
            served = c.post("/api/generate", json={**body, "model": "split"}, timeout=120)
            assert served.status_code == 200, served.text
            (entry,) = c.get("/api/ps").json()["models"]
        assert entry["size_vram"] > 64 << 20, entry  # the weights went to the worker
    finally:
        d.stop()
        worker.kill()
