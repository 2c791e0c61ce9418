"""The daemon's app in-process over fake runners: routes, scheduler, errors and the client
exactly as served, with no socket, no runner process and no llama.cpp.

``FakeDaemon`` holds a Starlette ``TestClient`` over ``build_asgi`` (the Host/Origin guard
included), the public ``Client`` over it (``Client(http=...)``) and the :class:`FakeRunners`
the scheduler makes its runners with. Models are created through the API from the synthetic
tiny GGUF (real metadata and vocabulary, a few KB): the daemon plans them as it would any
model; only the runner is fake. ``cli()`` runs our CLI in-process against it (as
``devtools.daemons.Daemon.cli`` runs it in a subprocess against a real daemon), and
``http_client()`` gives third-party clients an ``httpx.Client`` of their own over the app.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import starlette.testclient
from click.testing import CliRunner
from starlette.testclient import TestClient

from devtools.daemons import create_model
from modelhub.cli import models as cli_models
from modelhub.cli.main import cli as modelhub_cli
from modelhub.client import Client
from modelhub.config import Settings
from modelhub.server.app import build_asgi
from modelhub.server.state import ServerState
from modelhub.store import sha256_file
from tests.fakes.runner import FakeRunners, Script
from tests.fixtures.synthetic import write_tiny_llama

BASE_URL = "http://127.0.0.1:11435"


@dataclass
class FakeDaemon:
    http: TestClient
    client: Client
    runners: FakeRunners
    state: ServerState
    tmp: Path

    @property
    def script(self) -> Script:
        return self.runners.script

    def add_model(self, name: str = "tiny", **create: Any) -> str:
        """Create ``name`` from the tiny synthetic GGUF (``create``: more of /api/create's
        fields, e.g. ``parameters``); its name."""
        model = self.tmp / "tiny.gguf"
        if not model.exists():
            write_tiny_llama(model)
        digest, _ = sha256_file(model)
        if not self.client.blob_exists(digest):
            self.client.push_blob(digest, model)
        body = {"model": name, "files": {"tiny.gguf": digest}, **create}
        statuses = [s.get("status") for s in self.client.create(body)]
        assert statuses[-1] == "success", statuses
        return name

    def create(self, name: str, modelfile: Path) -> None:
        """``modelhub create NAME -f MODELFILE`` as ``Daemon.create`` does, over the app."""
        create_model(self.client, name, modelfile)

    @property
    def models(self) -> Path:
        """The store's directory (``MODELHUB_MODELS``)."""
        return self.state.store.root

    def http_client(self, **kw: Any) -> Any:
        """A client of its own over the app, of the HTTP library ``TestClient`` is built on
        (httpx, or httpx2 where installed); closing it leaves ``http`` open."""
        kw.setdefault("base_url", BASE_URL)
        return starlette.testclient.httpx.Client(transport=self.http._transport, **kw)

    def httpx_transport(self) -> httpx.BaseTransport:
        """An ``httpx`` transport over the app, for clients built on httpx where ``TestClient``
        is built on httpx2 (the ollama client: ``ollama.Client(transport=...)``)."""
        return _HttpxOverApp(self.http._transport)

    def cli(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """``modelhub ARGS`` in-process against this app: the CLI's own code, output and exit
        status, its client over ``http_client()`` instead of a socket. An exception the CLI
        did not turn into ``Error: ...`` is raised (a subprocess would print a traceback)."""

        def connect(_base_url: str) -> Client:
            return Client(http=self.http_client())

        with mock.patch.object(cli_models, "Client", connect):
            result = CliRunner().invoke(modelhub_cli, list(args), input=input)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return subprocess.CompletedProcess(
            ["modelhub", *args], result.exit_code, result.stdout, result.stderr
        )


class _HttpxOverApp(httpx.BaseTransport):
    """An httpx transport handing each request to ``TestClient``'s transport (whichever HTTP
    library that is built on); the answer is read whole."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        lib = starlette.testclient.httpx
        sent = lib.Request(
            request.method, str(request.url), headers=request.headers.raw, content=request.read()
        )
        answer = self.inner.handle_request(sent)
        return httpx.Response(answer.status_code, headers=answer.headers.raw, content=answer.read())


@contextlib.contextmanager
def fake_daemon(
    tmp: Path, script: Script | None = None, env: dict[str, str] | None = None
) -> Iterator[FakeDaemon]:
    """The app over fake runners with a store under ``tmp``; ``env``: more settings."""
    settings = Settings.from_env(
        {
            "MODELHUB_HOST": "127.0.0.1:11435",
            "MODELHUB_MODELS": str(tmp / "models"),
            "MODELHUB_NUM_GPU": "0",  # no accelerator probe (a child process)
            **(env or {}),
        }
    )
    state = ServerState.from_settings(settings)
    runners = FakeRunners(script)
    state.scheduler.runner_factory = runners
    with (
        TestClient(build_asgi(settings, state), base_url=BASE_URL) as http,
        Client(http=http) as client,
    ):
        yield FakeDaemon(http, client, runners, state, tmp)
