"""Greedy tokens/s of the Q4_1 draft, the Q8_0 copy and the cost-emulating padded target.

The padded target is SmolLM2 Q8_0 plus inert blocks (same output, ~8x the cost per token); all
three are measured in the same run. The models are built and cached on first use; the builder
lives in ``devtools/padded_target.py``. Usage::

    python bench/padded_target.py [--tokens 64] [--threads 2] [--runs 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools import realmodels  # noqa: E402
from devtools.padded_target import greedy_tokens  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2, help="best of N, interleaved")
    args = parser.parse_args(argv)

    models = {
        "Q4_1 (draft)": realmodels.smollm2_q4_1(),
        "Q8_0": realmodels.smollm2_q8_0(),
        f"Q8_0 + {realmodels.PADDED_EXTRA_BLOCKS} inert blocks": realmodels.padded_smollm2(),
    }
    best: dict[str, float] = dict.fromkeys(models, 0.0)
    outputs: dict[str, list[int]] = {}
    for _ in range(args.runs):
        for label, path in models.items():
            tokens, rate = greedy_tokens(path, args.tokens, n_threads=args.threads)
            best[label] = max(best[label], rate)
            outputs[label] = tokens
    draft_rate = best["Q4_1 (draft)"]
    print(f"greedy decode, {args.tokens} tokens, {args.threads} threads, best of {args.runs}")
    print(f"{'model':<32} {'tok/s':>8} {'draft/model':>12}")
    for label, rate in best.items():
        print(f"{label:<32} {rate:>8.1f} {draft_rate / rate:>11.2f}x")
    q8, padded = list(outputs.values())[1:]
    print("padded output identical to Q8_0:", q8 == padded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
