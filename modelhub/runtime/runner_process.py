"""The daemon's side of a runner: spawn it, talk JSON lines, survive its death.

Every in-flight request has a queue of events. When the process exits (crash, abort, OOM kill)
each waiting request receives an error event, and the runner is marked dead so the scheduler
starts a fresh one for the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from modelhub.engine.cpu import REINSTALL_HINT
from modelhub.errors import ErrorKind, ModelhubError, RunnerCrashedError, error_for_kind

log = logging.getLogger("modelhub.runner")

_ids = itertools.count(1)
# The events that end a request (see the protocol in engine/runner.py).
FINAL_EVENTS = frozenset({"done", "error", "embeddings", "tokens", "counts"})


class RunnerProcess:
    def __init__(self, label: str) -> None:
        self.label = label
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.loaded: asyncio.Future[dict[str, Any]] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.stderr_task: asyncio.Task[None] | None = None
        self.dead = False
        self.exit_code: int | None = None
        self.exit_reason = ""
        self.repack: bool | None = None  # what the runner was told (None: its own choice)
        self.info: dict[str, Any] = {}
        self.stderr_tail: list[str] = []

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def illegal_instruction(self) -> bool:
        """The runner died of SIGILL (see ``engine.cpu``: the AMX/repacking fault)."""
        return self.exit_code == -signal.SIGILL

    async def start(self, config: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
        """Start the runner and load; on any failure (or cancellation) the process is gone."""
        try:
            return await self._start(config, timeout)
        except BaseException:
            await self.kill()
            raise

    async def _start(self, config: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.repack = config.get("repack")
        env = dict(os.environ)
        # ggml prints a backtrace (attaching gdb where installed) before it aborts: slow, and
        # it buries the one line that says why.
        env.setdefault("GGML_NO_BACKTRACE", "1")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "modelhub.engine.runner",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            limit=64 * 1024 * 1024,
        )
        self.loaded = asyncio.get_running_loop().create_future()
        self.reader = asyncio.create_task(self._read())
        self.stderr_task = asyncio.create_task(self._read_stderr())
        await self._send({"op": "load", "config": config})
        try:
            self.info = await asyncio.wait_for(asyncio.shield(self.loaded), timeout)
        except TimeoutError:
            raise RunnerCrashedError(
                f"loading {self.label} took longer than {timeout:.0f} s"
            ) from None
        return self.info

    async def _send(self, msg: dict[str, Any]) -> None:
        if self.dead or self.proc is None or self.proc.stdin is None:
            raise RunnerCrashedError(self._death_message())
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise RunnerCrashedError(self._death_message()) from exc

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.stderr_tail = ([*self.stderr_tail, line])[-20:]
                log.debug("[%s] %s", self.label, line)

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            async for raw in self.proc.stdout:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                event = msg.get("event")
                if event in ("loaded", "load_error"):
                    if self.loaded is not None and not self.loaded.done():
                        if event == "loaded":
                            self.loaded.set_result(msg)
                        else:
                            self.loaded.set_exception(
                                error_for_kind(
                                    ErrorKind.named(str(msg.get("kind"))),
                                    f"loading {self.label} failed: {msg.get('message')}",
                                )
                            )
                    continue
                q = self.pending.get(str(msg.get("id")))
                if q is not None:
                    q.put_nowait(msg)
        finally:
            code = await self.proc.wait()
            self.dead = True
            self.exit_code = code
            self.exit_reason = _describe_exit(code)
            if self.stderr_task is not None:
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(self.stderr_task, 1)
            err = {"event": "error", "message": self._death_message(), "kind": "internal"}
            if self.loaded is not None and not self.loaded.done():
                self.loaded.set_exception(RunnerCrashedError(self._death_message()))
            for q in self.pending.values():
                q.put_nowait(err)

    def _death_message(self) -> str:
        tail = next((line for line in reversed(self.stderr_tail) if "error" in line.lower()), "")
        detail = f": {tail}" if tail else ""
        rpc = next((line for line in reversed(self.stderr_tail) if "RPC" in line), "")
        if rpc:  # ggml aborts the process when a worker goes away mid-computation
            said = re.sub(r"^\S+\.(?:c|cc|cpp|h):\d+: ", "", rpc.strip())  # the source path
            detail = (
                f": {said} (an RPC worker of this model stopped or cannot be reached; "
                "restart it, then try again)"
            )
        if self.illegal_instruction:
            detail = (
                ": this CPU refused an instruction of llama.cpp's kernels even with weight "
                f"repacking off; {REINSTALL_HINT}"
                if self.repack is False
                else ": this CPU refused an instruction of llama.cpp's repacked (AMX) kernels; "
                "models load without repacking from now on, try again"
            )
        return f"model runner for {self.label} stopped unexpectedly ({self.exit_reason}){detail}"

    async def request(self, msg: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Send one request and yield its events until the final one."""
        rid = f"r{next(_ids)}"
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.pending[rid] = q
        finished = False
        try:
            await self._send({**msg, "id": rid})
            while True:
                event = await q.get()
                kind = event.get("event")
                if kind in FINAL_EVENTS:
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished and not self.dead:
                # The caller went away (client disconnect): stop the work at the next step.
                with contextlib.suppress(ModelhubError):
                    await self._send({"op": "cancel", "id": rid})
                # The runner still answers this id; wait for it (bounded) so that the next
                # request does not start while this one is running.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(_drain(q), 30)
            self.pending.pop(rid, None)

    async def close(self) -> None:
        if self.proc is None or self.dead:
            return
        with contextlib.suppress(ModelhubError):
            await self._send({"op": "shutdown"})
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            await self.kill()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


async def _drain(q: asyncio.Queue[dict[str, Any]]) -> None:
    while (await q.get()).get("event") not in FINAL_EVENTS:
        pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown exit"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
