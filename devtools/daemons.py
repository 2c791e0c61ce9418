"""A real ``modelhub serve`` on a free loopback port with a store of its own.

Used by the test fixtures (``tests/conftest.py``) and by ``bench/serving.py``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from modelhub.cli.create_request import plan_create
from modelhub.client import Client
from modelhub.store import sha256_file

ROOT = Path(__file__).resolve().parent.parent

# Daemons started and not yet stopped (the test suite checks them for leaked runners).
LIVE: set[Daemon] = set()
# sha256 of the files Daemon.create has hashed, by (real path, size, mtime): fixtures create
# from the same cached models again and again.
_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of ``path``, hashed once per process while the file is unchanged."""
    stat = path.stat()
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)[0]
    return _DIGESTS[key]


def create_model(client: Client, name: str, modelfile: Path) -> None:
    """What ``modelhub create NAME -f MODELFILE`` does, in this process: the CLI's own plan
    (:func:`plan_create`), the blobs the daemon lacks uploaded, then ``POST /api/create``. For
    fixtures whose subject is not the CLI (a CLI process costs ~0.3 s of a CPU; the CLI's
    create has tests of its own). A failure raises the daemon's error."""
    plan = plan_create(name, modelfile.read_bytes(), modelfile.parent)
    digests = {path: file_digest(path) for path in plan.local_files()}
    for digest, path in {d: p for p, d in digests.items()}.items():
        if not client.blob_exists(digest):
            client.push_blob(digest, path)
    items = list(client.create(plan.request(digests)))
    if not items or items[-1].get("status") != "success":
        raise RuntimeError(f"create {name} ended without success: {items[-1:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(eq=False)
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

    def create(self, name: str, modelfile: Path) -> None:
        """``modelhub create NAME -f MODELFILE`` without a CLI process (:func:`create_model`)."""
        with Client(self.url, timeout=600) as client:
            create_model(client, name, modelfile)

    def runner_pids(self) -> set[int]:
        """The model runner processes this daemon has now."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return set()
        found = set()
        for child in children:
            with contextlib.suppress(psutil.Error):
                if "modelhub.engine.runner" in " ".join(child.cmdline()):
                    found.add(child.pid)
        return found

    def unlisted_runners(self, settle: float = 10.0) -> str | None:
        """None when every runner is one ``/api/ps`` lists; else what is wrong. Runners that
        are being unloaded get ``settle`` seconds to exit."""
        deadline = time.monotonic() + settle
        while True:
            if self.proc.poll() is not None:
                return None
            pids = self.runner_pids()
            if not pids:  # none to account for (and no request to make)
                return None
            try:
                listed = len(httpx.get(self.url + "/api/ps", timeout=10).json()["models"])
            except (httpx.HTTPError, ValueError, KeyError):
                return None  # not answering: nothing to compare with
            if len(pids) <= listed:
                return None
            if time.monotonic() > deadline:
                return f"{len(pids)} runner processes, /api/ps lists {listed}: leaked runners"
            time.sleep(0.2)

    def stop(self) -> None:
        LIVE.discard(self)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def daemon_env(models: Path, port: int, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a daemon (and of the CLI run against it).

    It inherits this process's environment without any ``MODELHUB_*`` variable, so that a
    developer's settings never reach it (session-scoped fixtures start before the per-test
    environment cleanup in ``tests/conftest.py``), then sets what the daemon needs: its address,
    its store, no autostart, a config file that does not exist, and ``extra_env``. The checkout
    comes first on its ``PYTHONPATH``, then this process's own (packages installed beside the
    interpreter's, as bench/cuda.sh does on a machine without network).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELHUB_")}
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        {
            "MODELHUB_HOST": f"127.0.0.1:{port}",
            "MODELHUB_MODELS": str(models),
            "MODELHUB_NO_AUTOSTART": "1",
            "MODELHUB_CONFIG": str(models.parent / "no-config.yaml"),
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
        }
    )
    env.update(extra_env or {})
    return env


def start_daemon(models: Path, log: Path, extra_env: dict[str, str] | None = None) -> Daemon:
    """Start ``modelhub serve`` (environment: :func:`daemon_env`) and wait until it answers."""
    port = free_port()
    env = daemon_env(models, port, extra_env)
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
                daemon = Daemon(url, port, models, env, proc, log)
                LIVE.add(daemon)
                return daemon
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"daemon did not answer in 60 s:\n{log.read_text(errors='replace')}")
