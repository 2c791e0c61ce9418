"""One error path: the same mistake gets the same status and message on every endpoint of both
API families (Ollama's body on /api, OpenAI's on /v1), and the CLI's exit codes say what
kind of failure it was. The routes' answers in-process (the app over fake runners: no runner
is reached); the CLI's exit codes through a real daemon on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import openai
import pytest

from devtools.daemons import ROOT, Daemon, free_port
from devtools.pullservers import serve_handler
from modelhub.errors import (
    ErrorKind,
    InputError,
    InsufficientMemoryError,
    ModelhubError,
    NotFoundError,
    ServerBusyError,
    error_for_status,
)
from tests.fakes.daemon import BASE_URL, FakeDaemon, fake_daemon


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    """The daemon's app in-process with an empty store (no model: every request below is
    answered before a runner would be)."""
    with fake_daemon(tmp_path_factory.mktemp("errors")) as d:
        yield d


OLLAMA_MODEL_ROUTES = [
    ("POST", "/api/generate"),
    ("POST", "/api/chat"),
    ("POST", "/api/embed"),
    ("POST", "/api/embeddings"),
    ("POST", "/api/show"),
    ("DELETE", "/api/delete"),
    ("POST", "/api/create"),
    ("POST", "/api/pull"),
]
OPENAI_MODEL_ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
]
# Routes that look a stored model up (create and pull make one; delete has its own verb).
LOOKUP_ROUTES = [r for r in OLLAMA_MODEL_ROUTES if r[1] not in ("/api/create", "/api/pull")]

# A body that is valid for each route except for the model named in it.
BODIES = {
    "/api/generate": {"prompt": "hi", "stream": False},
    "/api/chat": {"messages": [{"role": "user", "content": "hi"}], "stream": False},
    "/api/embed": {"input": "hi"},
    "/api/embeddings": {"prompt": "hi"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/embeddings": {"input": "hi"},
}


def message(route: str, response: httpx.Response) -> str:
    body = response.json()
    if route.startswith("/v1/"):
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}, body
        kind = "invalid_request_error" if response.status_code < 500 else "api_error"
        assert error["type"] == kind, body
        return str(error["message"])
    assert set(body) == {"error"}, body
    return str(body["error"])


def send(c: httpx.Client, method: str, path: str, **kw: object) -> httpx.Response:
    return c.request(method, path, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("method", "path"), OLLAMA_MODEL_ROUTES + OPENAI_MODEL_ROUTES)
def test_malformed_json_is_the_same_400_everywhere(app: FakeDaemon, method: str, path: str) -> None:
    c = app.http
    r = send(c, method, path, content=b'{"model": "x",', headers={"content-type": "json"})
    empty = send(c, method, path, content=b"")
    listed = send(c, method, path, json=["not", "an", "object"])
    assert r.status_code == 400
    assert message(path, r).startswith("invalid JSON in request body: ")
    assert (empty.status_code, message(path, empty)) == (400, "missing request body")
    assert (listed.status_code, message(path, listed)) == (
        400,
        "request body must be a JSON object",
    )


@pytest.mark.parametrize(("method", "path"), OLLAMA_MODEL_ROUTES + OPENAI_MODEL_ROUTES)
def test_a_missing_or_padded_model_is_the_same_400_everywhere(
    app: FakeDaemon, method: str, path: str
) -> None:
    body = BODIES.get(path, {})
    c = app.http
    missing = send(c, method, path, json=body)
    empty = send(c, method, path, json={**body, "model": ""})
    padded = send(c, method, path, json={**body, "model": " smol"})
    wrong_type = send(c, method, path, json={**body, "model": 7})
    for r in (missing, empty):
        assert (r.status_code, message(path, r)) == (400, "model is required")
    assert padded.status_code == 400
    assert message(path, padded) == "invalid model name ' smol': remove the spaces around it"
    assert wrong_type.status_code == 400
    assert message(path, wrong_type) == 'field "model" must be of type string, got integer'


@pytest.mark.parametrize(("method", "path"), LOOKUP_ROUTES + OPENAI_MODEL_ROUTES)
def test_an_unknown_model_is_the_same_404_everywhere(
    app: FakeDaemon, method: str, path: str
) -> None:
    c = app.http
    r = send(c, method, path, json={**BODIES.get(path, {}), "model": "nothere"})
    bad = send(c, method, path, json={**BODIES.get(path, {}), "model": "a/b/c/d/e"})
    assert (r.status_code, message(path, r)) == (404, "model 'nothere' not found")
    if path.startswith("/v1/"):
        assert r.json()["error"]["code"] == "model_not_found"
    assert bad.status_code == 400 and message(path, bad).startswith("invalid model name: ")


def test_openai_client_and_model_route_agree(app: FakeDaemon) -> None:
    client = openai.OpenAI(
        base_url=BASE_URL + "/v1", api_key="unused", max_retries=0, http_client=app.http
    )
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("nothere")
    assert caught.value.status_code == 404
    assert caught.value.body["message"] == "model 'nothere' not found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="", messages=[{"role": "user", "content": "x"}])
    assert bad.value.body["message"] == "model is required"  # type: ignore[index]


def test_kinds_round_trip_through_statuses() -> None:
    """What the server answers for a kind, the client turns back into that kind's class."""
    for kind in ErrorKind:
        error = error_for_status(kind.status, "m")
        if kind in (ErrorKind.INTERNAL, ErrorKind.RESOURCES):
            assert type(error) is ModelhubError and error.status == 500
        elif kind == ErrorKind.UNREACHABLE:
            assert isinstance(error, ServerBusyError)  # 503 from a daemon means busy
        else:
            assert error.kind is kind and error.message == "m"
    assert isinstance(error_for_status(404, "x"), NotFoundError)
    assert isinstance(error_for_status(400, "x"), InputError)
    assert InsufficientMemoryError("x").status == 500  # as Ollama answers it
    assert type(error_for_status(418, "teapot")) is ModelhubError


