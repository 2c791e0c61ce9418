"""What the SIGILL fallback costs: weights repacked (ggml's default) vs not, side by side.

On a CPU where both work, each model is loaded twice (``EngineConfig.repack`` True / False) and
the two are timed interleaved on the same prompt: prefill tokens/s (a ~300-token prompt) and
decode tokens/s (greedy, ``--tokens``). It also checks what losslessness needs under the
fallback: that drafting with the Q4_1 draft is token-identical to plain decoding with repacking
off (verification batches vs one-token decodes on the unrepacked kernels). Usage::

    python bench/repack.py [--tokens 128] [--runs 3] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.openmp import steady_wait  # noqa: E402

steady_wait()  # before llama.cpp loads: this process holds several engines

from devtools import realmodels  # noqa: E402
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions  # noqa: E402

NOTES = "The lighthouse keeper logs the weather, trims the wick, and writes to his sister. " * 16


def prompt(run: int) -> str:
    """A ~300-token chat prompt; ``run`` changes its opening so no prompt cache is reused."""
    return (
        f"<|im_start|>user\nNote set {run}. Summarise these notes in five bullet points.\n\n"
        f"{NOTES}<|im_end|>\n<|im_start|>assistant\n"
    )


def measure(engine: Engine, tokens: list[int], n: int) -> tuple[float, float, list[int]]:
    """(prefill tok/s, decode tok/s, output) for one request."""
    r = engine.generate(tokens, GenerateOptions(num_predict=n, temperature=0))
    prefill = r.prompt_eval_count / (r.prompt_eval_duration_ns / 1e9)
    decode = r.eval_count / (r.eval_duration_ns / 1e9)
    return prefill, decode, r.tokens


def bench_model(name: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    engines = {
        flag: Engine(EngineConfig(path, n_ctx=2048, n_threads=args.threads, repack=flag))
        for flag in (True, False)
    }
    try:
        rates: dict[bool, dict[str, list[float]]] = {
            f: {"prefill": [], "decode": []} for f in engines
        }
        outputs: dict[bool, list[int]] = {}
        for run in range(args.runs):
            tokens = engines[True].tokenize(prompt(run))
            for flag, engine in engines.items():
                prefill, decode, out = measure(engine, tokens, args.tokens)
                rates[flag]["prefill"].append(prefill)
                rates[flag]["decode"].append(decode)
                outputs[flag] = out
    finally:
        for engine in engines.values():
            engine.close()
    row: dict[str, Any] = {"model": name, "prompt_tokens": len(tokens)}
    for kind in ("prefill", "decode"):
        on, off = statistics.median(rates[True][kind]), statistics.median(rates[False][kind])
        row[kind] = {"repacked": round(on, 1), "not_repacked": round(off, 1)}
        row[kind]["ratio_off_on"] = round(off / on, 3)
    row["same_output"] = outputs[True] == outputs[False]
    return row


def lossless_without_repack(args: argparse.Namespace) -> dict[str, Any]:
    """Q8_0 target + Q4_1 draft at K = 4, both unrepacked: greedy output must not change."""
    target, draft = realmodels.smollm2_q8_0(), realmodels.smollm2_q4_1()
    base = {"n_ctx": 2048, "n_threads": args.threads, "repack": False}
    plain = Engine(EngineConfig(target, **base))
    drafting = Engine(
        EngineConfig(
            target,
            draft_kind="draft_model",
            draft_path=draft,
            draft_num_predict=4,
            adaptive=False,  # verify every round: the batched kernels are what is checked
            **base,
        )
    )
    try:
        tokens = plain.tokenize(prompt(0))
        want = plain.generate(tokens, GenerateOptions(num_predict=args.tokens, temperature=0))
        got = drafting.generate(
            tokens, GenerateOptions(num_predict=args.tokens, temperature=0, draft_num_predict=4)
        )
    finally:
        plain.close()
        drafting.close()
    return {
        "identical": got.tokens == want.tokens,
        "tokens": len(want.tokens),
        "drafted": got.draft_count,
        "accepted": got.draft_accepted_count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    models = {
        "SmolLM2-135M Q4_1": realmodels.smollm2_q4_1(),
        "SmolLM2-135M Q8_0": realmodels.smollm2_q8_0(),
        "Gemma-3-270M Q4_K_M": realmodels.gemma3_270m(),
    }
    started = time.time()
    rows = [bench_model(name, path, args) for name, path in models.items()]
    lossless = lossless_without_repack(args)
    print(
        f"{platform.machine()}, {args.threads} threads, {args.tokens} tokens, "
        f"median of {args.runs} interleaved runs, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'model':22} {'prefill on':>11} {'off':>8} {'off/on':>7} "
        f"{'decode on':>10} {'off':>8} {'off/on':>7}  same output"
    )
    for r in rows:
        p, d = r["prefill"], r["decode"]
        print(
            f"{r['model']:22} {p['repacked']:>11} {p['not_repacked']:>8} {p['ratio_off_on']:>7} "
            f"{d['repacked']:>10} {d['not_repacked']:>8} {d['ratio_off_on']:>7}  {r['same_output']}"
        )
    print(
        f"drafting without repacking (Q8_0 + Q4_1 draft): identical={lossless['identical']}, "
        f"{lossless['accepted']}/{lossless['drafted']} drafts accepted"
    )
    print(f"({time.time() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "lossless": lossless}, indent=2))


if __name__ == "__main__":
    main()
