"""Serving overhead: our daemon vs the engine called in-process vs llama.cpp's llama-server.

    python bench/serving.py [--model smollm2-q4_1|smollm2-q8_0|PATH ...] [--threads 2]
                            [--num-ctx 2048] [--num-predict 128] [--repeats 5] [--prompts 3]
                            [--llama-server PATH] [--candidate PYTHONPATH] [--out results.json]
                            [--concurrency [--clients 1,2,4,8] [--per-client 2]] [--agent]

One run, one GGUF at a time, the same thread count, context size, prompts and greedy decoding
with a fixed ``num_predict`` for every configuration:

* ``in-process``: ``Engine`` in this process; the clock starts before tokenisation.
* ``daemon``: ``modelhub serve`` on a free loopback port with a temporary store; the model is
  created through the HTTP API (blob upload + ``/api/create``) and asked through streaming
  ``/api/generate`` with ``raw: true``; the clock starts when the request is sent.
* ``llama-server`` (with ``--llama-server``): the same GGUF with ``-fa on``, one slot, asked
  through streaming ``/completion`` with ``cache_prompt: false``.
* ``candidate`` (with ``--candidate``): a second daemon whose PYTHONPATH is the given one (a
  patched copy of modelhub, extra packages), to measure a serving change against ``daemon``.

Each configuration answers one warm-up request first; then the configurations take turns, prompt
by prompt, for ``--repeats`` rounds, so slow drift of the machine hits all of them alike. Every
request yields: TTFT (start -> first streamed piece of text), streamed tok/s (pieces after the
first / time from the first to the last, as a client sees them) and the tok/s the server itself
reports (``eval_count/eval_duration``, llama-server's ``predicted_per_second``). A figure is the
median over rounds per prompt, averaged over prompts; a ratio or TTFT difference is the median
over pairs of requests asked back to back (same round, same prompt). For each daemon the bench
also reads the CPU time the daemon process, the runner process and this client spent per
generated token.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
# Every configuration runs with the user's OpenMP wait policy, or libgomp's own (modelhub's
# default since it stopped forcing PASSIVE; see modelhub/engine/__init__.py).
USER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")

# Distinct first words: consecutive requests share only the chat-template prefix, so the engine's
# prompt cache (in-process and daemon alike) reuses a handful of tokens, never a whole prompt.
PROMPTS = (
    "Explain in detail how a refrigerator keeps food cold, step by step, for a curious child.",
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Describe the history of the printing press and how it changed Europe.",
)
# Warms every configuration up; unlike any measured prompt, so no measured request finds its
# prompt already in the cache.
WARMUP = "Name three colours."
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
SHORTCUTS = ("smollm2-q4_1", "smollm2-q8_0")
GOAL_VS_IN_PROCESS = 0.95
GOAL_VS_LLAMA_SERVER = 0.90
GOAL_TTFT_OVERHEAD_MS = 15.0
QUIET_CORES = 0.1  # more CPU than this used by others during a run makes its figures doubtful


@dataclass
class Sample:
    """One measured request."""

    prompt: int
    ttft_ms: float
    stream_tok_s: float
    eval_tok_s: float
    pieces: int
    eval_count: int
    prompt_eval_count: int  # prompt tokens evaluated (a prefix found in the cache is not)
    text: str


@dataclass
class Settings:
    threads: int
    num_ctx: int
    num_predict: int
    parallel: int = 4  # sequences per model, in-process and in the daemon (its default)


class Target(Protocol):
    name: str

    def ask(self, prompt: str, index: int) -> Sample: ...


def _now() -> int:
    return time.perf_counter_ns()


def _stream_rate(stamps: list[int]) -> float:
    """Pieces after the first per second between the first and the last piece."""
    if len(stamps) < 2 or stamps[-1] == stamps[0]:
        return 0.0
    return (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1e9)


def _ttft_ms(start: int, stamps: list[int]) -> float:
    return (stamps[0] - start) / 1e6 if stamps else float("nan")


# ---- in-process ------------------------------------------------------------------------------


class InProcess:
    name = "in-process"

    def __init__(self, model: Path, settings: Settings) -> None:
        from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions

        self.engine = Engine(
            EngineConfig(
                model_path=model,
                n_ctx=settings.num_ctx,
                n_threads=settings.threads,
                n_parallel=settings.parallel,
            )
        )
        self.options = GenerateOptions(num_predict=settings.num_predict, temperature=0.0)

    def ask(self, prompt: str, index: int) -> Sample:
        from modelhub.engine.generate import TokenEvent

        stamps: list[int] = []

        def on_token(event: TokenEvent) -> None:
            if event.text:  # the runner streams only events that carry text; count alike
                stamps.append(_now())

        start = _now()
        tokens = self.engine.tokenize(prompt)
        result = self.engine.generate(tokens, self.options, on_token=on_token)
        return Sample(
            prompt=index,
            ttft_ms=_ttft_ms(start, stamps),
            stream_tok_s=_stream_rate(stamps),
            eval_tok_s=result.eval_count / (result.eval_duration_ns / 1e9),
            pieces=len(stamps),
            eval_count=result.eval_count,
            prompt_eval_count=result.prompt_eval_count,
            text=result.text,
        )

    def close(self) -> None:
        self.engine.close()


# ---- daemon ----------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """A process's children, whichever of its threads started them (the daemon starts its
    runners from a worker thread: the main thread's ``children`` does not list them)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return found


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class DaemonTarget:
    model_name = "bench-serving"

    def __init__(
        self,
        model: Path,
        settings: Settings,
        workdir: Path,
        *,
        name: str = "daemon",
        pythonpath: str | None = None,
    ) -> None:
        """Start ``modelhub serve``; ``pythonpath`` runs it (and its runners) from other code."""
        from devtools.daemons import start_daemon

        self.name = name
        self.settings = settings
        env = {
            "MODELHUB_KEEP_ALIVE": "-1",
            "MODELHUB_NUM_THREADS": str(settings.threads),
            "MODELHUB_NUM_PARALLEL": str(settings.parallel),
        }
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        workdir.mkdir(parents=True, exist_ok=True)
        self.daemon = start_daemon(workdir / "models", workdir / "daemon.log", env)
        self.client = httpx.Client(base_url=self.daemon.url, timeout=600)
        self.cpu = {"daemon": 0.0, "runner": 0.0, "client": 0.0}
        self.tokens = 0
        try:
            self._create(model)
        except BaseException:
            self.close()
            raise

    def _create(self, model: Path) -> None:
        from modelhub.store import sha256_file

        digest, _ = sha256_file(model)
        with model.open("rb") as body:
            r = self.client.post(f"/api/blobs/{digest}", content=body)
        if r.status_code not in (200, 201):
            raise RuntimeError(f"blob upload failed ({r.status_code}): {r.text}")
        r = self.client.post(
            "/api/create",
            json={"model": self.model_name, "files": {model.name: digest}, "stream": False},
        )
        if r.status_code != 200:
            raise RuntimeError(f"/api/create failed ({r.status_code}): {r.text}")

    def _pids(self) -> tuple[int, list[int]]:
        pid = self.daemon.proc.pid
        return pid, _children(pid)

    def ask(self, prompt: str, index: int) -> Sample:
        body = {
            "model": self.model_name,
            "prompt": prompt,
            "raw": True,
            "stream": True,
            "keep_alive": -1,
            "options": {
                "temperature": 0,
                "num_predict": self.settings.num_predict,
                "num_ctx": self.settings.num_ctx,
                "num_thread": self.settings.threads,
            },
        }
        daemon_pid, runners = self._pids()
        cpu_before = (_cpu_seconds(daemon_pid), sum(map(_cpu_seconds, runners)), _self_cpu())
        stamps: list[int] = []
        pieces: list[str] = []
        final: dict[str, Any] = {}
        start = _now()
        with self.client.stream("POST", "/api/generate", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise RuntimeError(f"/api/generate failed ({r.status_code}): {r.text}")
            for line in r.iter_lines():
                if not line:
                    continue
                obj = json.loads(line)
                if "error" in obj:
                    raise RuntimeError(f"/api/generate streamed an error: {obj['error']}")
                if obj.get("done"):
                    final = obj
                elif obj.get("response"):
                    stamps.append(_now())
                    pieces.append(obj["response"])
        daemon_pid, runners_after = self._pids()
        runners = sorted(set(runners) | set(runners_after))
        self.cpu["daemon"] += _cpu_seconds(daemon_pid) - cpu_before[0]
        self.cpu["runner"] += sum(map(_cpu_seconds, runners)) - cpu_before[1]
        self.cpu["client"] += _self_cpu() - cpu_before[2]
        eval_count = int(final.get("eval_count", 0))
        self.tokens += eval_count
        eval_ns = int(final.get("eval_duration", 0))
        return Sample(
            prompt=index,
            ttft_ms=_ttft_ms(start, stamps),
            stream_tok_s=_stream_rate(stamps),
            eval_tok_s=eval_count / (eval_ns / 1e9) if eval_ns else 0.0,
            pieces=len(stamps),
            eval_count=eval_count,
            prompt_eval_count=int(final.get("prompt_eval_count", 0)),
            text="".join(pieces),
        )

    def reset_cpu(self) -> None:
        self.cpu = dict.fromkeys(self.cpu, 0.0)
        self.tokens = 0

    def cpu_per_token_ms(self) -> dict[str, float]:
        return {k: 1000 * v / max(self.tokens, 1) for k, v in self.cpu.items()}

    def close(self) -> None:
        self.client.close()
        self.daemon.stop()


# ---- llama-server ----------------------------------------------------------------------------


def _free_port() -> int:
    from devtools.daemons import free_port

    return free_port()


class LlamaServer:
    name = "llama-server"

    def __init__(
        self,
        binary: Path,
        model: Path,
        settings: Settings,
        log: Path,
        *,
        slots: int = 1,
        extra: tuple[str, ...] = (),
    ) -> None:
        """``slots`` parallel sequences of ``num_ctx`` each; ``extra`` arguments (drafting)."""
        self.settings = settings
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        threads = str(settings.threads)
        cmd = [
            str(binary),
            *("-m", str(model)),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("-t", threads, "-tb", threads),
            *("-c", str(settings.num_ctx * slots), "-b", "512", "-ub", "512", "-np", str(slots)),
            *("-fa", "on", "--no-webui", "-cram", "0"),
            # The KV cache modelhub uses by default (MODELHUB_KV_CACHE_TYPE=auto).
            *("--cache-type-k", "q8_0", "--cache-type-v", "f16"),
            *extra,
        ]
        self.log = log
        env = dict(os.environ)
        env.pop("OMP_WAIT_POLICY", None)
        if USER_OMP_WAIT_POLICY is not None:
            env["OMP_WAIT_POLICY"] = USER_OMP_WAIT_POLICY
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}):\n{tail}")
            try:
                if self.client.get("/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("llama-server did not become ready in 120 s")

    def ask(self, prompt: str, index: int) -> Sample:
        body = {
            "prompt": prompt,
            "n_predict": self.settings.num_predict,
            "stream": True,
            "cache_prompt": False,
            "temperature": 0,
        }
        stamps: list[int] = []
        pieces: list[str] = []
        timings: dict[str, Any] = {}
        start = _now()
        with self.client.stream("POST", "/completion", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise RuntimeError(f"llama-server /completion failed ({r.status_code}): {r.text}")
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                obj = json.loads(line[len("data: ") :])
                if obj.get("content"):
                    stamps.append(_now())
                    pieces.append(obj["content"])
                if obj.get("stop"):
                    timings = obj.get("timings") or {}
        return Sample(
            prompt=index,
            ttft_ms=_ttft_ms(start, stamps),
            stream_tok_s=_stream_rate(stamps),
            eval_tok_s=float(timings.get("predicted_per_second") or 0.0),
            pieces=len(stamps),
            eval_count=int(timings.get("predicted_n") or 0),
            prompt_eval_count=int(timings.get("prompt_n") or 0),
            text="".join(pieces),
        )

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# ---- measuring and reporting -----------------------------------------------------------------


def resolve_model(spec: str) -> Path:
    """A GGUF path, or one of SHORTCUTS (the cached test models, fetched on first use)."""
    if spec in SHORTCUTS:
        from devtools.realmodels import smollm2_q4_1, smollm2_q8_0

        return smollm2_q4_1() if spec == "smollm2-q4_1" else smollm2_q8_0()
    path = Path(spec)
    if not path.is_file():
        raise SystemExit(f"error: --model {spec}: no such file (or use one of {SHORTCUTS})")
    return path


def summarise(samples: list[Sample], n_prompts: int) -> dict[str, float]:
    """Median over rounds for each prompt, then the mean over prompts."""

    def figure(get: Callable[[Sample], float]) -> float:
        per_prompt = [
            statistics.median(get(s) for s in samples if s.prompt == p) for p in range(n_prompts)
        ]
        return statistics.fmean(per_prompt)

    return {
        "tok_s": figure(lambda s: s.stream_tok_s),
        "eval_tok_s": figure(lambda s: s.eval_tok_s),
        "ttft_ms": figure(lambda s: s.ttft_ms),
        "eval_count": figure(lambda s: s.eval_count),
        "prompt_eval_count": figure(lambda s: s.prompt_eval_count),
    }


def paired(mine: list[Sample], base: list[Sample]) -> dict[str, float]:
    """Medians over pairs of requests asked back to back (same round, same prompt): drift of a
    shared machine between rounds cancels out of these, unlike out of ratios of averages."""
    pairs = list(zip(mine, base, strict=True))
    return {
        "tok_s_ratio": statistics.median(m.stream_tok_s / b.stream_tok_s for m, b in pairs),
        "ttft_diff_ms": statistics.median(m.ttft_ms - b.ttft_ms for m, b in pairs),
    }


def _goal(value: float | None, goal: float, at_least: bool) -> dict[str, Any]:
    met = None if value is None else (value >= goal if at_least else value < goal)
    return {"value": value, "goal": (">= " if at_least else "< ") + str(goal), "met": met}


def bench_model(model: Path, settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    import concurrency as conc

    prompts = [CHATML.format(p) for p in PROMPTS[: args.prompts]]
    # The directory is left last: daemons write their drafting state into it as they stop.
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        print(f"\n== {model.name}: starting every configuration ...", flush=True)
        inproc = InProcess(model, settings)
        stack.callback(inproc.close)
        daemons = [DaemonTarget(model, settings, work / "daemon")]
        stack.callback(daemons[0].close)
        if args.candidate is not None:
            candidate = DaemonTarget(
                model, settings, work / "candidate", name="candidate", pythonpath=args.candidate
            )
            stack.callback(candidate.close)
            daemons.append(candidate)
        targets: list[Target] = [inproc, *daemons]
        if args.llama_server is not None:
            server = LlamaServer(args.llama_server, model, settings, work / "llama-server.log")
            stack.callback(server.close)
            targets.append(server)
        for target in targets:  # warm-up: loads the runner, allocates buffers
            target.ask(CHATML.format(WARMUP), -1)
        for daemon in daemons:
            daemon.reset_cpu()
        samples: dict[str, list[Sample]] = {t.name: [] for t in targets}
        other = conc.OtherLoad()
        for round_ in range(args.repeats):
            for index, prompt in enumerate(prompts):
                for target in targets:
                    samples[target.name].append(target.ask(prompt, index))
            print(f"   round {round_ + 1}/{args.repeats} done", flush=True)
        cpu = {d.name: d.cpu_per_token_ms() for d in daemons}
        other_cores = other.cores()
    result = report(model, samples, len(prompts), cpu)
    result["other_processes_cores"] = other_cores
    return result


def bench_concurrency(model: Path, settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    """The concurrency section (bench/concurrency.py): daemons with 4 and 1 sequences, and
    llama-server with 4 slots, plain and with n-gram drafting."""
    import concurrency as conc

    prompts = conc.prose_prompts(CHATML)
    options = {"num_ctx": settings.num_ctx, "num_thread": settings.threads}
    # The directory is left last: daemons write their drafting state into it as they stop.
    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        print(f"\n== {model.name}: concurrency ...", flush=True)
        servers, daemons = [], {}
        for n in (4, 1):
            d = DaemonTarget(model, replace(settings, parallel=n), work / f"np{n}")
            stack.callback(d.close)
            daemons[n] = d
            ask = conc.daemon_ask(d.daemon.url, d.model_name, settings.num_predict, options)
            servers.append(conc.Server(f"daemon np={n}", ask))
        # Drafting is on by default (DRAFT auto); the same daemon with it off, per request.
        d4 = daemons[4]
        off = {**options, "draft": "off"}
        ask = conc.daemon_ask(d4.daemon.url, d4.model_name, settings.num_predict, off)
        servers.insert(1, conc.Server("daemon np=4 draft off", ask))
        if args.llama_server is not None:
            server = LlamaServer(args.llama_server, model, settings, work / "ls4.log", slots=4)
            stack.callback(server.close)
            ask = conc.llama_server_ask(server.url, settings.num_predict)
            servers.append(conc.Server("llama-server np=4", ask))
        try:
            section = conc.run_section(
                servers, prompts, args.clients, args.per_client, args.ttft_trials, args.ttft_settle
            )
        except Exception:
            for log in work.glob("*.log"):
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}")
            raise
        # n-gram drafting at 4 clients on the edit prompt (its best case): n-gram alone, asked
        # per request of the same model, so that no cell reloads the runner (a second model on
        # the same weights would replace it inside a timed cell).
        ngram = {**options, "draft": "ngram"}
        drafting = [
            conc.Server(
                "daemon np=4 DRAFT ngram",
                conc.daemon_ask(d4.daemon.url, d4.model_name, settings.num_predict, ngram),
            )
        ]
        if args.llama_server is not None:
            server = LlamaServer(
                args.llama_server,
                model,
                settings,
                work / "ls4-ngram.log",
                slots=4,
                extra=("--spec-type", "ngram-mod"),
            )
            stack.callback(server.close)
            drafting.append(
                conc.Server(
                    "llama-server np=4 ngram-mod",
                    conc.llama_server_ask(server.url, settings.num_predict),
                )
            )
        edit = conc.edit_prompt()
        for s in servers[:2]:  # auto and off on the edit prompt, at every client count
            s.ask(edit)
            section["aggregate"][f"{s.name}, edit"] = {
                str(n): conc.aggregate(s.ask, [edit], n, args.per_client) for n in args.clients
            }
            print(f"   {s.name}: edit prompt done", flush=True)
        for s in drafting:
            s.ask(edit)
            section["aggregate"][s.name] = {"4": conc.aggregate(s.ask, [edit], 4, args.per_client)}
            print(f"   {s.name}: 4 clients done", flush=True)
        # Where n-grams rarely help (prose requests no run has asked yet, drafting off first:
        # it adds nothing to the n-gram pool): drafting must not cost the batch.
        first = sum(args.clients) * args.per_client
        for s in (servers[1], drafting[0]):
            prose = conc.aggregate(s.ask, prompts, 4, args.per_client, first)
            section["aggregate"][f"{s.name}, fresh prose"] = {"4": prose}
    section["goals"] = conc.ratios(section)
    section["model"] = model.name
    return section


def bench_agent(model: Path, settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    """The coding-agent section (bench/agent.py) on a daemon of its own."""
    import agent

    return agent.run(model, settings, args.repeats)


def report(
    model: Path,
    samples: dict[str, list[Sample]],
    n_prompts: int,
    cpu: dict[str, dict[str, float]],
) -> dict[str, Any]:
    reference = {s.prompt: s.text for s in samples["in-process"]}
    summary: dict[str, dict[str, Any]] = {
        name: {
            **summarise(s, n_prompts),
            "vs_in_process": paired(s, samples["in-process"]),
            "same_text_as_in_process": all(x.text == reference[x.prompt] for x in s),
        }
        for name, s in samples.items()
    }
    vs_base = paired(samples["daemon"], samples["in-process"])
    llama = samples.get("llama-server")
    ratios = {
        "daemon_vs_in_process_tok_s": vs_base["tok_s_ratio"],
        "daemon_vs_llama_server_tok_s": (
            paired(samples["daemon"], llama)["tok_s_ratio"] if llama else None
        ),
        "daemon_ttft_overhead_ms": vs_base["ttft_diff_ms"],
    }
    goals = {
        "daemon_tok_s_vs_in_process": _goal(
            ratios["daemon_vs_in_process_tok_s"], GOAL_VS_IN_PROCESS, True
        ),
        "daemon_tok_s_vs_llama_server": _goal(
            ratios["daemon_vs_llama_server_tok_s"], GOAL_VS_LLAMA_SERVER, True
        ),
        "daemon_ttft_overhead_ms": _goal(
            ratios["daemon_ttft_overhead_ms"], GOAL_TTFT_OVERHEAD_MS, False
        ),
    }
    result = {
        "model": model.name,
        "model_bytes": model.stat().st_size,
        "configs": summary,
        "ratios": ratios,
        "goals": goals,
        "cpu_ms_per_token": cpu,
        "samples": {name: [asdict(x) | {"text": None} for x in s] for name, s in samples.items()},
    }
    if "candidate" in samples:
        result["candidate_vs_daemon"] = paired(samples["candidate"], samples["daemon"])
    return result


def print_table(result: dict[str, Any]) -> None:
    configs = result["configs"]
    print(f"\n{result['model']}")
    header = f"{'config':<14}{'tok/s':>9}{'eval tok/s':>12}{'TTFT ms':>10}{'x in-proc':>11}"
    print(header + f"{'TTFT +ms':>10}{'same text':>11}")
    for name, c in configs.items():
        print(
            f"{name:<14}{c['tok_s']:>9.1f}{c['eval_tok_s']:>12.1f}{c['ttft_ms']:>10.1f}"
            f"{c['vs_in_process']['tok_s_ratio']:>11.3f}"
            f"{c['vs_in_process']['ttft_diff_ms']:>+10.1f}"
            f"{'yes' if c['same_text_as_in_process'] else 'NO':>11}"
        )
    labels = {
        "daemon_tok_s_vs_in_process": "daemon tok/s vs in-process",
        "daemon_tok_s_vs_llama_server": "daemon tok/s vs llama-server",
        "daemon_ttft_overhead_ms": "daemon TTFT overhead (ms)",
    }
    for key, goal in result["goals"].items():
        if goal["value"] is None:
            verdict, value = "not measured (no --llama-server)", "-"
        else:
            verdict, value = ("met" if goal["met"] else "MISSED"), f"{goal['value']:.3f}"
        print(f"  goal {labels[key]:<30} {goal['goal']:>7}: {value:>8}  {verdict}")
    if "candidate_vs_daemon" in result:
        cand = result["candidate_vs_daemon"]
        print(
            f"  candidate vs daemon: tok/s x{cand['tok_s_ratio']:.3f}, "
            f"TTFT {cand['ttft_diff_ms']:+.1f} ms"
        )
    other = result["other_processes_cores"]
    warning = "  (figures disturbed: rerun on a quiet machine)" if other > QUIET_CORES else ""
    print(f"  other processes kept {other:.2f} cores busy while this measured{warning}")
    for name, cpu in result["cpu_ms_per_token"].items():
        print(
            f"  CPU ms per generated token, {name}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        )


def conditions(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    cpu_model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        **asdict(settings),
        "repeats": args.repeats,
        "prompts": [CHATML.format(p) for p in PROMPTS[: args.prompts]],
        "decoding": "greedy (temperature 0)",
        "cpu": cpu_model,
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "omp_wait_policy": {
            "engine": USER_OMP_WAIT_POLICY or "libgomp's default (spin, then sleep)",
            "llama_server": USER_OMP_WAIT_POLICY or "libgomp's default (spin, then sleep)",
        },
        "llama_server": str(args.llama_server) if args.llama_server else None,
        "candidate_pythonpath": args.candidate,
        "goals": {
            "daemon_tok_s_vs_in_process": GOAL_VS_IN_PROCESS,
            "daemon_tok_s_vs_llama_server": GOAL_VS_LLAMA_SERVER,
            "daemon_ttft_overhead_ms": GOAL_TTFT_OVERHEAD_MS,
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument(
        "--model",
        action="append",
        help=f"GGUF path or one of {', '.join(SHORTCUTS)} (repeatable; default smollm2-q4_1)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-ctx", type=int, default=2048)
    parser.add_argument("--num-predict", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), choices=[2, 3])
    parser.add_argument("--llama-server", type=Path, help="path of a llama.cpp llama-server")
    parser.add_argument(
        "--candidate",
        metavar="PYTHONPATH",
        help="also run a second daemon with this PYTHONPATH (a patched copy of modelhub, extra "
        "packages) and measure it as 'candidate' beside 'daemon'",
    )
    parser.add_argument(
        "--concurrency",
        action="store_true",
        help="also run the concurrency section (bench/concurrency.py) on the first model",
    )
    parser.add_argument(
        "--clients",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 2, 4, 8],
        help="client counts of the concurrency section (default 1,2,4,8)",
    )
    parser.add_argument("--per-client", type=int, default=2, help="requests per client")
    parser.add_argument(
        "--agent",
        action="store_true",
        help="also run the coding-agent flow (/v1/messages, /v1/responses; bench/agent.py)",
    )
    parser.add_argument("--ttft-trials", type=int, default=10)
    parser.add_argument(
        "--ttft-settle",
        type=float,
        default=2.0,
        help="seconds the long requests run before the first TTFT trial (default 2)",
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    for name in ("threads", "num_ctx", "num_predict", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.num_predict < 2:
        parser.error("--num-predict must be at least 2 (a rate needs two tokens)")
    if args.llama_server is not None and not os.access(args.llama_server, os.X_OK):
        parser.error(f"--llama-server {args.llama_server}: not an executable file")
    return args


def _models(args: argparse.Namespace) -> Iterator[Path]:
    for spec in args.model or ["smollm2-q4_1"]:
        yield resolve_model(spec)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the daemon, llama-server and temp store are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # First import of llama.cpp in this process: through the engine, so its process-wide
    # settings (OpenMP wait policy) hold for the in-process engine as they do in a runner.
    import modelhub.engine.llama  # noqa: F401

    settings = Settings(args.threads, args.num_ctx, args.num_predict)
    results: dict[str, Any] = {"conditions": conditions(args, settings), "models": []}
    models = list(_models(args))
    for model in models:
        result = bench_model(model, settings, args)
        results["models"].append(result)
        print_table(result)
    if args.concurrency:
        import concurrency as conc

        results["concurrency"] = bench_concurrency(models[0], settings, args)
        conc.print_section(results["concurrency"])
    if args.agent:
        results["agent"] = bench_agent(models[0], settings, args)
    results["conditions"]["load_average_after"] = os.getloadavg()
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
