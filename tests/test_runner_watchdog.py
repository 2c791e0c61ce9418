"""Runners that stop answering, answers too large for one protocol line, and error messages that
quote only their own request's log, through a real daemon (and the scheduler with real runner
processes where a setting must be lowered to reach a failure)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q4_1
from modelhub.config import Settings
from modelhub.engine import protocol as proto
from modelhub.errors import InputError
from modelhub.runtime.loadspec import LoadSpec
from modelhub.runtime.runner_process import LINE_LIMIT, RunnerProcess
from modelhub.runtime.scheduler import Scheduler
from tests.fixtures.synthetic import write_tiny_llama, write_wide_llama

pytestmark = pytest.mark.slow

TIMEOUT = 2  # MODELHUB_RUNNER_TIMEOUT of the daemon below
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("watchdog")
    d = start_daemon(
        base / "models",
        base / "daemon.log",
        {"MODELHUB_RUNNER_TIMEOUT": str(TIMEOUT), "MODELHUB_NUM_PARALLEL": "1"},
    )
    for name, source in (
        ("smol", f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 4096\n"),
        ("wide", f"FROM {write_wide_llama(base / 'wide.gguf')}\n"),
    ):
        modelfile = base / f"{name}.Modelfile"
        modelfile.write_text(source)
        d.create(name, modelfile)
    yield d
    d.stop()


def generate(c: httpx.Client, prompt: str = "Hi", **options: object) -> httpx.Response:
    body = {"model": "smol", "prompt": prompt, "stream": False, "options": {**GREEDY, **options}}
    return c.post("/api/generate", json=body)


def only_runner(d: Daemon) -> int:
    (pid,) = d.runner_pids()
    return pid


def model_loads(c: httpx.Client) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("modelhub_model_loads"):
            return float(line.split()[-1])
    raise AssertionError("no modelhub_model_loads in /metrics")


# -- item 8: a runner that stops answering ------------------------------------------------------


def test_a_stopped_runner_fails_its_stream_and_a_fresh_one_serves_the_queue(served: Daemon) -> None:
    """SIGSTOP mid-stream: the stream ends with an error naming the setting within the bound,
    the request queued behind it (one sequence) is served by a fresh runner, and so is the
    next one."""
    with served.client(timeout=60) as c:
        assert generate(c).status_code == 200
        stopped = only_runner(served)
        queued: list[httpx.Response] = []
        story = {
            "model": "smol",
            "prompt": "Tell me a long story.",
            "options": {"num_predict": 3000},
        }
        with c.stream("POST", "/api/generate", json=story) as r:
            lines = r.iter_lines()
            next(lines)

            def ask() -> None:
                with served.client(timeout=60) as other:
                    queued.append(generate(other))

            behind = threading.Thread(target=ask)
            behind.start()
            os.kill(stopped, signal.SIGSTOP)
            began = time.monotonic()
            try:
                rest = [json.loads(line) for line in lines if line.strip()]
            finally:
                with contextlib.suppress(ProcessLookupError):  # killed and reaped, if all went well
                    os.kill(stopped, signal.SIGCONT)
            waited = time.monotonic() - began
        behind.join(60)
        error = rest[-1].get("error", "")
        assert "stopped answering" in error and "MODELHUB_RUNNER_TIMEOUT" in error, rest[-1]
        assert waited < TIMEOUT + 10, waited
        assert queued and queued[0].status_code == 200, queued and queued[0].text
        assert generate(c).status_code == 200
        fresh = only_runner(served)
        assert fresh != stopped
        with pytest.raises(ProcessLookupError):
            os.kill(stopped, 0)


def test_a_long_prefill_is_not_taken_for_silence() -> None:
    """One llama_decode of a ~600-token prompt runs several times longer than a half-second
    bound: the runner's heartbeat thread goes on beside it (and beside the load before it)."""
    bound = 0.5
    prompt = " ".join(f"word{i}" for i in range(200))
    config = {"model_path": str(smollm2_q4_1()), "n_ctx": 1024, "n_batch": 1024}
    spec = LoadSpec.make("smol", "sha256:" + "0" * 64, "sha256:" + "1" * 64, config, {})
    msg = proto.Generate(prompt=prompt, options=proto.RunnerOptions(num_predict=1))

    async def scenario() -> list[proto.Event]:
        scheduler = Scheduler(runner_timeout=bound)
        try:
            async with scheduler.use(spec, keep_alive=None) as loaded:
                return [event async for event in loaded.process.request(msg)]
        finally:
            await scheduler.close()

    events = asyncio.run(scenario())
    done = events[-1]
    assert isinstance(done, proto.Done), done
    assert done.result.prompt_eval_count > 500
    seconds = done.result.prompt_eval_duration_ns / 1e9
    if seconds < 3 * bound:  # the bound and two heartbeat intervals, with room
        pytest.skip(f"this machine evaluated the prompt in {seconds:.1f} s: nothing to show")


def test_the_runner_timeout_setting_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELHUB_CONFIG", str(tmp_path / "none.yaml"))

    def timeout(value: str) -> float:
        return Settings.from_env({"MODELHUB_RUNNER_TIMEOUT": value}).runner_timeout

    assert Settings.from_env({}).runner_timeout == 30
    assert timeout("45") == 45 and timeout("2m") == 120 and timeout("0") == 0
    for bad in ("0.5", "-3", "soon", "5x"):
        with pytest.raises(InputError, match="MODELHUB_RUNNER_TIMEOUT="):
            timeout(bad)


# -- item 9: answers larger than a protocol line; embeddings beside generation ------------------


