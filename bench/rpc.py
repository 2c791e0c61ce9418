"""What splitting a model across ggml RPC workers costs, measured on loopback, side by side.

Two workers (``modelhub rpc-worker``) start on loopback ports of this machine; the same GGUF is
loaded three ways in one process and timed interleaved on the same prompt: on the CPU alone,
with every layer on one worker (``tensor_split`` 1,0), and split across both. On loopback the
network costs nothing but its round trips and copies, so the ratios are the protocol's floor:
every decode step sends the activations to each worker in turn and waits for them. A fourth
row drafts with n-grams on the split model (a copy task): verification batches pay one round
trip for several tokens, so drafting helps more over RPC than locally. Needs llama-cpp-python
built with ``-DGGML_RPC=on``. Usage::

    python bench/rpc.py [--tokens 96] [--runs 3] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.openmp import steady_wait  # noqa: E402

steady_wait()  # before llama.cpp loads: this process holds several engines

from devtools import realmodels  # noqa: E402
from devtools.daemons import free_port  # noqa: E402
from modelhub.engine.devices import rpc_supported  # noqa: E402
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions  # noqa: E402

COPY = (
    "<|im_start|>user\nRepeat this list exactly, twice: apples, pears, plums, cherries, "
    "figs, dates, limes, lemons, melons, grapes.<|im_end|>\n<|im_start|>assistant\n"
)
STORY = "<|im_start|>user\nRun {run}. Tell a short story about a lighthouse.<|im_end|>\n"
STORY += "<|im_start|>assistant\n"
NOTES = "The lighthouse keeper logs the weather, trims the wick, and writes to his sister. " * 16
LONG = "<|im_start|>user\nRun {run}. Summarise these notes.\n\n" + NOTES + "<|im_end|>\n"
LONG += "<|im_start|>assistant\n"


def start_worker(threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "modelhub.engine.rpc_worker", "--host", endpoint]
    proc = subprocess.Popen(
        [*cmd, "--threads", str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(300):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, endpoint
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the RPC worker on {endpoint} did not start")


def prefill_rate(engine: Engine, text: str) -> float:
    """Prompt tokens per second of wall time to the first token. (llama.cpp's RPC backend
    computes asynchronously: a prompt's decode returns before the workers are done, so the
    prompt timing alone would look faster than it is.)"""
    tokens = engine.tokenize(text)
    started = time.perf_counter()
    engine.generate(tokens, GenerateOptions(num_predict=1, temperature=0))
    return len(tokens) / (time.perf_counter() - started)


def rates(engine: Engine, text: str, n: int, drafts: int = 0) -> tuple[float, Any]:
    """Decode tokens per second (each step reads its logits back: synchronous) and the result."""
    r = engine.generate(
        engine.tokenize(text),
        GenerateOptions(num_predict=n, temperature=0, draft_num_predict=drafts),
    )
    return r.eval_count / (r.eval_duration_ns / 1e9), r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not rpc_supported():
        raise SystemExit("llama-cpp-python was built without RPC (CMAKE_ARGS=-DGGML_RPC=on)")
    model = realmodels.smollm2_q4_1()
    workers = [start_worker(args.threads) for _ in range(2)]
    servers = [endpoint for _, endpoint in workers]
    base: dict[str, Any] = {"n_ctx": 1024, "n_threads": args.threads}
    started = time.time()
    try:
        engines = {
            "CPU alone": Engine(EngineConfig(model, num_gpu=0, **base)),
            "1 worker": Engine(
                EngineConfig(model, rpc_servers=servers, tensor_split=[1, 0], **base)
            ),
            "2 workers": Engine(EngineConfig(model, rpc_servers=servers, **base)),
        }
        spec: dict[str, Any] = {"draft_kind": "ngram", "draft_num_predict": 16, **base}
        ngram = Engine(EngineConfig(model, rpc_servers=servers, **spec))
        local_ngram = Engine(EngineConfig(model, num_gpu=0, **spec))
        measured: dict[str, dict[str, list[float]]] = {k: {"p": [], "d": []} for k in engines}
        copy: dict[str, list[float]] = {
            "local": [],
            "local ngram": [],
            "split": [],
            "split ngram": [],
        }
        outputs: dict[str, list[int]] = {}
        accepted = drafted = 0
        for engine in [*engines.values(), ngram, local_ngram]:  # first decodes allocate
            rates(engine, LONG.format(run="warm-up"), 4)
        for run in range(args.runs):
            for name, engine in engines.items():
                measured[name]["p"].append(prefill_rate(engine, LONG.format(run=run)))
                decode, r = rates(engine, STORY.format(run=run), args.tokens)
                measured[name]["d"].append(decode)
                outputs[name] = r.tokens
            copy["local"].append(rates(engines["CPU alone"], COPY, args.tokens)[0])
            copy["local ngram"].append(rates(local_ngram, COPY, args.tokens, drafts=16)[0])
            copy["split"].append(rates(engines["2 workers"], COPY, args.tokens)[0])
            decode, r = rates(ngram, COPY, args.tokens, drafts=16)
            copy["split ngram"].append(decode)
            accepted, drafted = r.draft_accepted_count, r.draft_count
        layout = {name: e.placement.as_json() for name, e in engines.items()}
        for engine in [*engines.values(), ngram, local_ngram]:
            engine.close()
    finally:
        for proc, _ in workers:
            proc.kill()
    local = {k: statistics.median(v) for k, v in measured["CPU alone"].items()}
    print(
        f"{platform.machine()}, SmolLM2-135M Q4_1, {args.threads} threads (runner and each "
        f"worker), {args.tokens} tokens, median of {args.runs} interleaved runs, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    print("prefill: a ~300-token prompt, to the first token; decode: tokens after it")
    print(f"{'layout':16} {'prefill tok/s':>14} {'ratio':>6} {'decode tok/s':>13} {'ratio':>6}")
    rows = []
    for name, m in measured.items():
        p, d = statistics.median(m["p"]), statistics.median(m["d"])
        rows.append({"layout": name, "prefill": round(p, 1), "decode": round(d, 1)})
        rows[-1]["prefill_ratio"] = round(p / local["p"], 3)
        rows[-1]["decode_ratio"] = round(d / local["d"], 3)
        print(f"{name:16} {p:>14.1f} {p / local['p']:>6.2f} {d:>13.1f} {d / local['d']:>6.2f}")
    same = all(out == outputs["CPU alone"] for out in outputs.values())
    local_plain, local_drafted, plain, drafted_rate = (statistics.median(v) for v in copy.values())
    print(f"greedy output identical in every layout: {same}")
    print(
        f"copy task, DRAFT ngram: CPU alone {local_plain:.1f} -> {local_drafted:.1f} tok/s "
        f"({local_drafted / local_plain:.2f}x); 2 workers {plain:.1f} -> {drafted_rate:.1f} "
        f"tok/s ({drafted_rate / plain:.2f}x; {accepted}/{drafted} drafts accepted)"
    )
    print(f"({time.time() - started:.0f} s)")
    if args.json:
        result = {"rows": rows, "identical": same, "layout": layout}
        result["copy"] = {k: statistics.median(v) for k, v in copy.items()}
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
