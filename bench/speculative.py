"""Speculative decoding, measured side by side: plain decoding vs each drafter, in one run.

Sections (all greedy unless stated; the same prompts, threads and token budget throughout):

a. cost-emulating target (SmolLM2 Q8_0 padded with inert blocks, ~8x the draft's cost per
   token) + the Q4_1 file as draft: K = 4, K = 8 and adaptive. Goal: median speed-up >= 1.5x.
b. the real 1:1-cost pair (Q8_0 target, Q4_1 draft), adaptive. Goal: within 5 % of plain.
c. n-gram drafting on an edit/rewrite prompt: the first time the text is seen, and with the
   pool warm from a similar earlier request. Goals: >= 1.6x and >= 3.0x.
d. temperature 0.8: acceptance of rejection sampling vs "sample the target and compare"
   (llama.cpp's rule), K = 4, Q8_0 + Q4_1. Goal: ratio >= 1.5. Also the coupled draws that
   seeded requests use (the output then independent of drafting), for the record.
e. plain decoding through the engine vs llama-cpp-python's ``Llama.create_completion`` on the
   same GGUF. Goal: >= 0.95x.
f. a caller-supplied prediction (OpenAI's Predicted Outputs) on the edit prompt of (c): the
   original code (what an editor would send) and the exact output, the n-gram pool that drafts
   where the prediction does not reach cleared before each run. No goal; for the record.
g. JSON-schema output (a grammar on every row): n-gram drafting and a prediction (the JSON
   document the prompt edits, as the model wrote it when asked to copy it) against plain
   decoding under the same grammar, on two edits of a JSON document. Goal: >= 1.3x for the
   better drafter.
i. ``DRAFT auto``, drafting on by default (``bench/auto.py``): against plain decoding and the
   drafter a user would pick by hand, on prose, a code edit, the padded target with its draft
   in the store and the useless 1:1 pair. Goals there.
h. targets with recurrent state (``bench/recurrent.py``): decode cost with llama.cpp's state
   snapshots, one checkpoint as a fraction of a decode, and drafting on tiny synthetic hybrid
   and Mamba fixtures (no small real one is reachable; ``--fixtures DIR``, see that file). No
   goal; for the record.

Tokens/s counts generated tokens over generation time (prefill excluded) except in (e), where
both sides are timed by the wall clock around the whole call. Each cell is the best of
``--runs`` runs, interleaved with its baseline. Usage::

    python bench/speculative.py [--tokens 128] [--runs 2] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.openmp import steady_wait  # noqa: E402

steady_wait()  # before llama.cpp loads: this process holds several engines

from devtools import realmodels  # noqa: E402
from modelhub.engine.generate import (  # noqa: E402
    Engine,
    EngineConfig,
    GenerateOptions,
    GenerateResult,
)
from modelhub.engine.speculative import factory  # noqa: E402

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PROMPTS = {
    "fridge": "What should I keep in my fridge? Give me a list.",
    "palindrome": "Write a Python function that checks whether a string is a palindrome.",
    "story": "Write a short story about a lighthouse keeper.",
}
CODE = """def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total = total + order.amount
            count = count + 1
    average = total / count if count else 0
    print("paid orders:", count, "total:", total, "average:", average)
    return {"count": count, "total": total, "average": average}
