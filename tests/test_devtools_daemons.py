"""The test environment: no ``MODELHUB_*`` setting of the developer's reaches a test or a daemon
(the autouse fixture in conftest.py, and devtools.daemons.daemon_env), and the check after every
test that each runner process of a daemon is one ``/api/ps`` lists."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from devtools.daemons import ROOT, Daemon, daemon_env


def test_tests_run_without_modelhub_variables() -> None:
    # tests/conftest.py removed them for this test; only the model cache's location may stay
    assert {k for k in os.environ if k.startswith("MODELHUB_")} <= {"MODELHUB_TEST_CACHE"}


def test_daemon_env_drops_inherited_settings_and_sets_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELHUB_KEEP_ALIVE", "-1")  # as a session fixture could still see it
    monkeypatch.setenv("MODELHUB_TEST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UNRELATED", "kept")
    env = daemon_env(tmp_path / "models", 4321, {"MODELHUB_NUM_THREADS": "2"})
    assert {k: v for k, v in env.items() if k.startswith("MODELHUB_")} == {
        "MODELHUB_HOST": "127.0.0.1:4321",
        "MODELHUB_MODELS": str(tmp_path / "models"),
        "MODELHUB_NO_AUTOSTART": "1",
        "MODELHUB_CONFIG": str(tmp_path / "no-config.yaml"),
        "MODELHUB_NUM_THREADS": "2",
    }
    assert env["UNRELATED"] == "kept"
    assert env["PYTHONPATH"] == str(ROOT)


def test_parallel_workers_get_disjoint_shares_of_every_cpu() -> None:
    from tests.fixtures.workers import share_of, worker_count

    cpus = [0, 1, 2, 3, 4, 5, 8, 9]
    for workers in (1, 2, 3, 5, 8):
        shares = [share_of(i, workers, cpus) for i in range(workers)]
        assert all(shares), shares
        assert set().union(*shares) == set(cpus)
        assert sum(len(s) for s in shares) == len(cpus)  # disjoint
    assert [share_of(i, 3, [0, 1]) for i in range(3)] == [{0}, {1}, {0}]
    assert 1 <= worker_count() <= 8
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:  # this worker is pinned to its share
        assert len(os.sched_getaffinity(0)) <= -(-(os.cpu_count() or 1) // workers)


class _Leaky(Daemon):
    """The session daemon, seen with one more runner process than it has (this test's own
    process, which ``/api/ps`` cannot list)."""

    def runner_pids(self) -> set[int]:
        return super().runner_pids() | {os.getpid()}


def test_the_leak_check_names_a_runner_that_ps_does_not_list(daemon: Daemon) -> None:
    assert daemon.unlisted_runners(settle=0) is None
    leaky = _Leaky(**{f.name: getattr(daemon, f.name) for f in dataclasses.fields(Daemon)})
    started = time.monotonic()
    problem = leaky.unlisted_runners(settle=0.5)
    assert problem is not None and problem.endswith("leaked runners"), problem
    assert time.monotonic() - started >= 0.5  # runners being unloaded get the settle time
