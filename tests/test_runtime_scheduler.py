"""The scheduler in-process, with real runner processes it starts through its factory seam:
what it starts, what it reaps, and the SIGILL fallback's restart seen from inside."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from modelhub.errors import InputError
from modelhub.runtime.loadspec import LoadSpec
from modelhub.runtime.runner_process import RunnerProcess
from modelhub.runtime.scheduler import Scheduler
from tests.fixtures.synthetic import write_tiny_llama


def spec(model: Path, **config: object) -> LoadSpec:
    return LoadSpec.make(
        "tiny", "sha256:" + "0" * 64, "sha256:" + "1" * 64, {"model_path": str(model), **config}, {}
    )


class Recorder:
    """The factory seam: every runner the scheduler makes, kept to look at afterwards."""

    def __init__(self) -> None:
        self.made: list[RunnerProcess] = []

    def __call__(self, label: str) -> RunnerProcess:
        process = RunnerProcess(label)
        self.made.append(process)
        return process


def test_a_sigill_with_repacking_restarts_the_runner_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELHUB_TEST_FAULT", "sigill-with-repack")
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    made = Recorder()

    async def scenario() -> None:
        scheduler = Scheduler(runner_factory=made)
        async with scheduler.use(spec(model, n_ctx=256), keep_alive=None) as loaded:
            assert loaded.info.repack is False
            assert loaded.process is made.made[1]
        faulted = made.made[0]
        assert faulted.illegal_instruction and faulted.proc is not None
        assert faulted.proc.returncode == -signal.SIGILL
        assert scheduler.repack is False and scheduler.repack_fallback is not None
        await scheduler.close()
        assert made.made[1].proc is not None and made.made[1].proc.returncode is not None

    asyncio.run(scenario())
    assert len(made.made) == 2


def test_a_failed_load_leaves_no_process(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    made = Recorder()

    async def scenario() -> None:
        scheduler = Scheduler(runner_factory=made)
        with pytest.raises(InputError, match="draft_p_min=5"):
            async with scheduler.use(spec(model, n_ctx=256, draft_p_min=5), keep_alive=None):
                pass
        assert scheduler.runners == {}

    asyncio.run(scenario())
    (process,) = made.made
    assert process.proc is not None and process.proc.returncode is not None  # killed, reaped