# ---- the CLI's exit codes --------------------------------------------------------------------


def cli(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "modelhub", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )


def default_sigint() -> None:
    """Ctrl-C as a terminal delivers it, even when the suite itself was started in the
    background (a shell's ``&`` makes its children ignore SIGINT, and Python keeps that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELHUB_")}
    env.update(
        {
            "MODELHUB_HOST": f"127.0.0.1:{port}",
            "MODELHUB_NO_AUTOSTART": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


def test_exit_codes_for_errors_and_an_unreachable_daemon(daemon: Daemon) -> None:
    unreachable = cli(cli_env(free_port()), "list")
    _, err = unreachable.communicate(timeout=60)
    assert unreachable.returncode == 69, err
    assert err.startswith("Error: could not connect to modelhub at http://127.0.0.1:")
    missing = daemon.cli("show", "nothere")
    assert missing.returncode == 1
    assert missing.stderr == "Error: model 'nothere' not found\n"
    usage = daemon.cli("show")
    assert usage.returncode == 2 and "Missing argument" in usage.stderr


class _SlowStream(BaseHTTPRequestHandler):
    """A daemon that starts an answer and then takes its time (to interrupt the CLI)."""

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    streaming = threading.Event()

    def do_POST(self) -> None:
        if self.path == "/api/show":
            body = b'{"modelfile": "", "parameters": "", "template": "", "details": {}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        self.wfile.write(b'{"response": "started ", "status": "pulling", "done": false}\n')
        self.wfile.flush()
        type(self).streaming.set()
        time.sleep(30)

    def log_message(self, *_: object) -> None:
        pass


def test_an_interrupted_pull_exits_130() -> None:
    """(`run` is covered by test_cli_run_units: any command Ctrl-C stops exits the same way.)"""
    _SlowStream.streaming.clear()
    with serve_handler(_SlowStream) as address:
        proc = cli(cli_env(int(address.rsplit(":", 1)[1])), "pull", "m")
        assert _SlowStream.streaming.wait(30), "the command never reached the daemon"
        time.sleep(0.5)  # it is now reading the stream
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
