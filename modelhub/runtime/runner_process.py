"""The daemon's side of a runner: spawn it, talk JSON lines, survive its death or its silence.

Every in-flight request has a queue of events. When the process exits (crash, abort, OOM kill)
each waiting request receives an error event, and the runner is marked dead so the scheduler
starts a fresh one for the next request. Two failures end a runner that is still running:

- silence: a runner sends a heartbeat every second or so (``engine.liveness``); one that has
  said nothing for ``silence_limit`` seconds (stopped, deadlocked, starved by swapping) is
  killed;
- a protocol error: a line longer than ``line_limit`` bytes, a message that is not one of
  ``engine.protocol``'s, or anything else the reader cannot take, kills the runner instead of
  leaving its requests waiting for lines never read.

Requests go out through ``engine.protocol`` too: one the runner would not understand whole (a
field it does not know) is a ``RunnerProtocolError`` here, before it is sent. An ``error``
event keeps the class of the error the runner raised (``ErrorEvent.exception``); a runner's
death is a ``RunnerCrashedError`` for each request it was serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from modelhub.engine import protocol as p
from modelhub.engine.cpu import REINSTALL_HINT
from modelhub.engine.liveness import LOAD_MARK, heartbeat_interval
from modelhub.engine.load_config import LoadConfig
from modelhub.errors import ModelhubError, RunnerCrashedError, RunnerProtocolError
from modelhub.runtime.runner_log import RunnerLog

log = logging.getLogger("modelhub.runner")

_ids = itertools.count(1)
LINE_LIMIT = 64 * 1024 * 1024  # the longest line read from a runner
# Before its first heartbeat a runner is starting Python: slow on a busy machine.
START_ALLOWANCE = 30.0
TIMEOUT_SETTING = "MODELHUB_RUNNER_TIMEOUT"


class RunnerProcess:
    def __init__(self, label: str, *, line_limit: int = LINE_LIMIT) -> None:
        self.label = label
        self.line_limit = line_limit
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[str, asyncio.Queue[p.Event]] = {}
        self.loaded: asyncio.Future[p.Loaded] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.stderr_task: asyncio.Task[None] | None = None
        self.watchdog: asyncio.Task[None] | None = None
        self.dead = False
        self.exit_code: int | None = None
        self.exit_reason = ""
        self.repack: bool | None = None  # what the runner was told (None: its own choice)
        self.log_lines = RunnerLog()
        self.heard: float | None = None  # event-loop time of the last line from the runner
        self.failure: str | None = None  # why the daemon killed a running runner
        self._failing: set[str] = set()  # the requests its death fails (for the message)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def illegal_instruction(self) -> bool:
        """The runner died of SIGILL (see ``engine.cpu``: the AMX/repacking fault)."""
        return self.exit_code == -signal.SIGILL

    async def start(
        self, config: LoadConfig, timeout: float = 300, *, silence_limit: float = 0
    ) -> p.Loaded:
        """Start the runner and load; on any failure (or cancellation) the process is gone.
        ``silence_limit`` > 0: kill the runner when it has said nothing for that long."""
        try:
            return await self._start(config, timeout, silence_limit)
        except BaseException:
            await self.kill()
            raise

    async def _start(self, config: LoadConfig, timeout: float, silence_limit: float) -> p.Loaded:
        self.repack = config.repack
        env = dict(os.environ)
        # ggml prints a backtrace (attaching gdb where installed) before it aborts: slow, and
        # it buries the one line that says why.
        env.setdefault("GGML_NO_BACKTRACE", "1")
        beat = ["--heartbeat", f"{heartbeat_interval(silence_limit):g}"] if silence_limit else []
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "modelhub.engine.runner",
            *beat,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            limit=self.line_limit,
        )
        self.loaded = asyncio.get_running_loop().create_future()
        self.reader = asyncio.create_task(self._read())
        self.stderr_task = asyncio.create_task(self._read_stderr())
        if silence_limit > 0:
            self.watchdog = asyncio.create_task(self._watch(silence_limit))
        await self._send(p.Load(config=config))
        try:
            return await asyncio.wait_for(asyncio.shield(self.loaded), timeout)
        except TimeoutError:
            raise RunnerCrashedError(
                f"loading {self.label} took longer than {timeout:.0f} s"
            ) from None

    async def _send(self, msg: dict[str, Any] | p.Message) -> None:
        """Send one request (a dict is checked against the protocol first)."""
        line = (msg if isinstance(msg, p.Message) else p.decode_request(msg)).encode()
        if self.dead or self.proc is None or self.proc.stdin is None:
            raise RunnerCrashedError(self._death_message())
        data = (line + "\n").encode("utf-8")
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise RunnerCrashedError(self._death_message()) from exc

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            try:
                raw = await self.proc.stderr.readline()
            except ValueError:  # a line over the limit (dropped by the reader): go on
                continue
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip()
            if line and self.log_lines.feed(line):
                log.debug("[%s] %s", self.label, line)

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        try:
            async for raw in self.proc.stdout:
                self.heard = loop.time()
                self._take(p.decode_event(raw))
        except Exception as exc:  # a line over the limit (ValueError), or a bug: never wedge
            if isinstance(exc, ValueError) and "limit" in str(exc):
                why = (
                    f"sent a reply line longer than the {self.line_limit} bytes the daemon "
                    "reads from a runner (a protocol error)"
                )
            elif isinstance(exc, RunnerProtocolError):
                log.error("the runner for %s broke the protocol: %s", self.label, exc)
                why = f"sent what the daemon could not read ({exc.message})"
            else:
                log.exception("reading from the runner for %s failed", self.label)
                why = f"sent what the daemon could not read ({type(exc).__name__}: {exc})"
            self._fail(f"{why}; it was stopped, and the next request starts a fresh one")
        finally:
            await self._ended()

    def _take(self, event: p.Event) -> None:
        if isinstance(event, p.Alive):
            return
        if isinstance(event, p.Loaded | p.LoadError):
            if self.loaded is not None and not self.loaded.done():
                if isinstance(event, p.Loaded):
                    self.loaded.set_result(event)
                else:
                    self.loaded.set_exception(event.exception(f"loading {self.label} failed: "))
            return
        q = self.pending.get(event.id)
        if q is not None:
            q.put_nowait(event)

    async def _ended(self) -> None:
        """The runner's stdout is closed, or the reader gave up (and killed it): once it has
        exited, fail what waits."""
        assert self.proc is not None
        self._failing = set(self.pending)
        if self.loaded is not None and not self.loaded.done():
            self._failing.add(LOAD_MARK)
        code = await self.proc.wait()
        self.dead = True
        self.exit_code = code
        self.exit_reason = _describe_exit(code)
        if self.watchdog is not None and self.watchdog is not asyncio.current_task():
            self.watchdog.cancel()
        if self.stderr_task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self.stderr_task, 1)
        message = self._death_message()
        if self.loaded is not None and not self.loaded.done():
            self.loaded.set_exception(RunnerCrashedError(message))
        err = p.ErrorEvent.of(RunnerCrashedError(message))
        for q in self.pending.values():
            q.put_nowait(err)

    async def _watch(self, limit: float) -> None:
        """Kill the runner once it has said nothing for ``limit`` seconds."""
        loop = asyncio.get_running_loop()
        interval = heartbeat_interval(limit)
        started = loop.time()
        while not self.dead:
            await asyncio.sleep(interval)
            if self._silent_for(loop, started) <= self._allowed(limit):
                continue
            # Give the reader a turn first: after the event loop was busy elsewhere, lines the
            # runner wrote in time may still wait in the pipe.
            await asyncio.sleep(interval)
            silent = self._silent_for(loop, started)
            if silent > self._allowed(limit) and not self.dead:
                log.warning("runner for %s silent for %.1f s: killing it", self.label, silent)
                self._fail(
                    f"stopped answering (nothing from it for {silent:.0f} s: the process is "
                    "stopped, deadlocked or starved of memory); it was killed, and the next "
                    f"request starts a fresh one ({TIMEOUT_SETTING}, now {limit:g} s, sets "
                    "how long a silent runner is waited for)"
                )
                return

    def _silent_for(self, loop: asyncio.AbstractEventLoop, started: float) -> float:
        return loop.time() - (self.heard if self.heard is not None else started)

    def _allowed(self, limit: float) -> float:
        return limit if self.heard is not None else max(limit, START_ALLOWANCE)

    def _fail(self, why: str) -> None:
        """Kill a runner that is still running, for ``why`` (the message its requests get)."""
        if self.failure is None:
            self.failure = why
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()  # SIGKILL ends a stopped process too

    def _death_message(self) -> str:
        if self.failure is not None:
            return f"model runner for {self.label} {self.failure}"
        said = self.log_lines.explanation(self._failing | set(self.pending))
        detail = f": {said}" if said else ""
        if self.illegal_instruction:
            detail = (
                ": this CPU refused an instruction of llama.cpp's kernels even with weight "
                f"repacking off; {REINSTALL_HINT}"
                if self.repack is False
                else ": this CPU refused an instruction of llama.cpp's repacked (AMX) kernels; "
                "models load without repacking from now on, try again"
            )
        return f"model runner for {self.label} stopped unexpectedly ({self.exit_reason}){detail}"

    async def request(self, msg: p.Job) -> AsyncIterator[p.Event]:
        """Send one request and yield its events until the final one."""
        rid = f"r{next(_ids)}"
        request = msg.model_copy(update={"id": rid})
        q: asyncio.Queue[p.Event] = asyncio.Queue()
        self.pending[rid] = q
        finished = False
        try:
            await self._send(request)
            while True:
                event = await q.get()
                finished = p.is_final(event)
                yield event
                if finished:
                    return
        finally:
            if not finished and not self.dead:
                # The caller went away (client disconnect): stop the work at the next step.
                with contextlib.suppress(ModelhubError):
                    await self._send(p.Cancel(id=rid))
                # The runner still answers this id; wait for it (bounded) so that the next
                # request does not start while this one is running.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(_drain(q), 30)
            self.pending.pop(rid, None)

    async def close(self) -> None:
        if self.proc is None or self.dead:
            return
        with contextlib.suppress(ModelhubError):
            await self._send(p.Shutdown())
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            await self.kill()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


async def _drain(q: asyncio.Queue[p.Event]) -> None:
    while not p.is_final(await q.get()):
        pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