"""
EDIT = (
    "Rename the variable `total` to `revenue` in this function. Reply with the code only."
    f"\n\n{CODE}"
)
SIMILAR = (
    "Rename the variable `count` to `paid_count` in this function. Reply with the code only."
    f"\n\n{CODE}"
)


ORDERS = {
    "orders": [
        {"id": i, "customer": name, "status": "paid", "amount": amount}
        for i, (name, amount) in enumerate(
            [("Ada", 120), ("Ben", 75), ("Cleo", 42), ("Dan", 310), ("Eve", 18), ("Finn", 99)],
            start=1,
        )
    ]
}
DOC = json.dumps(ORDERS, indent=2)
JSON_PROMPTS = {
    "refund": 'Change the status of order 3 to "refunded". Reply with the whole JSON only.'
    f"\n\n{DOC}",
    "rename": f'Change the customer of order 5 to "Eva". Reply with the whole JSON only.\n\n{DOC}',
}
ORDERS_SCHEMA = {
    "type": "object",
    "properties": {
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "customer": {"type": "string"},
                    "status": {"type": "string"},
                    "amount": {"type": "number"},
                },
                "required": ["id", "customer", "status", "amount"],
            },
        }
    },
    "required": ["orders"],
}


def chat(user: str) -> str:
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@dataclass
class Cell:
    """One configuration on one prompt: the best of the runs."""

    tok_s: float = 0.0
    tokens: int = 0
    acceptance: float | None = None
    drafted: int = 0
    accepted: int = 0
    runs: list[float] = field(default_factory=list)
    diverged_at: int | None = None  # first token where a run's output left plain decoding's

    def add(self, r: GenerateResult, seconds: float | None = None) -> None:
        duration = seconds if seconds is not None else r.eval_duration_ns / 1e9
        rate = r.eval_count / duration if duration > 0 else 0.0
        self.runs.append(round(rate, 2))
        if rate >= self.tok_s:
            self.tok_s, self.tokens = rate, r.eval_count
            self.drafted, self.accepted = r.draft_count, r.draft_accepted_count
            self.acceptance = round(r.acceptance, 3) if r.draft_count else None


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def engine(path: Path, threads: int, **kw: Any) -> Engine:
    return Engine(EngineConfig(path, n_ctx=2048, n_threads=threads, **kw))


def fixed_k4(target: Path, draft: Path, threads: int) -> Engine:
    """The draft model at a fixed K = 4 (no adaptive length): llama.cpp's default setting."""
    return engine(
        target,
        threads,
        draft_kind="draft_model",
        draft_path=draft,
        draft_num_predict=4,
        adaptive=False,
    )


def greedy(n: int, k: int | None = None) -> GenerateOptions:
    return GenerateOptions(num_predict=n, temperature=0, draft_num_predict=k)


def compare(
    baseline: Callable[[], GenerateResult],
    candidates: dict[str, Callable[[], GenerateResult]],
    runs: int,
) -> dict[str, Cell]:
    """Interleave baseline and candidates ``runs`` times; note where a greedy output differs
    from the baseline's (lossless broken: ``main`` reports it and exits 1 at the end, after
    the figures, which on a backend whose batched logits are not exact still tell the cost)."""
    cells = {"plain": Cell(), **{name: Cell() for name in candidates}}
    for _ in range(runs):
        ref = baseline()
        cells["plain"].add(ref)
        for name, run in candidates.items():
            r = run()
            if r.tokens != ref.tokens:
                same = [a == b for a, b in zip(r.tokens, ref.tokens, strict=False)]
                cells[name].diverged_at = same.index(False) if False in same else len(same)
            cells[name].add(r)
    return cells


def divergences(value: Any, where: str = "") -> list[str]:
    """Every cell of ``value`` (results, nested dicts) whose output left plain decoding's."""
    if isinstance(value, dict):
        return [line for k, v in value.items() for line in divergences(v, f"{where} {k}")]
    at = getattr(value, "diverged_at", None)
    return [f"{where.strip()}: differs from plain decoding at token {at}"] if at is not None else []


def speedups(table: dict[str, dict[str, Cell]], name: str) -> list[float]:
    return [row[name].tok_s / row["plain"].tok_s for row in table.values()]


def section_a(args: argparse.Namespace) -> dict[str, Any]:
    target, draft = realmodels.padded_smollm2(), realmodels.smollm2_q4_1()
    plain = engine(target, args.threads)
    fixed = engine(
        target,
        args.threads,
        draft_kind="draft_model",
        draft_path=draft,
        draft_num_predict=8,
        adaptive=False,
    )
    adaptive = engine(
        target, args.threads, draft_kind="draft_model", draft_path=draft, draft_num_predict=8
    )
    table: dict[str, dict[str, Cell]] = {}
    try:
        for name, text in PROMPTS.items():
            tokens = plain.tokenize(chat(text))
            table[name] = compare(
                lambda t=tokens: plain.generate(t, greedy(args.tokens)),
                {
                    "K=4": lambda t=tokens: fixed.generate(t, greedy(args.tokens, 4)),
                    "K=8": lambda t=tokens: fixed.generate(t, greedy(args.tokens, 8)),
                    "adaptive": lambda t=tokens: adaptive.generate(t, greedy(args.tokens)),
                },
                args.runs,
            )
    finally:
        for e in (plain, fixed, adaptive):
            e.close()
    return {
        "table": table,
        "goal": "median speed-up >= 1.5x",
        "configs": ["K=4", "K=8", "adaptive"],
    }


