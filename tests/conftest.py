"""Shared fixtures: a real daemon on a free loopback port with a temporary store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    url: str
    port: int
    models: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path

    def client(self, **kw: object) -> httpx.Client:
        kw.setdefault("timeout", 120)
        return httpx.Client(base_url=self.url, **kw)  # type: ignore[arg-type]

    def cli(
        self, *args: str, input: str | None = None, cwd: Path | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run our CLI against this daemon, as a user would."""
        return subprocess.run(
            [sys.executable, "-m", "modelhub", *args],
            env=self.env,
            cwd=cwd,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_daemon(models: Path, log: Path, extra_env: dict[str, str] | None = None) -> Daemon:
    port = free_port()
    env = dict(os.environ)
    env.update(
        {
            "MODELHUB_HOST": f"127.0.0.1:{port}",
            "MODELHUB_MODELS": str(models),
            "MODELHUB_NO_AUTOSTART": "1",
            "MODELHUB_CONFIG": str(models.parent / "no-config.yaml"),
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra_env or {})
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelhub", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited early:\n{log.read_text(errors='replace')}")
        try:
            if httpx.head(url + "/", timeout=1).status_code == 200:
                return Daemon(url, port, models, env, proc, log)
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"daemon did not answer in 60 s:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the session; tests use distinct model names."""
    base = tmp_path_factory.mktemp("daemon")
    d = start_daemon(base / "models", base / "daemon.log")
    yield d
    d.stop()


@pytest.fixture
def fresh_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon with an empty store of its own, for tests that count blobs or models."""
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log")
    yield d
    d.stop()
