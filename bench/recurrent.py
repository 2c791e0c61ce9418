"""Section h of ``bench/speculative.py``: what cutting back a recurrent state costs.

On the tiny synthetic hybrid (``qwen35``: a gated delta-net block, an attention block, a NextN
head) and the tiny ``mamba`` from ``tests/fixtures``:

1. a decode step with and without llama.cpp's state snapshots (``n_rs_seq`` 8, what the engine
   asks for with ``draft_num_predict`` 8): one row and five rows;
2. one checkpoint (save + restore of the sequence's recurrent state) as a fraction of a
   one-row decode;
3. greedy generation, plain vs n-gram and MTP drafting, cut back with snapshots and with
   checkpoints (outputs checked identical).

No small real recurrent or hybrid GGUF is reachable here (none is on PyPI), so (3) runs on the
fixtures, whose layers are a few hundred KB: a decode is mostly fixed overhead, so the ratios
say how the pieces compare on this machine, not what a 27B model would gain.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.openmp import steady_wait  # noqa: E402

steady_wait()  # before llama.cpp loads: this process holds several engines

from modelhub.engine.context import LlamaContext  # noqa: E402
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions  # noqa: E402
from modelhub.engine.llama import LlamaModel  # noqa: E402

# The fixtures are written by the test suite's generators (bench/ does not import tests/):
#   python -c "from tests.fixtures.synthetic_hybrid import write_tiny_qwen35 as q; \
#     from tests.fixtures.synthetic import write_tiny_mamba as m; \
#     q('fx/tiny-qwen35.gguf'); m('fx/tiny-mamba.gguf')"
# then: python bench/speculative.py --sections h --fixtures fx
FIXTURES = {"qwen35": "tiny-qwen35.gguf", "mamba": "tiny-mamba.gguf"}

PROMPTS = ("hello world the model", "tiny fast token draft", "the the the hello")
REPEATS = 200


def _median_seconds(work: Callable[[], None], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _step_costs(path: Path, threads: int) -> dict[str, float]:
    """Median seconds of decode steps at position 64 with and without snapshots, and of one
    checkpoint save + restore."""
    model = LlamaModel(path)
    out: dict[str, float] = {}
    try:
        prefix = model.tokenize(" ".join(PROMPTS * 4))[:64]
        for snapshots in (0, 8):
            ctx = LlamaContext(model, n_ctx=256, n_batch=64, n_threads=threads, n_rs_seq=snapshots)
            try:
                ctx.decode(prefix, 0, "none")
                for rows in (1, 5):

                    def step(rows: int = rows, ctx: LlamaContext = ctx) -> None:
                        state = ctx.save_state(0)
                        ctx.decode(prefix[:rows], len(prefix), "all")
                        ctx.load_state(0, state)
                        ctx.truncate(len(prefix), 0)

                    def checkpoint_only(ctx: LlamaContext = ctx) -> None:
                        state = ctx.save_state(0)
                        ctx.load_state(0, state)
                        ctx.truncate(len(prefix), 0)

                    # A step is measured with a checkpoint around it (to return to position
                    # 64 every time); the checkpoint's own cost is subtracted.
                    ckpt = _median_seconds(checkpoint_only)
                    out[f"decode_{rows}_rows_snapshots_{snapshots}"] = max(
                        0.0, _median_seconds(step) - ckpt
                    )
                    out[f"checkpoint_snapshots_{snapshots}"] = ckpt
                out[f"state_bytes_snapshots_{snapshots}"] = float(len(ctx.save_state(0)))
            finally:
                ctx.close()
    finally:
        model.close()
    return out


def _generation(path: Path, threads: int, tokens: int, runs: int, mtp: bool) -> dict[str, Any]:
    """tok/s of plain decoding and each drafting setting, best of ``runs``, per prompt."""
    configs: dict[str, dict[str, Any]] = {
        "ngram+snapshots": {"draft_kind": "ngram"},
        "ngram+checkpoint": {"draft_kind": "ngram", "recurrent_rollback": "checkpoint"},
    }
    if mtp:
        configs["mtp+snapshots"] = {"draft_kind": "mtp"}
        configs["mtp+checkpoint"] = {"draft_kind": "mtp", "recurrent_rollback": "checkpoint"}

    def make(**kw: Any) -> Engine:
        return Engine(EngineConfig(path, n_ctx=1024, n_batch=64, n_threads=threads, **kw))

    engines = {"plain": make(), **{n: make(draft_num_predict=8, **kw) for n, kw in configs.items()}}
    opts = GenerateOptions(num_predict=tokens, temperature=0)
    table: dict[str, dict[str, float]] = {}
    try:
        for prompt in PROMPTS:
            ids = engines["plain"].tokenize(prompt)
            best: dict[str, float] = dict.fromkeys(engines, 0.0)
            for _ in range(runs):
                ref = None
                for name, e in engines.items():
                    r = e.generate(ids, opts)
                    if ref is None:
                        ref = r.tokens
                    elif r.tokens != ref:
                        raise SystemExit(f"{path.name} {name}: output differs from plain decoding")
                    best[name] = max(best[name], r.eval_count / (r.eval_duration_ns / 1e9))
            table[prompt] = {n: round(v / best["plain"], 3) for n, v in best.items()}
            table[prompt]["plain_tok_s"] = round(best["plain"], 1)
        restores = {n: e.rollback.restores for n, e in engines.items()}
    finally:
        for e in engines.values():
            e.close()
    medians = {n: statistics.median(row[n] for row in table.values()) for n in engines}
    return {"speedup": table, "median_speedup": medians, "restores": restores}


def section_h(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.fixtures) if args.fixtures else None
    fixtures = {name: folder / file for name, file in FIXTURES.items()} if folder else {}
    missing = [str(p) for p in fixtures.values() if not p.is_file()] or (
        [] if folder else ["--fixtures DIR"]
    )
    if missing:
        raise SystemExit(
            f"section h needs the synthetic fixtures ({', '.join(missing)}): see "
            "bench/recurrent.py for the command that writes them"
        )
    rows: dict[str, Any] = {}
    for name, path in fixtures.items():
        costs = _step_costs(path, args.threads)
        one = costs["decode_1_rows_snapshots_0"]
        rows[name] = {
            "seconds": {k: round(v, 7) for k, v in costs.items()},
            "checkpoint_over_decode": round(costs["checkpoint_snapshots_0"] / one, 3),
            "snapshots_over_plain_1_row": round(costs["decode_1_rows_snapshots_8"] / one, 3),
            "snapshots_over_plain_5_rows": round(
                costs["decode_5_rows_snapshots_8"] / costs["decode_5_rows_snapshots_0"], 3
            ),
            "generation": _generation(
                path, args.threads, max(args.tokens, 200), args.runs, mtp=name == "qwen35"
            ),
        }
    return {"goal": "none; for the record (tiny fixtures, see bench/recurrent.py)", "rows": rows}


def report_h(sec: dict[str, Any]) -> None:
    for name, row in sec["rows"].items():
        print(
            f"{name:<8} checkpoint (save+restore) / one-row decode {row['checkpoint_over_decode']}"
            f"; snapshots x{row['snapshots_over_plain_1_row']} (1 row),"
            f" x{row['snapshots_over_plain_5_rows']} (5 rows)"
        )
        medians = row["generation"]["median_speedup"]
        print("         median speed-up: " + ", ".join(f"{k} {v:.2f}x" for k, v in medians.items()))