def section_b(args: argparse.Namespace) -> dict[str, Any]:
    target, draft = realmodels.smollm2_q8_0(), realmodels.smollm2_q4_1()
    plain = engine(target, args.threads)
    adaptive = engine(
        target, args.threads, draft_kind="draft_model", draft_path=draft, draft_num_predict=8
    )
    fixed = fixed_k4(target, draft, args.threads)
    table: dict[str, dict[str, Cell]] = {}
    try:
        for name, text in PROMPTS.items():
            tokens = plain.tokenize(chat(text))
            table[name] = compare(
                lambda t=tokens: plain.generate(t, greedy(args.tokens)),
                {
                    "adaptive": lambda t=tokens: adaptive.generate(t, greedy(args.tokens)),
                    "K=4 (fixed)": lambda t=tokens: fixed.generate(t, greedy(args.tokens, 4)),
                },
                args.runs,
            )
    finally:
        for e in (plain, adaptive, fixed):
            e.close()
    return {
        "table": table,
        "goal": "adaptive within 5 % of plain (>= 0.95x)",
        "configs": ["adaptive", "K=4 (fixed)"],
    }


def section_c(args: argparse.Namespace) -> dict[str, Any]:
    target = realmodels.smollm2_q8_0()
    plain = engine(target, args.threads)
    ngram = engine(target, args.threads, draft_kind="ngram", draft_num_predict=16)
    table: dict[str, dict[str, Cell]] = {}
    n = max(args.tokens, 160)  # the rewritten function is ~130 tokens long
    try:
        edit, similar = plain.tokenize(chat(EDIT)), plain.tokenize(chat(SIMILAR))

        def fresh_pool() -> None:
            factory.ngram_pool(target).clear()

        def first_time() -> GenerateResult:
            fresh_pool()
            return ngram.generate(edit, greedy(n))

        def warm() -> GenerateResult:
            fresh_pool()
            ngram.generate(similar, greedy(n))
            return ngram.generate(edit, greedy(n))

        table["edit"] = compare(
            lambda: plain.generate(edit, greedy(n)),
            {"first time": first_time, "warm pool": warm},
            args.runs,
        )
    finally:
        plain.close()
        ngram.close()
    return {
        "table": table,
        "goal": "first time >= 1.6x, warm pool >= 3.0x",
        "configs": ["first time", "warm pool"],
    }


def section_d(args: argparse.Namespace) -> dict[str, Any]:
    target, draft = realmodels.smollm2_q8_0(), realmodels.smollm2_q4_1()
    spec = fixed_k4(target, draft, args.threads)
    rows: dict[str, dict[str, float]] = {}
    try:
        for name, text in PROMPTS.items():
            tokens = spec.tokenize(chat(text))
            totals = {"rejection": [0, 0], "coupled": [0, 0], "compare": [0, 0]}
            for seed in range(args.runs * 2):
                for rule in totals:
                    r = spec.generate(
                        tokens,
                        GenerateOptions(
                            num_predict=args.tokens,
                            temperature=0.8,
                            top_k=40,
                            top_p=0.95,
                            min_p=0.05,
                            seed=seed,
                            draft_num_predict=4,
                            sampling_verify=rule,
                        ),
                    )
                    totals[rule][0] += r.draft_accepted_count
                    totals[rule][1] += r.draft_count
            rows[name] = {rule: round(a / d, 3) if d else 0.0 for rule, (a, d) in totals.items()}
    finally:
        spec.close()
    return {"rows": rows, "goal": "rejection acceptance >= 1.5x compare acceptance"}


