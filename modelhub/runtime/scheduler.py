"""Loaded runners: load on first use, keep_alive, LRU eviction, ``n_parallel`` requests per runner.

A runner is identified by what was loaded: the weights blob, the draft and the load-time
options. Two model names over the same blob and options share one runner (as `cp` copies do).
A request whose load options differ from the loaded runner's replaces it. Loads happen one at
a time; at most ``max_loaded`` runners stay resident, and the least recently used idle one
makes room. Memory makes room the same way: a runner starts only when its estimated needs
(``LoadSpec.memory``) fit in what is available, after idle runners are unloaded if need be; a
model that cannot fit even with every other runner unloaded is refused before it starts.

Each runner serves up to its ``n_parallel`` requests at once (its engine batches them); the
others wait here, counted against ``max_queue`` (beyond it: 503). ``n_parallel`` 0 in a load
spec means automatic: 4 when the runner's memory with four sequences' KV caches fits in what is
free now, else 1 (Ollama's choice); memory planning counts every sequence's KV cache.

A runner that dies (or is killed for saying nothing for ``runner_timeout`` seconds, see
``runner_process``) fails the requests it was serving; requests still waiting for one of its
sequences go to a fresh runner. Embeddings do not take a sequence: the engine computes them
in a context of its own, between the decode steps of running generations.

A runner that dies of SIGILL with repacked weights (a CPU or VM that advertises AMX without
enabling it, see ``engine.cpu``) is started once more without repacking, and every later load
does without it too; the log says so once, and ``/api/ps`` and ``/api/info`` show it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from modelhub.config import DEFAULT_RUNNER_TIMEOUT
from modelhub.engine import protocol as p
from modelhub.errors import InsufficientMemoryError, RunnerCrashedError, ServerBusyError
from modelhub.runtime.loadspec import DraftTally, LoadSpec
from modelhub.runtime.memory import MemoryEstimate, available_bytes, gib
from modelhub.runtime.runner_handle import RunnerHandle
from modelhub.runtime.runner_process import RunnerProcess

log = logging.getLogger("modelhub.runtime.scheduler")

FOREVER = math.inf
AUTO_PARALLEL = 4  # sequences per runner when memory allows and nothing says otherwise


@dataclass
class Loaded:
    spec: LoadSpec
    process: RunnerHandle
    keep_alive: float
    info: p.Loaded  # what the runner reported when it had loaded
    loaded_at: float = field(default_factory=time.time)
    active: int = 0
    expires_at: float = FOREVER
    last_used: float = field(default_factory=time.monotonic)
    timer: asyncio.TimerHandle | None = None
    memory: MemoryEstimate = field(default_factory=MemoryEstimate)  # with every sequence's KV
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    running: int = 0
    queued: int = 0
    drafting: DraftTally = field(default_factory=lambda: DraftTally())

    @property
    def usable(self) -> bool:
        return not self.process.dead

    @property
    def n_parallel(self) -> int:
        return self.info.n_parallel or 1


class Scheduler:
    def __init__(
        self,
        *,
        max_loaded: int = 3,
        default_keep_alive: float = 300.0,
        max_queue: int = 512,
        memory_limit: int | None = None,
        repack: bool | None = None,
        num_parallel: int = 0,
        kv_cache_type: str = "auto",
        flash_attention: bool = True,
        num_gpu: int = -1,
        rpc_servers: tuple[str, ...] = (),
        runner_timeout: float = DEFAULT_RUNNER_TIMEOUT,
        accelerator_probe: Callable[[], Awaitable[bool]] | None = None,
        runner_factory: Callable[[str], RunnerHandle] = RunnerProcess,
    ) -> None:
        """``runner_factory(label)`` makes the handle of a runner before it starts (tests use
        it to watch the processes a scheduler starts, or to give it fake runners)."""
        self.runner_factory = runner_factory
        self.max_loaded = max_loaded
        self.repack = repack  # for every runner: None lets each decide for its machine
        self.repack_fallback: str | None = None  # why repacking was turned off after a fault
        self.memory_limit = memory_limit  # bytes all runners together may use (None: the system's)
        self.default_keep_alive = default_keep_alive
        self.max_queue = max_queue
        self.num_parallel = num_parallel  # for specs that do not say (0: automatic)
        self.kv_cache_type = kv_cache_type  # every runner's target KV cache type
        self.flash_attention = flash_attention
        self.num_gpu = num_gpu  # for specs that do not say (-1: as many layers as fit)
        self.rpc_servers = list(rpc_servers)  # for specs that do not name their own
        self.runner_timeout = runner_timeout  # seconds of silence before a runner is killed
        # Whether llama.cpp sees a GPU here, asked once before the first load that needs it.
        self._accelerator_probe = accelerator_probe
        self._accelerator: bool | None = None if accelerator_probe is not None else False
        self.runners: dict[tuple[str, Any], Loaded] = {}
        self._load_lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self.waiting = 0
        self.loads_total = 0

    @contextlib.asynccontextmanager
    async def use(
        self, spec: LoadSpec, keep_alive: float | None, *, sequence: bool = True
    ) -> AsyncIterator[Loaded]:
        """Hold the runner for one request, and one of its sequences (waiting while all are
        busy) unless ``sequence`` is False (embeddings, which need none)."""
        if self.waiting >= self.max_queue:
            raise ServerBusyError(
                "server busy, please try again.  maximum pending requests exceeded"
            )
        self.waiting += 1
        try:
            loaded = await self._acquire(spec, keep_alive)
            if sequence:
                loaded = await self._take_sequence(loaded, spec, keep_alive)
        finally:
            self.waiting -= 1
        loaded.running += sequence
        try:
            yield loaded
        finally:
            if sequence:
                loaded.running -= 1
                loaded.slots.release()
            await self._release(loaded)

    async def _take_sequence(
        self, loaded: Loaded, spec: LoadSpec, keep_alive: float | None
    ) -> Loaded:
        """Wait for one of ``loaded``'s sequences; when the runner died meanwhile (a crash,
        killed for its silence), once more from a fresh runner."""
        for attempt in range(2):
            loaded.queued += 1
            try:
                await loaded.slots.acquire()
            except BaseException:
                await self._release(loaded)
                raise
            finally:
                loaded.queued -= 1
            if loaded.usable or attempt:
                return loaded
            log.info("the runner for %s ended while a request waited: starting another", spec.name)
            loaded.slots.release()
            await self._release(loaded)
            loaded = await self._acquire(spec, keep_alive)
        return loaded

    async def _acquire(self, spec: LoadSpec, keep_alive: float | None) -> Loaded:
        async with self._load_lock:
            loaded = await self._usable(spec)
            if loaded is None and spec.lean is not None:
                loaded = await self._usable(spec.lean)  # loaded earlier without its drafts
            if loaded is None:
                memory, sequences = self._needs(spec)
                # A model that may go to RPC workers or to named GPU layers is not planned
                # here: how much of it stays in this machine's memory is known only once
                # llama.cpp has placed it (then counted, see _load).
                here = MemoryEstimate() if await self._may_offload(spec) else memory
                try:
                    self._check_fits(here)  # refuse before unloading anything for it
                except InsufficientMemoryError:
                    if spec.lean is None:
                        raise
                    log.info("%s: %s", spec.name, spec.lean.note)
                    spec = spec.lean  # the draft models go first
                    memory, sequences = self._needs(spec)
                    here = memory
                    self._check_fits(here)
                await self._replace_same_model(spec)
                await self._make_room(spec.name, here)
                loaded = await self._load(spec, keep_alive, memory, sequences)
            elif keep_alive is not None:
                loaded.keep_alive = keep_alive
            loaded.active += 1
            loaded.last_used = time.monotonic()
            if loaded.timer is not None:
                loaded.timer.cancel()
                loaded.timer = None
            loaded.expires_at = FOREVER
            return loaded

    async def _usable(self, spec: LoadSpec) -> Loaded | None:
        """The runner loaded for ``spec``, if it can still serve (a dead one is dropped)."""
        loaded = self.runners.get(spec.key)
        if loaded is not None and not loaded.usable:
            if loaded.process.illegal_instruction and loaded.info.repack:
                self._repack_faulted(loaded.spec.name)
            await self._drop(loaded)
            return None
        return loaded

    async def _may_offload(self, spec: LoadSpec) -> bool:
        """Whether some of ``spec`` may go to RPC workers or a GPU (then how much stays in
        this machine's memory is known only once llama.cpp has placed it)."""
        num_gpu = self.num_gpu if spec.config.num_gpu is None else spec.config.num_gpu
        servers = self.rpc_servers if spec.config.rpc_servers is None else spec.config.rpc_servers
        if num_gpu == 0:
            return False
        if servers or num_gpu > 0:
            return True
        if self._accelerator is None and self._accelerator_probe is not None:
            self._accelerator = await self._accelerator_probe()
        return bool(self._accelerator)

    def _needs(self, spec: LoadSpec) -> tuple[MemoryEstimate, int]:
        """The memory ``spec`` needs and its number of sequences (automatic: 4 if that fits
        in what is free now, else 1)."""
        asked = spec.config.n_parallel or self.num_parallel
        if asked <= 0:
            free = self._free_memory()
            four = spec.memory.with_sequences(AUTO_PARALLEL, self.kv_cache_type)
            asked = AUTO_PARALLEL if free is None or four.total <= free else 1
        return spec.memory.with_sequences(asked, self.kv_cache_type), asked

    async def _load(
        self, spec: LoadSpec, keep_alive: float | None, memory: MemoryEstimate, sequences: int
    ) -> Loaded:
        given = spec.config
        config = given.with_(
            n_parallel=sequences,
            kv_cache_type=self.kv_cache_type,
            flash_attn=self.flash_attention,
            num_gpu=self.num_gpu if given.num_gpu is None else given.num_gpu,
            rpc_servers=self.rpc_servers if given.rpc_servers is None else given.rpc_servers,
            repack=given.repack if self.repack is None else self.repack,
        )
        process = self.runner_factory(spec.name)
        started = time.monotonic()
        try:
            info = await process.start(config, silence_limit=self.runner_timeout)
        except RunnerCrashedError:
            if not process.illegal_instruction or config.repack is False:
                raise
            self._repack_faulted(spec.name)
            process = self.runner_factory(spec.name)
            info = await process.start(
                config.with_(repack=False), silence_limit=self.runner_timeout
            )
        if self.repack is None:  # the first runner decided for this machine: tell the next ones
            self.repack = info.repack
        log.info("loaded %s in %.2f s (pid %s)", spec.name, time.monotonic() - started, process.pid)
        self.loads_total += 1
        loaded = Loaded(
            spec,
            process,
            self.default_keep_alive if keep_alive is None else keep_alive,
            info=info,
            memory=memory,
        )
        served = loaded.n_parallel  # the engine may serve fewer (a caller's drafter: one)
        kv_type = info.kv_cache_type or self.kv_cache_type  # auto: F16 on a GPU
        if served < sequences or kv_type != self.kv_cache_type:
            loaded.memory = spec.memory.with_sequences(served, kv_type)
        on_devices, placed = info.placement.size_device, info.placement.size
        if on_devices > 0 and placed > 0:  # only the part left in this machine's memory counts
            loaded.memory = loaded.memory.scaled(1.0 - on_devices / placed)
        loaded.slots = asyncio.Semaphore(served)
        self.runners[spec.key] = loaded
        return loaded

    def _repack_faulted(self, name: str) -> None:
        """A runner died of SIGILL with repacked weights: load without repacking from now on."""
        if self.repack is False:
            return
        self.repack = False
        self.repack_fallback = (
            f"the runner for {name} died of SIGILL with repacked weights (AMX or repacked "
            "kernels this CPU does not execute): models load without repacking from now on"
        )
        log.warning("%s", self.repack_fallback)

    async def _replace_same_model(self, spec: LoadSpec) -> None:
        """Different load options for the same weights: unload the old runner first."""
        for other in [r for r in self.runners.values() if r.spec.model_blob == spec.model_blob]:
            await self._wait_idle(other)
            await self._drop(other)

    async def _make_room(self, name: str, memory: MemoryEstimate) -> None:
        """Unload idle runners (least recently used first) until ``memory`` fits, and a runner
        more in count; wait for busy ones. Refuse at once what cannot fit even with all
        unloaded."""
        need = memory.total
        while True:
            self._check_fits(memory)
            free = self._free_memory()
            short = free is not None and need > free
            if len(self.runners) < self.max_loaded and not short:
                return
            idle = [r for r in self.runners.values() if r.active == 0]
            if idle:
                victim = min(idle, key=lambda r: r.last_used)
                if short:
                    log.info("unloading %s to make memory for %s", victim.spec.name, name)
                await self._drop(victim)
                continue
            async with self._changed:
                await self._changed.wait()

    def _check_fits(self, memory: MemoryEstimate) -> None:
        """Refuse a model that cannot fit even with every other runner unloaded."""
        need, free = memory.total, self._free_memory()
        if free is None or need <= free:
            return
        reclaimable = sum(r.memory.total for r in self.runners.values())
        if need > free + reclaimable:
            raise InsufficientMemoryError(
                f"model requires more system memory ({gib(need)}) than is available "
                f"({gib(free + reclaimable)})"
            )

    def _free_memory(self) -> int | None:
        """Memory a new runner may use: the configured limit less what loaded runners were
        estimated to need; or the system's available memory less the loaded runners' weights
        (mapped from their files, those pages count as available but are in use)."""
        loaded = self.runners.values()
        if self.memory_limit is not None:
            return self.memory_limit - sum(r.memory.total for r in loaded)
        available = available_bytes()
        if available is None:
            return None
        return available - sum(r.memory.weights for r in loaded)

    async def _wait_idle(self, loaded: Loaded) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: loaded.active == 0)

    async def _release(self, loaded: Loaded) -> None:
        loaded.active -= 1
        loaded.last_used = time.monotonic()
        if loaded.active == 0:
            if not loaded.usable or loaded.keep_alive <= 0:
                await self._drop(loaded)
            elif math.isfinite(loaded.keep_alive):
                loaded.expires_at = time.time() + loaded.keep_alive
                loop = asyncio.get_running_loop()
                loaded.timer = loop.call_later(
                    loaded.keep_alive, lambda: asyncio.ensure_future(self._expire(loaded))
                )
        async with self._changed:
            self._changed.notify_all()

    async def _expire(self, loaded: Loaded) -> None:
        if loaded.active == 0 and self.runners.get(loaded.spec.key) is loaded:
            log.info("keep_alive expired: unloading %s", loaded.spec.name)
            await self._drop(loaded)

    async def _drop(self, loaded: Loaded) -> None:
        if self.runners.get(loaded.spec.key) is loaded:
            del self.runners[loaded.spec.key]
        if loaded.timer is not None:
            loaded.timer.cancel()
        await loaded.process.close()
        async with self._changed:
            self._changed.notify_all()

    async def unload(self, model_blob: str) -> bool:
        """Unload every runner of these weights once idle (keep_alive 0 with no prompt)."""
        found = False
        for loaded in [r for r in self.runners.values() if r.spec.model_blob == model_blob]:
            found = True
            if loaded.active == 0:
                await self._drop(loaded)
            else:
                loaded.keep_alive = 0
        return found

    def snapshot(self) -> list[Loaded]:
        return sorted(self.runners.values(), key=lambda r: -r.expires_at)

    async def close(self) -> None:
        for loaded in list(self.runners.values()):
            await self._drop(loaded)
