"""Does a batched verification give the same logits as one-token decoding, per backend?

Lossless greedy drafting needs it: the target checks k drafted tokens in one batch of k+1
rows, and its choice at each row must be the one it would make decoding that token alone. For
each model and backend (the CPU, and every offload device this build sees: a GPU, or the
software Vulkan lane with ``GGML_VK_VISIBLE_DEVICES=0``), a prompt is decoded, then the same
``rows`` tokens once as one batch and once one at a time; it prints the largest logit
difference and how many rows' argmax differ, for each KV cache type in ``--kv`` (``auto``:
Q8_0 keys and F16 values, modelhub's default; ``f16``: llama.cpp's). Usage::

    python bench/exactness.py [--rows 2 5 9 17] [--kv auto f16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# llama.cpp's library is loaded before NumPy's (the import order is alphabetical too): the
# other way round, a CUDA build of llama-cpp-python crashed in its tokenizer (std::regex
# calling a C++ library symbol that resolved to libggml-cuda's copy).
import llama_cpp  # noqa: F401
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.openmp import steady_wait  # noqa: E402

steady_wait()  # before llama.cpp loads: this process holds several engines

from devtools import realmodels  # noqa: E402
from modelhub.engine.context import LlamaContext  # noqa: E402
from modelhub.engine.devices import list_devices  # noqa: E402
from modelhub.engine.llama import LlamaModel, LoadPlacement  # noqa: E402

PROMPT = "The lighthouse keeper logs the weather, trims the wick, and writes to his sister."


def compare(model: LlamaModel, rows: int, kv: str) -> dict[str, Any]:
    tokens = model.tokenize(PROMPT * 3, add_special=True, parse_special=False)
    prompt, check = tokens[:-rows], tokens[-rows:]
    results: list[np.ndarray] = []
    for batched in (True, False):
        ctx = LlamaContext(model, n_ctx=512, n_batch=512, n_threads=2, kv_cache_type=kv)
        try:
            ctx.decode(prompt, 0, logits="none")
            if batched:
                ctx.decode(check, len(prompt), logits="all")
                results.append(np.array(ctx.logits()))
            else:
                out = []
                for i, token in enumerate(check):
                    ctx.decode([token], len(prompt) + i, logits="last")
                    out.append(np.array(ctx.last_logits()))
                results.append(np.stack(out))
        finally:
            ctx.close()
    batch, single = results
    return {
        "rows": rows,
        "max_abs_diff": float(np.max(np.abs(batch - single))),
        "argmax_differs": int(np.sum(batch.argmax(1) != single.argmax(1))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2, 5, 9, 17])
    parser.add_argument("--kv", nargs="+", default=["auto"], choices=["auto", "f16", "q8_0"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    backends: dict[str, LoadPlacement] = {"CPU": LoadPlacement(cpu_only=True)}
    for dev in list_devices():
        if dev.offloads and not dev.is_rpc:
            backends[dev.label] = LoadPlacement(n_gpu_layers=999, devices=(dev.handle,))
    models = {"Q4_1": realmodels.smollm2_q4_1(), "Q8_0": realmodels.smollm2_q8_0()}
    report = []
    print(
        f"{'backend':10} {'model':6} {'KV':5} {'rows':>5} {'max |diff|':>11} {'argmax differs':>15}"
    )
    for backend, placement in backends.items():
        for name, path in models.items():
            model = LlamaModel(path, placement=placement)
            try:
                for kv in args.kv:
                    for rows in args.rows:
                        r = {
                            "backend": backend,
                            "model": name,
                            "kv": kv,
                            **compare(model, rows, kv),
                        }
                        report.append(r)
                        print(
                            f"{backend:10} {name:6} {kv:5} {rows:>5} {r['max_abs_diff']:>11.6f} "
                            f"{r['argmax_differs']:>15}"
                        )
            finally:
                model.close()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