def section_e(args: argparse.Namespace) -> dict[str, Any]:
    from llama_cpp import Llama

    target = realmodels.smollm2_q8_0()
    ours = engine(target, args.threads)
    theirs = Llama(
        str(target),
        n_ctx=2048,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_gpu_layers=-1,  # every layer on the GPU where there is one, as the engine places them
        flash_attn=True,
        verbose=False,
    )
    rows: dict[str, dict[str, float]] = {}
    try:
        for name, text in PROMPTS.items():
            tokens = ours.tokenize(chat(text))
            best = {"engine": 0.0, "llama-cpp-python": 0.0}
            for _ in range(args.runs):
                t0 = time.perf_counter()
                r = ours.generate(tokens, greedy(args.tokens))
                best["engine"] = max(best["engine"], r.eval_count / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                out = theirs.create_completion(
                    tokens, max_tokens=args.tokens, temperature=0.0, top_k=1, repeat_penalty=1.0
                )
                n = out["usage"]["completion_tokens"]  # type: ignore[index]
                best["llama-cpp-python"] = max(
                    best["llama-cpp-python"], n / (time.perf_counter() - t0)
                )
            rows[name] = {k: round(v, 2) for k, v in best.items()}
    finally:
        ours.close()
        theirs.close()
    return {"rows": rows, "goal": "engine >= 0.95x llama-cpp-python"}


def section_f(args: argparse.Namespace) -> dict[str, Any]:
    target = realmodels.smollm2_q8_0()
    plain = engine(target, args.threads)
    predicting = engine(target, args.threads)
    n = max(args.tokens, 160)
    try:
        edit = plain.tokenize(chat(EDIT))
        exact = plain.generate(edit, greedy(n)).tokens
        original = plain.tokenize(CODE, add_special=False)

        def predicted(tokens: list[int]) -> Callable[[], GenerateResult]:
            def run() -> GenerateResult:
                factory.ngram_pool(target).clear()  # its fallback drafter starts afresh
                return predicting.generate(edit, greedy(n, 16), prediction=tokens)

            return run

        table = {
            "edit": compare(
                lambda: plain.generate(edit, greedy(n)),
                {"original code": predicted(original), "exact output": predicted(exact)},
                args.runs,
            )
        }
    finally:
        plain.close()
        predicting.close()
    return {
        "table": table,
        "goal": "none (Predicted Outputs, K <= 16)",
        "configs": ["original code", "exact output"],
    }


def section_g(args: argparse.Namespace) -> dict[str, Any]:
    from modelhub.engine.gbnf import format_grammar

    target = realmodels.smollm2_q8_0()
    plain = engine(target, args.threads)
    ngram = engine(target, args.threads, draft_kind="ngram", draft_num_predict=8)
    n = max(args.tokens, 200)
    opts = GenerateOptions(num_predict=n, temperature=0, grammar=format_grammar(ORDERS_SCHEMA))
    # What an app predicts: the document as the model wrote it before (the grammar allows one
    # space between tokens, so that is not DOC's own layout).
    copy = plain.tokenize(chat(f"Reply with this JSON unchanged.\n\n{DOC}"))
    document = plain.generate(copy, opts).tokens
    table: dict[str, dict[str, Cell]] = {}
    try:
        for name, text in JSON_PROMPTS.items():
            tokens = plain.tokenize(chat(text))

            def drafted(tokens: list[int] = tokens) -> GenerateResult:
                factory.ngram_pool(target).clear()  # drafts from the prompt and reply only
                return ngram.generate(tokens, opts)

            def predicted(tokens: list[int] = tokens) -> GenerateResult:
                factory.ngram_pool(target).clear()
                return plain.generate(tokens, opts, prediction=document)

            table[name] = compare(
                lambda tokens=tokens: plain.generate(tokens, opts),
                {"ngram": drafted, "prediction": predicted},
                args.runs,
            )
    finally:
        plain.close()
        ngram.close()
    return {
        "table": table,
        "goal": ">= 1.3x with the better drafter",
        "configs": ["ngram", "prediction"],
    }


def section_h(args: argparse.Namespace) -> dict[str, Any]:
    from recurrent import section_h as run  # bench/recurrent.py, beside this script

    return run(args)


def section_i(args: argparse.Namespace) -> dict[str, Any]:
    from auto import section_i as run  # bench/auto.py, beside this script

    return run(args)


def report(results: dict[str, Any]) -> None:
    for key in ("a", "b", "c", "f", "g"):
        if key not in results:
            continue
        sec = results[key]
        print(f"\n[{key}] {sec['title']}  (goal: {sec['goal']})")
        header = f"{'prompt':<12}{'plain tok/s':>12}"
        for c in sec["configs"]:
            header += f"{c + ' tok/s':>20}{'x':>7}{'acc':>7}"
        print(header)
        for prompt, row in sec["table"].items():
            line = f"{prompt:<12}{row['plain'].tok_s:>12.1f}"
            for c in sec["configs"]:
                cell = row[c]
                acc = "-" if cell.acceptance is None else f"{cell.acceptance:.2f}"
                line += f"{cell.tok_s:>20.1f}{cell.tok_s / row['plain'].tok_s:>7.2f}{acc:>7}"
            print(line)
        for c in sec["configs"]:
            ratios = speedups(sec["table"], c)
            print(f"  {c}: median speed-up {statistics.median(ratios):.2f}x")
    if "d" in results:
        sec = results["d"]
        print(f"\n[d] {sec['title']}  (goal: {sec['goal']})")
        for prompt, row in sec["rows"].items():
            ratio = row["rejection"] / row["compare"] if row["compare"] else float("inf")
            print(
                f"{prompt:<12} rejection {row['rejection']:.3f}  coupled {row['coupled']:.3f}"
                f"  compare {row['compare']:.3f}  ratio {ratio:.2f}"
            )
    if "e" in results:
        sec = results["e"]
        print(f"\n[e] {sec['title']}  (goal: {sec['goal']})")
        for prompt, row in sec["rows"].items():
            ratio = row["engine"] / row["llama-cpp-python"]
            print(
                f"{prompt:<12} engine {row['engine']:.1f} tok/s  llama-cpp-python "
                f"{row['llama-cpp-python']:.1f} tok/s  ratio {ratio:.2f}"
            )
    if "h" in results:
        from recurrent import report_h

        print(f"\n[h] {results['h']['title']}  (goal: {results['h']['goal']})")
        report_h(results["h"])
    if "i" in results:
        from auto import report_i

        print(f"\n[i] {results['i']['title']}  (goal: {results['i']['goal']})")
        report_i(results["i"])


TITLES = {
    "a": "cost-emulating padded target + Q4_1 draft, greedy",
    "b": "real 1:1 pair Q8_0 + Q4_1, greedy",
    "c": "n-gram drafting on an edit prompt (Q8_0 target), greedy",
    "d": "temperature 0.8: acceptance, rejection sampling / coupled / sample-and-compare (K=4)",
    "e": "plain engine vs llama-cpp-python create_completion (Q8_0)",
    "f": "a caller's prediction (OpenAI Predicted Outputs) on the edit prompt, greedy",
    "g": "JSON-schema output: n-gram and prediction drafting under the grammar, greedy",
    "h": "recurrent state (tiny qwen35 hybrid, tiny mamba): snapshots, checkpoints, drafting",
    "i": "DRAFT auto (on by default) vs plain and vs the drafter picked by hand, greedy",
}


def to_json(value: Any) -> Any:
    if isinstance(value, Cell) or type(value).__name__ == "Cell":  # also bench/auto.py's import
        return value.__dict__
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sections", default="abcdefg")
    parser.add_argument("--fixtures", help="section h: the folder of its synthetic fixtures")
    parser.add_argument("--json", type=Path, default=Path("bench/results/speculative.json"))
    args = parser.parse_args(argv)
    sections = {
        "a": section_a,
        "b": section_b,
        "c": section_c,
        "d": section_d,
        "e": section_e,
        "f": section_f,
        "g": section_g,
        "h": section_h,
        "i": section_i,
    }
    results: dict[str, Any] = {}
    conditions = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "tokens": args.tokens,
        "runs": args.runs,
        "load_average_start": load_average(),
    }
    for key in args.sections:  # each section reported and saved as it ends
        t0 = time.perf_counter()
        results[key] = {"title": TITLES[key], **sections[key](args)}
        results[key]["seconds"] = round(time.perf_counter() - t0, 1)
        results[key]["load_average_after"] = load_average()
        print(f"section {key} done in {results[key]['seconds']} s", file=sys.stderr)
        report({key: results[key]})
        save(args.json, conditions, results)
    broken = divergences(results)
    for line in broken:
        print(f"LOSSLESS BROKEN: {line}")
    return 1 if broken else 0


def save(path: Path, conditions: dict[str, Any], results: dict[str, Any]) -> None:
    summary: dict[str, Any] = {}
    for key in ("a", "b", "c", "f", "g"):
        if key in results:
            summary[key] = {
                c: round(statistics.median(speedups(results[key]["table"], c)), 3)
                for c in results[key]["configs"]
            }
    conditions["load_average_end"] = load_average()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"conditions": conditions, "summary_median_speedup": summary, **to_json(results)},
            indent=2,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
