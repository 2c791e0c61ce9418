"""SEC-22 through the real daemon: RPC workers come only from the daemon's settings or a
Modelfile the local user created, never from a request body or a pulled model (issue 26, item
18). A loopback listener records every connection made to the port a request or a pulled
manifest names; it must record none, while a locally created model naming it is dialled."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.pullservers import MEDIA_MODEL, RegistryServer
from modelhub.library.pulled import installer
from modelhub.pull import ProgressEvent, pull_model
from modelhub.pull.catalog import parse_catalog
from modelhub.store import MEDIA_PARAMS, Store, parse_name
from tests.fixtures.synthetic import write_tiny_llama

pytestmark = pytest.mark.timeout(300)


class RecordingListener:
    """A TCP listener on a free loopback port that records each connection it accepts (and
    closes it at once)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(peer)
            conn.close()

    def __enter__(self) -> RecordingListener:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("rpc-ssrf") / "tiny.gguf")


@pytest.fixture(scope="module")
def served(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("rpc-ssrf-daemon")
    d = start_daemon(base / "models", base / "daemon.log", {"MODELHUB_NUM_PARALLEL": "1"})
    mf = base / "Modelfile"
    mf.write_text(f"FROM {tiny}\nPARAMETER num_ctx 256\n")
    d.create("tiny", mf)
    yield d
    d.stop()


def _requests(endpoint: str) -> list[tuple[str, dict[str, Any]]]:
    """Every inference request shape, each naming ``endpoint`` as an RPC worker."""
    rpc = {"rpc_servers": endpoint}
    listed = {"rpc_servers": [endpoint]}
    msgs = [{"role": "user", "content": "hi"}]
    return [
        ("/api/generate", {"model": "tiny", "prompt": "hi", "stream": False, "options": rpc}),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "stream": True, "options": listed}),
        ("/api/generate", {"model": "tiny", "options": rpc}),  # load only
        ("/api/chat", {"model": "tiny", "messages": msgs, "stream": False, "options": rpc}),
        ("/api/chat", {"model": "tiny", "messages": [], "options": listed}),  # load only
        ("/api/embed", {"model": "tiny", "input": "hi", "options": rpc}),
        ("/api/embeddings", {"model": "tiny", "prompt": "hi", "options": rpc}),
        ("/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 2, **rpc}),
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": msgs, "max_tokens": 2, "options": rpc},
        ),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2, "options": rpc}),
        ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 2, "options": rpc}),
        ("/v1/embeddings", {"model": "tiny", "input": "hi", **rpc, "options": rpc}),
    ]


def test_a_request_cannot_make_the_daemon_connect_anywhere(served: Daemon) -> None:
    """Ollama's APIs refuse ``options.rpc_servers`` with a 400 naming it; the OpenAI APIs have
    no such option (their ``rpc_servers`` or ``options`` fields are not read). No request
    makes the daemon or a runner connect to the port it names."""
    with RecordingListener() as listener, served.client() as c:
        for path, body in _requests(listener.endpoint):
            r = c.post(path, json=body)
            if path.startswith("/api/"):
                assert r.status_code == 400, (path, body, r.text)
                error = r.json()["error"]
                assert "rpc_servers cannot be set by a request" in error, error
                assert "MODELHUB_RPC_SERVERS" in error, error
            else:
                assert r.status_code in (200, 400), (path, r.text)
        # The OpenAI requests above loaded the model: any dial has happened by now.
        assert c.get("/api/ps").json()["models"], "the model never loaded"
    assert listener.accepted == []


def test_a_pulled_model_cannot_make_the_runner_connect_anywhere(served: Daemon, tiny: Path) -> None:
    """A registry model whose params layer names an RPC worker is stored without it (a warning
    says so in the pull's stream), keeps its other parameters, and is served locally."""
    with RecordingListener() as listener, RegistryServer() as registry:
        params = {
            "rpc_servers": [listener.endpoint],
            "RPC_Servers": listener.endpoint,
            "temperature": 0.25,
            "num_ctx": 256,
        }
        registry.add_model(
            "library/hostile",
            "latest",
            [(MEDIA_MODEL, tiny.read_bytes()), (MEDIA_PARAMS, json.dumps(params).encode())],
        )
        name = f"{registry.host}/library/hostile:latest"
        lines = _pull(served.url, {"model": name, "insecure": True})
        assert lines[-1] == {"status": "success"}
        with served.client() as c:
            body = {"model": name, "prompt": "hi", "stream": False}
            r = c.post("/api/generate", json={**body, "options": {"num_predict": 2}})
            assert listener.accepted == []
            assert r.status_code == 200, r.text
            shown = c.post("/api/show", json={"model": name}).json()
            c.post("/api/generate", json={"model": name, "keep_alive": 0})
        assert "rpc_servers" not in shown["parameters"].lower(), shown["parameters"]
        assert "temperature" in shown["parameters"], shown["parameters"]
        warnings = [str(x["warning"]) for x in lines if "warning" in x]
        assert len(warnings) == 2, lines
        assert all({"status": f"warning: {w}", "warning": w} in lines for w in warnings)
        assert all("is not kept" in w and "MODELHUB_RPC_SERVERS" in w for w in warnings)


def test_a_catalog_entry_cannot_name_rpc_workers(tiny: Path, tmp_path: Path) -> None:
    """A catalog entry's parameters go through the same rule (the pull, in this process)."""
    store = Store(tmp_path / "models")
    catalog = parse_catalog(
        "models:\n"
        "  cat-tiny:\n"
        f"    sources: [{{file: {json.dumps(tiny.as_uri())}, pinned: false}}]\n"
        "    parameters: {rpc_servers: '127.0.0.1:9', top_k: 7}\n"
    )
    events: list[ProgressEvent] = []
    name = pull_model(
        store, "cat-tiny", progress=events.append, install=installer(store), catalog=catalog
    )
    stored = store.get(name)
    (params_layer,) = stored.manifest.layers_of(MEDIA_PARAMS)
    assert json.loads(store.read_blob_bytes(params_layer.digest)) == {"top_k": 7}
    assert any("rpc_servers is not kept" in (x.warning or "") for x in events), events
    assert stored.name == parse_name("cat-tiny")


def test_a_modelfile_the_user_created_may_name_an_rpc_worker(
    served: Daemon, tmp_path: Path, tiny: Path
) -> None:
    """The control: the listener does see the runner dial a worker that a locally created
    Modelfile names (the request then fails, as the listener is no RPC worker)."""
    with RecordingListener() as listener:
        mf = tmp_path / "Modelfile"
        mf.write_text(
            f"FROM {tiny}\nPARAMETER num_ctx 256\nPARAMETER rpc_servers {listener.endpoint}\n"
        )
        served.create("tiny-rpc", mf)
        with served.client() as c:
            body = {"model": "tiny-rpc", "prompt": "hi", "stream": False}
            r = c.post("/api/generate", json={**body, "options": {"num_predict": 2}})
        assert r.status_code >= 500, r.text
    assert listener.accepted, "the runner never dialled the worker its Modelfile names"


def _pull(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", url + "/api/pull", json=body) as r,
    ):
        assert r.status_code == 200
        return [json.loads(line) for line in r.iter_lines() if line.strip()]
