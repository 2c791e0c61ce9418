"""A fake runner: the scheduler's ``RunnerHandle`` in-process, without llama.cpp.

It speaks ``engine.protocol`` as the real runner does (every request it gets is decoded by the
same strict ``decode_request``, every event it answers is a protocol message), so a route that
builds a request the runner would refuse fails here too. A :class:`Script` says what it does:
the tokens it answers (each with its ``drafted`` flag), the final result's counters, an error
to raise before or after some tokens, a crash (at load or mid-answer), and how slow it is.
:class:`FakeRunners` is the factory the scheduler gets; it keeps every runner it made and
every request they received, so a test can check what reached "the runner".
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from modelhub.engine import protocol as p
from modelhub.engine.load_config import LoadConfig
from modelhub.errors import ModelhubError, RunnerCrashedError


@dataclass
class Script:
    """What the fake runners do. ``tokens``: (text, drafted) answered to a generate, in order;
    ``error``: raised as the request's error event after ``error_after`` tokens (None: not at
    all); ``crash_after``: the runner dies after that many tokens (None: never);
    ``load_error`` / ``crash_at_load``: the load fails; ``token_delay`` / ``load_delay``:
    seconds of slowness; ``n_ctx`` / ``n_parallel``: what the load reports."""

    tokens: list[tuple[str, bool]] = field(default_factory=lambda: [("Hello", False), ("!", True)])
    error: ModelhubError | None = None
    error_after: int = 0
    crash_after: int | None = None
    load_error: ModelhubError | None = None
    crash_at_load: bool = False
    token_delay: float = 0.0
    load_delay: float = 0.0
    n_ctx: int = 0  # 0: the n_ctx the load asked for
    n_parallel: int = 0  # 0: as asked
    embedding_size: int = 4
    report: dict[str, Any] = field(default_factory=dict)  # ``op: drafting``'s answer


class FakeRunner:
    """One fake runner (a ``runtime.runner_handle.RunnerHandle``)."""

    def __init__(self, label: str, script: Script, received: list[p.Message]) -> None:
        self.label = label
        self.script = script
        self.received = received  # every request of every runner, in order (shared)
        self.dead = False
        self.started = False
        self.config: dict[str, Any] = {}  # the load plan as it crossed the pipe

    @property
    def pid(self) -> int | None:
        return os.getpid() if self.started else None

    @property
    def illegal_instruction(self) -> bool:
        return False

    async def start(
        self, config: LoadConfig, timeout: float = 300, *, silence_limit: float = 0
    ) -> p.Loaded:
        load = p.decode_request(p.Load(config=config).encode())  # as the pipe carries it
        self.received.append(load)
        await asyncio.sleep(self.script.load_delay)
        if self.script.crash_at_load:
            self.dead = True
            raise RunnerCrashedError(f"model runner for {self.label} stopped unexpectedly")
        if self.script.load_error is not None:
            raise self.script.load_error
        self.started, self.config = True, p.Load(config=config).wire()["config"]
        asked = config.n_parallel or 1
        loaded = p.Loaded(
            pid=os.getpid(),
            n_ctx=self.script.n_ctx or config.n_ctx,
            n_parallel=self.script.n_parallel or asked,
            kv_cache_type=config.kv_cache_type,
            repack=config.repack is not False,  # a real runner decides by CPU when not told
        )
        event = p.decode_event(loaded.encode())  # as the pipe carries it
        assert isinstance(event, p.Loaded)
        return event

    async def request(self, msg: p.Job) -> AsyncIterator[p.Event]:
        if self.dead:
            raise RunnerCrashedError(f"model runner for {self.label} stopped unexpectedly")
        rid = f"f{len(self.received)}"
        req = p.decode_request(msg.model_copy(update={"id": rid}).encode())  # as the pipe has it
        self.received.append(req)
        for event in self._answer(req):
            if isinstance(event, float):
                await asyncio.sleep(event)
                continue
            yield p.decode_event(event.encode())  # what crosses the pipe, checked
            if p.is_final(event):
                return

    def _answer(self, req: p.Message) -> Iterator[p.Message | float]:
        rid = str(getattr(req, "id", ""))
        s = self.script
        if isinstance(req, p.Generate):
            yield from self._generate(rid, req)
        elif isinstance(req, p.Count):
            yield p.Counts(id=rid, counts=[len(t.split()) + 1 for t in req.texts])
        elif isinstance(req, p.Tokenize):
            yield p.Tokens(id=rid, tokens=list(range(len(req.text.split()))))
        elif isinstance(req, p.Embed):
            vectors = [[float(len(t))] + [0.5] * (s.embedding_size - 1) for t in req.texts]
            count = sum(len(t.split()) for t in req.texts)
            yield p.Embeddings(id=rid, embeddings=vectors, prompt_eval_count=count)
        elif isinstance(req, p.Drafting):
            yield p.DraftingReport(id=rid, report=s.report)

    def _generate(self, rid: str, req: p.Generate) -> Iterator[p.Message | float]:
        s = self.script
        prompt_tokens = len(req.prompt.split()) + len(req.context or [])
        yield p.Prompt(id=rid, prompt_tokens=prompt_tokens)
        limit = req.options.num_predict
        tokens = s.tokens if limit is None or limit < 0 else s.tokens[:limit]
        for i, (text, drafted) in enumerate(tokens):
            if s.error is not None and i == s.error_after:
                yield p.ErrorEvent.of(s.error, id=rid)
            if s.crash_after is not None and i == s.crash_after:
                self.dead = True
                message = f"model runner for {self.label} stopped unexpectedly (killed by SIGKILL)"
                yield p.ErrorEvent.of(RunnerCrashedError(message), id=rid)
            yield s.token_delay
            yield p.Token(id=rid, text=text, drafted=drafted)
        if s.error is not None and s.error_after >= len(tokens):
            yield p.ErrorEvent.of(s.error, id=rid)
        accepted = sum(1 for _, d in tokens if d)
        result = p.DoneResult(
            text="".join(t for t, _ in tokens),
            done_reason="length" if len(tokens) < len(s.tokens) else "stop",
            prompt_eval_count=prompt_tokens,
            prompt_eval_duration_ns=1000,
            eval_count=len(tokens),
            eval_duration_ns=1000 * max(1, len(tokens)),
            draft_count=accepted,
            draft_accepted_count=accepted,
            context=[*(req.context or []), *range(prompt_tokens + len(tokens))],
        )
        yield p.Done(id=rid, result=result)

    async def close(self) -> None:
        self.dead = True


class FakeRunners:
    """The scheduler's ``runner_factory``: makes :class:`FakeRunner`s that follow ``script``
    (change it between requests) and keeps them and what they received."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self.made: list[FakeRunner] = []
        self.received: list[p.Message] = []

    def __call__(self, label: str) -> FakeRunner:
        runner = FakeRunner(label, self.script, self.received)
        self.made.append(runner)
        return runner

    def generates(self) -> list[p.Generate]:
        return [r for r in self.received if isinstance(r, p.Generate)]

    def loads(self) -> list[p.Load]:
        return [r for r in self.received if isinstance(r, p.Load)]
