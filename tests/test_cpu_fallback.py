"""The SIGILL fallback (CPUs and VMs that advertise AMX without enabling it), for real.

The runners here execute a real illegal instruction (``MODELHUB_TEST_FAULT``) on their warm-up
decode, the way ggml's AMX kernels fault on such a VM: only while weights are repacked
(``sigill-with-repack``) or always (``sigill``, a build for another CPU).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from modelhub.config import Settings
from modelhub.engine.cpu import amx_advertised, amx_faults, cpu_flags, repack_default
from modelhub.errors import InputError
from tests.fixtures.synthetic import write_tiny_llama

PROMPT = {"prompt": "a b c", "stream": False, "options": {"temperature": 0, "num_predict": 4}}


def _child(code: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)


def test_illegal_instruction_kills_with_a_real_sigill() -> None:
    done = _child("from modelhub.engine.cpu import illegal_instruction; illegal_instruction()")
    assert done.returncode == -signal.SIGILL


def test_amx_probe_matches_what_this_cpu_advertises() -> None:
    if amx_advertised():
        pytest.skip("this CPU advertises AMX: the probe's answer depends on the hypervisor")
    assert "amx_tile" not in cpu_flags()
    assert amx_faults() is False  # the kernel refuses AMX state: ggml will not use it either
    decision = repack_default()
    assert decision.enabled and decision.reason == "default"


def test_repack_setting_words() -> None:
    assert Settings.from_env({"MODELHUB_REPACK": "off"}).repack is False
    assert Settings.from_env({"MODELHUB_REPACK": "on"}).repack is True
    assert Settings.from_env({"MODELHUB_REPACK": "auto"}).repack is None
    assert Settings.from_env({}).repack is None
    with pytest.raises(InputError, match="MODELHUB_REPACK='maybe': use auto, on or off"):
        Settings.from_env({"MODELHUB_REPACK": "maybe"})


def _create(d: Daemon, tmp_path: Path, name: str, seed: int) -> None:
    model = write_tiny_llama(tmp_path / f"{name}.gguf", seed=seed)
    mf = tmp_path / f"{name}.Modelfile"
    mf.write_text(f"FROM {model}\n")
    d.create(name, mf)


@pytest.fixture
def faulting(tmp_path: Path) -> Daemon:
    d = start_daemon(
        tmp_path / "models",
        tmp_path / "daemon.log",
        {"MODELHUB_TEST_FAULT": "sigill-with-repack", "MODELHUB_REPACK": "auto"},
    )
    yield d
    d.stop()


def test_runner_faulting_with_repack_is_restarted_without_it(
    faulting: Daemon, tmp_path: Path
) -> None:
    _create(faulting, tmp_path, "tiny-a", 0)
    _create(faulting, tmp_path, "tiny-b", 1)
    with faulting.client() as c:
        first = c.post("/api/generate", json={"model": "tiny-a", **PROMPT})
        assert first.status_code == 200, first.text
        assert first.json()["done"] is True and first.json()["eval_count"] > 0
        # The daemon remembers: the next model loads without repacking at once (one warning).
        second = c.post("/api/generate", json={"model": "tiny-b", **PROMPT})
        assert second.status_code == 200, second.text
        embedded = c.post("/api/embed", json={"model": "tiny-b", "input": "a b"})
        assert embedded.status_code == 200, embedded.text
        models = c.get("/api/ps").json()["models"]
        assert {m["name"] for m in models} == {"tiny-a:latest", "tiny-b:latest"}
        assert all(m["repack"] is False for m in models)
        info = c.get("/api/info").json()
    assert info["repack"]["enabled"] is False and info["repack"]["setting"] == "auto"
    assert "tiny-a" in info["repack"]["fallback"] and "SIGILL" in info["repack"]["fallback"]
    log = faulting.log.read_text(errors="replace")
    assert log.count("died of SIGILL with repacked weights") == 1, log
    # Exactly the two registered runners are alive: the faulted one was reaped.
    assert len(faulting.runner_pids()) == 2

    ps = faulting.cli("ps")
    assert ps.returncode == 0, ps.stderr
    assert "Note: weights are not repacked" in ps.stdout
    shown = faulting.cli("info")
    assert shown.returncode == 0, shown.stderr
    assert "weight repacking: off (setting auto): the runner for tiny-a" in shown.stdout
    assert "llama-cpp-python: 0.3." in shown.stdout and "backends:" in shown.stdout


def test_a_persistent_sigill_names_the_cause_and_the_remedy(tmp_path: Path) -> None:
    d = start_daemon(
        tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_TEST_FAULT": "sigill"}
    )
    try:
        _create(d, tmp_path, "tiny", 0)
        with d.client() as c:
            r = c.post("/api/generate", json={"model": "tiny", **PROMPT})
            assert r.status_code == 500
            error = r.json()["error"]
            assert "killed by SIGILL" in error
            assert "even with weight repacking off" in error
            assert "pip install --force-reinstall" in error and "-mno-amx-tile" in error
            assert c.get("/api/ps").json()["models"] == []
            embed = c.post("/api/embed", json={"model": "tiny", "input": "a"})
            assert embed.status_code == 500 and "-mno-amx-tile" in embed.json()["error"]
        run = d.cli("run", "tiny", "hello")
        assert run.returncode == 1
        assert run.stderr.startswith("Error: ") and "-mno-amx-tile" in run.stderr
        assert "Traceback" not in run.stderr
        assert d.runner_pids() == set()
    finally:
        d.stop()


def test_repack_off_by_setting_loads_without_a_fault(tmp_path: Path) -> None:
    d = start_daemon(
        tmp_path / "models",
        tmp_path / "daemon.log",
        {"MODELHUB_TEST_FAULT": "sigill-with-repack", "MODELHUB_REPACK": "off"},
    )
    try:
        _create(d, tmp_path, "tiny", 0)
        with d.client() as c:
            assert c.post("/api/generate", json={"model": "tiny", **PROMPT}).status_code == 200
            assert c.get("/api/ps").json()["models"][0]["repack"] is False
            info = c.get("/api/info").json()["repack"]
        assert info == {
            "enabled": False,
            "setting": "off",
            "fallback": None,
            "reason": "set by MODELHUB_REPACK",
        }
        assert "SIGILL" not in d.log.read_text(errors="replace")
    finally:
        d.stop()


def test_info_without_a_fault(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=60) as c:
        info = c.get("/api/info").json()
    system = info["system"]
    assert system["backends"] and "CPU" in system["backends"]
    assert any(dev["type"] == "cpu" for dev in system["devices"])
    assert info["repack"]["setting"] == "auto" and info["repack"]["fallback"] is None
    assert info["repack"]["enabled"] is repack_default().enabled
    assert info["models_dir"] == str(daemon.models)
