"""The public client over the daemon's app in-process (the ``Client(http=...)`` seam): the same
typed errors and model management as over a socket, without starting a daemon process."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from modelhub.client import Client
from modelhub.config import Settings
from modelhub.errors import InputError, NotFoundError
from modelhub.server.app import build_asgi
from modelhub.store import sha256_file
from tests.fixtures.synthetic import write_tiny_llama


def test_client_over_the_app_in_process(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"MODELHUB_HOST": "127.0.0.1:11435", "MODELHUB_MODELS": str(tmp_path / "models")}
    )
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    digest, _ = sha256_file(model)
    with (
        TestClient(build_asgi(settings), base_url=settings.base_url) as http,
        Client(http=http) as client,
    ):
        assert client.base_url == settings.base_url
        assert client.list() == []
        with pytest.raises(NotFoundError, match=r"^model 'nothere' not found$"):
            client.show("nothere")
        with pytest.raises(InputError, match=r"^model is required$"):
            client.show("")
        assert not client.blob_exists(digest)
        client.push_blob(digest, model)
        assert client.blob_exists(digest)
        statuses = [
            p["status"] for p in client.create({"model": "tiny", "files": {"t.gguf": digest}})
        ]
        assert statuses[-1] == "success"
        assert [m["name"] for m in client.list()] == ["tiny:latest"]
        assert client.show("tiny")["details"]["format"] == "gguf"
        client.delete("tiny")
        with pytest.raises(NotFoundError, match=r"^model 'tiny' not found$"):
            client.delete("tiny")