def test_an_embedding_batch_larger_than_a_protocol_line_is_answered(served: Daemon) -> None:
    """50 vectors of 65,536 numbers: about 75 MB of JSON, over the 64 MiB a runner line may
    hold; the runner sends them in pieces."""
    texts = [f"the {i} tiny model" for i in range(50)]
    with served.client(timeout=600) as c:
        r = c.post("/api/embed", json={"model": "wide", "input": texts, "keep_alive": 0})
        assert r.status_code == 200, r.text[:500]
        vectors = r.json()["embeddings"]
    assert len(vectors) == len(texts) and {len(v) for v in vectors} == {65536}
    assert len(json.dumps(vectors)) > LINE_LIMIT
    assert all(abs(math.fsum(x * x for x in v) - 1) < 1e-6 for v in vectors)


def test_embedding_and_generating_share_one_runner(served: Daemon) -> None:
    with served.client() as c:
        assert generate(c).status_code == 200
        runner, loads = only_runner(served), model_loads(c)
        embedded = c.post("/api/embed", json={"model": "smol", "input": ["a", "b"]})
        assert embedded.status_code == 200, embedded.text
        assert generate(c).status_code == 200
        assert c.post("/v1/embeddings", json={"model": "smol", "input": "c"}).status_code == 200
        assert only_runner(served) == runner and model_loads(c) == loads


def test_an_embedding_is_answered_while_a_generation_runs(served: Daemon) -> None:
    """The model serves one sequence (MODELHUB_NUM_PARALLEL=1) and it is generating: the
    embedding needs no sequence and is answered between its decode steps, before the
    generation's last line is written."""
    greedy = {"num_predict": 150, "temperature": 0}  # sampled, it may stop early
    story = {"model": "smol", "prompt": "Tell me a long story.", "options": greedy}
    with served.client(timeout=300) as c, served.client(timeout=300) as other:
        assert generate(c).status_code == 200
        with c.stream("POST", "/api/generate", json=story) as r:
            lines = r.iter_lines()
            next(lines)
            embedded = other.post("/api/embed", json={"model": "smol", "input": ["a", "b"]})
            answered = datetime.now(UTC)
            rest = [json.loads(line) for line in lines if line.strip()]
    assert embedded.status_code == 200 and len(embedded.json()["embeddings"]) == 2
    final = rest[-1]
    assert final["done"] and final["eval_count"] == 150
    assert answered < datetime.fromisoformat(final["created_at"].replace("Z", "+00:00"))


def test_an_unreadable_reply_fails_its_request_and_a_fresh_runner_serves(tmp_path: Path) -> None:
    """A reply line over the reader's limit (lowered here to 4 KiB, which a piece of 20
    embeddings exceeds) fails that request with the limit named, kills the runner, and the
    next request gets a fresh one; nothing waits forever."""
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    made: list[RunnerProcess] = []

    def factory(label: str) -> RunnerProcess:
        made.append(RunnerProcess(label, line_limit=4096))
        return made[-1]

    spec = LoadSpec.make(
        "tiny", "sha256:" + "0" * 64, "sha256:" + "1" * 64, {"model_path": str(model)}, {}
    )

    async def run(scheduler: Scheduler, msg: proto.Job) -> list[proto.Event]:
        async with scheduler.use(spec, keep_alive=None) as loaded:
            return [event async for event in loaded.process.request(msg)]

    async def scenario() -> None:
        scheduler = Scheduler(runner_factory=factory, runner_timeout=TIMEOUT)
        try:
            embed = proto.Embed(texts=["the hello world"] * 20)
            failed = await asyncio.wait_for(run(scheduler, embed), 60)
            error = failed[-1]
            assert isinstance(error, proto.ErrorEvent), error
            assert "longer than the 4096 bytes" in error.message
            generate = proto.Generate(prompt="the", options=proto.RunnerOptions(num_predict=4))
            served = await asyncio.wait_for(run(scheduler, generate), 60)
            assert isinstance(served[-1], proto.Done), served[-1]
        finally:
            await scheduler.close()

    asyncio.run(scenario())
    first, second = made
    assert first.proc is not None and first.proc.returncode == -signal.SIGKILL
    assert second.proc is not None and second.proc.returncode is not None  # closed, reaped


# -- item 17: only the failing request's log lines ----------------------------------------------


def test_a_crash_quotes_none_of_an_earlier_requests_log(served: Daemon) -> None:
    with served.client(timeout=120) as c:
        bad = c.post(
            "/api/generate",
            json={"model": "smol", "prompt": "Hi", "stream": False, "grammar": 'root ::= "a" ('},
        )
        assert bad.status_code == 400 and "grammar" in bad.json()["error"]
        runner = only_runner(served)
        story = {
            "model": "smol",
            "prompt": "Tell me a long story.",
            "options": {"num_predict": 3000},
        }
        with c.stream("POST", "/api/generate", json=story) as r:
            lines = r.iter_lines()
            next(lines)
            os.kill(runner, signal.SIGSEGV)
            rest = [json.loads(line) for line in lines if line.strip()]
    error = rest[-1]["error"]
    assert error == "model runner for smol:latest stopped unexpectedly (killed by SIGSEGV)"


def test_a_grammar_error_says_only_what_its_own_grammar_did(served: Daemon) -> None:
    with served.client(timeout=120) as c:
        errors = []
        for grammar in ('root ::= "a" (', 'root ::= "b" [', "root ::= undefined-rule"):
            body = {"model": "smol", "prompt": "Hi", "stream": False, "grammar": grammar}
            r = c.post("/api/generate", json=body)
            assert r.status_code == 400
            errors.append(r.json()["error"])
    assert errors == ["invalid grammar: failed to parse grammar"] * 3
