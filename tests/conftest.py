"""Shared fixtures: a clean ``MODELHUB_*`` environment for every test, and real daemons on free
loopback ports with temporary stores (``devtools.daemons``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.openmp import steady_wait
from tests.fixtures.workers import pin_this_worker, worker_count

pin_this_worker()  # before llama.cpp loads: its threads and the runners' follow the pinning
steady_wait()  # before any test module loads llama.cpp: many engines share this process

from devtools.daemons import LIVE, Daemon, start_daemon  # noqa: E402
from tests.fakes.daemon import FakeDaemon, fake_daemon  # noqa: E402

# Kept for every test: it locates the real-model cache (devtools.realmodels), it is not a
# modelhub setting.
KEPT_ENV = frozenset({"MODELHUB_TEST_CACHE"})


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return worker_count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with ``slow`` tests first (each module's tests kept together, in order): the
    parallel workers start on the long tests and end stealing short ones, rather than one
    worker finishing a long test alone at the end."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)


@pytest.fixture(autouse=True)
def _no_modelhub_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every ``MODELHUB_*`` variable for the test, so a developer's settings (host,
    store, keep-alive, threads...) never change its result; monkeypatch restores them after.

    ``MODELHUB_TEST_CACHE`` is kept (see ``KEPT_ENV``): it only says where the cached test
    models live. A test that needs a setting sets it itself (``monkeypatch.setenv``), and
    daemons get theirs explicitly from ``devtools.daemons.daemon_env``, which also leaves the
    inherited ``MODELHUB_*`` variables out (session-scoped daemons start before this fixture).
    """
    for name in list(os.environ):
        if name.startswith("MODELHUB_") and name not in KEPT_ENV:
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _no_leaked_runners() -> Iterator[None]:
    """After every test: each live daemon's runner processes are all listed by /api/ps
    (a runner is registered or gone, never a hidden child eating memory)."""
    yield
    problems = [f"{d.url}: {p}" for d in list(LIVE) if (p := d.unlisted_runners()) is not None]
    assert not problems, "; ".join(problems)


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


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDaemon]:
    """The daemon's app in-process over fake runners (``tests/fakes``): for tests of routes,
    the scheduler and the client whose subject is not the model."""
    with fake_daemon(tmp_path) as d:
        yield d
