"""Section i of ``bench/speculative.py``: ``DRAFT auto`` (drafting on by default) against drafting
off and against the drafter a user would pick by hand, side by side, greedy, same prompts.

1. prose on SmolLM2 Q4_1 (the quickstart model), where nothing drafts well: auto (n-gram is its
   only candidate) vs plain. Goal: >= 0.97x.
2. the code-edit prompt of (c) on the Q8_0 target: auto vs ``DRAFT ngram`` vs plain. Goal:
   auto >= 0.95x of the best fixed drafter.
3. the cost-emulating padded target with its Q4_1 draft in the store (a candidate of auto), vs
   ``DRAFT ./draft.gguf`` (adaptive, K <= 8: section (a)'s adaptive row) and plain. Goal: auto
   >= 0.95x of the hand-picked draft.
4. the useless 1:1 pair (Q8_0 target, its Q4_1 self as the store's draft): auto vs plain, and
   which drafter auto ends on. Goal: >= 0.97x of plain, ending on n-gram or none.

The n-gram pool is cleared before every drafted run, so no run drafts from an earlier run's
answer (what a repeated request would get, section (c)'s "warm pool"); what the controllers
learned is kept across the runs, as it is across a daemon's requests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools import realmodels  # noqa: E402
from modelhub.engine.generate import Engine, GenerateResult  # noqa: E402
from modelhub.engine.options import DraftSource  # noqa: E402
from modelhub.engine.speculative import factory  # noqa: E402


def section_i(args: argparse.Namespace) -> dict[str, Any]:
    import speculative as sp  # bench/speculative.py, beside this script

    table: dict[str, dict[str, Any]] = {}
    ended_on: dict[str, Any] = {}
    n = args.tokens

    def drafted(e: Engine, tokens: list[int], target: Path, limit: int = n) -> Any:
        """A run of ``e`` with the n-gram pool cleared first."""

        def run() -> GenerateResult:
            factory.ngram_pool(target).clear()
            return e.generate(tokens, sp.greedy(limit))

        return run

    # 1. prose, nothing to draft
    small = realmodels.smollm2_q4_1()
    plain, auto = sp.engine(small, args.threads), sp.engine(small, args.threads, draft_kind="auto")
    try:
        for name, text in sp.PROMPTS.items():
            tokens = plain.tokenize(sp.chat(text))
            table[f"1 prose {name}"] = sp.compare(
                lambda t=tokens: plain.generate(t, sp.greedy(n)),
                {"auto": drafted(auto, tokens, small)},
                args.runs,
            )
        ended_on["1 prose"] = auto.drafting_report()
    finally:
        plain.close()
        auto.close()

    # 2. the code edit
    q8, q4 = realmodels.smollm2_q8_0(), realmodels.smollm2_q4_1()
    plain = sp.engine(q8, args.threads)
    ngram = sp.engine(q8, args.threads, draft_kind="ngram", draft_num_predict=16)
    auto = sp.engine(q8, args.threads, draft_kind="auto")
    try:
        tokens = plain.tokenize(sp.chat(sp.EDIT))
        m = max(n, 160)
        table["2 code edit"] = sp.compare(
            lambda: plain.generate(tokens, sp.greedy(m)),
            {"DRAFT ngram": drafted(ngram, tokens, q8, m), "auto": drafted(auto, tokens, q8, m)},
            args.runs,
        )
        ended_on["2 code edit"] = auto.drafting_report()
    finally:
        for e in (plain, ngram, auto):
            e.close()

    # 3. the padded target, its draft in the store; 4. the useless pair
    for label, target in (("3 padded", realmodels.padded_smollm2()), ("4 1:1 pair", q8)):
        store_draft = [DraftSource("smollm2:135m", "draft_model", q4, 8)]
        plain = sp.engine(target, args.threads)
        auto = sp.engine(target, args.threads, draft_kind="auto", draft_candidates=store_draft)
        by_hand = sp.engine(
            target, args.threads, draft_kind="draft_model", draft_path=q4, draft_num_predict=8
        )
        try:
            for name, text in sp.PROMPTS.items():
                tokens = plain.tokenize(sp.chat(text))
                candidates = {"auto": drafted(auto, tokens, target)}
                if label.startswith("3"):
                    hand = drafted(by_hand, tokens, target)
                    candidates = {"DRAFT ./draft.gguf": hand, **candidates}
                table[f"{label} {name}"] = sp.compare(
                    lambda t=tokens, e=plain: e.generate(t, sp.greedy(n)), candidates, args.runs
                )
            ended_on[label] = auto.drafting_report()
        finally:
            for e in (plain, auto, by_hand):
                e.close()
    return {
        "table": table,
        "ended_on": ended_on,
        "goal": "1, 4: auto >= 0.97x plain; 2, 3: auto >= 0.95x of the hand-picked drafter",
        "configs": ["auto"],
    }


def report_i(sec: dict[str, Any]) -> None:
    for row_name, row in sec["table"].items():
        plain = row["plain"].tok_s
        cells = "  ".join(
            f"{c} {cell.tok_s:.1f} tok/s {cell.tok_s / plain:.2f}x"
            + (f" acc {cell.acceptance:.2f}" if cell.acceptance is not None else "")
            for c, cell in row.items()
            if c != "plain"
        )
        print(f"{row_name:<22} plain {plain:.1f} tok/s  {cells}")
    for label, report in sec["ended_on"].items():
        print(f"  {label}: auto ended on {report.get('in_use') or 'plain decoding'}")
