"""Images in the context: what encoding an image costs, and the prefill and decode rates of the
same request with and without images, on SmolLM2-135M Q4_1 with a vision projector.

THE PROJECTOR IS SYNTHETIC. No real vision GGUF is reachable here, so this bench runs on the
test suite's tiny LLaVA-style projector (a 2-block, 32-wide CLIP ViT with random weights and an
MLP to SmolLM2's 576-wide embeddings, 16 image tokens per image). Its encoding time says
nothing about a real vision tower (hundreds of millions of weights, hundreds of image tokens):
it measures libmtmd's fixed costs (preprocessing the pixels, building and running a graph,
copying the embeddings out). The prefill and decode rows are real SmolLM2 work: image positions
are evaluated from embeddings, text positions from token ids, and decoding after an image is the
target's ordinary decoding with those positions in its KV cache.

The projector is written by the test suite's generator (``bench/`` does not import ``tests/``)::

    python -c "from pathlib import Path; \
      from tests.fixtures.synthetic_projector import write_projector as w; \
      w(Path('mmproj-synthetic.gguf'))"
    python bench/vision.py --projector mmproj-synthetic.gguf [--runs 5] [--threads 2] \
      [--tokens 64]

Rows (greedy, drafting off, medians over ``--runs``, the rows interleaved run by run):

* ``encode WxH``: one image of that size through the projector (libmtmd's preprocessing, which
  resizes to the projector's 32x32, and the encoder), milliseconds;
* ``text only`` (the baseline), ``1 image``, ``4 images``: the same chat turn with no image or
  with images before its text; prefill tok/s counts every evaluated position (an image's
  positions too) over the prefill time, which excludes encoding (done before the request joins
  the batch); decode tok/s is generated tokens over generation time; ``first token`` is
  encoding + prefill, what a client waits for. Each run starts with a different word, so the
  prompt cache reuses only the template's first tokens.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools import realmodels  # noqa: E402
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions  # noqa: E402
from modelhub.engine.options import GenerateResult  # noqa: E402
from modelhub.engine.vision import RawImage, prompt_with_images  # noqa: E402

MARK = r"<\|img-(\d+)\|>"
WORDS = ["Please", "Now", "Kindly", "Briefly", "Quickly", "Carefully", "Simply", "Again"]
QUESTION = "describe what you see in the picture, then write a short poem about it."
SYNTHETIC = "synthetic projector (random 2-block ViT): encode times say nothing of a real tower"


def chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def pixels(seed: int, width: int, height: int) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8).tobytes()


def encode_ms(engine: Engine, width: int, height: int, runs: int) -> float:
    """Median milliseconds to turn one image of this size into embeddings."""
    projector = engine.projector
    assert projector is not None
    times = []
    for i in range(runs):
        image = RawImage(width, height, pixels(100 + i, width, height))
        start = time.perf_counter()
        projector.encode(image)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def request(engine: Engine, n_images: int, run: int, tokens: int) -> dict[str, float]:
    """One greedy request with ``n_images`` 64x64 images before its text: its rates."""
    word = WORDS[run % len(WORDS)]
    marks = "".join(f"<|img-{i}|>" for i in range(n_images))
    images = {
        str(i): {
            "width": 64,
            "height": 64,
            "rgb": base64.b64encode(pixels(run * 100 + n_images * 10 + i, 64, 64)).decode(),
        }
        for i in range(n_images)
    }
    start = time.perf_counter()
    prompt, spans = prompt_with_images(
        engine,
        chat(f"{word} {marks}{QUESTION}"),
        [],
        {"image_marker": MARK, "images": images},
        None,
    )
    encoded = time.perf_counter() - start
    done: list[GenerateResult | BaseException] = []
    finished = threading.Event()

    def on_done(res: GenerateResult | None, err: BaseException | None) -> None:
        done.append(err if err is not None else res)  # type: ignore[arg-type]
        finished.set()

    opts = GenerateOptions(num_predict=tokens, temperature=0)
    engine.submit(prompt, opts, on_done, images=spans)
    finished.wait()
    r = done[0]
    if isinstance(r, BaseException):
        raise r
    prefill_s = r.prompt_eval_duration_ns / 1e9
    return {
        "positions": float(r.prompt_eval_count),
        "prefill_tok_s": r.prompt_eval_count / prefill_s if prefill_s else 0.0,
        "decode_tok_s": r.eval_count / (r.eval_duration_ns / 1e9) if r.eval_duration_ns else 0.0,
        "generated": float(r.eval_count),
        "first_token_ms": (encoded + prefill_s) * 1000,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cfg = EngineConfig(
        realmodels.smollm2_q4_1(),
        n_ctx=2048,
        n_threads=args.threads,
        projector_path=Path(args.projector),
    )
    rows = {"text only": 0, "1 image": 1, "4 images": 4}
    with Engine(cfg) as engine:
        encode = {f"{w}x{h}": encode_ms(engine, w, h, args.runs) for w, h in ((32, 32), (640, 480))}
        request(engine, 1, 99, 8)  # warm-up: the first image graph and the first decode
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
        for run in range(args.runs):
            for name, n in rows.items():
                samples[name].append(request(engine, n, run, args.tokens))
    table = {
        name: {key: statistics.median(s[key] for s in runs) for key in runs[0]}
        for name, runs in samples.items()
    }
    return {
        "projector": SYNTHETIC,
        "threads": args.threads,
        "tokens": args.tokens,
        "runs": args.runs,
        "encode_ms": encode,
        "table": table,
    }


def report(out: dict[str, Any]) -> None:
    print(f"SmolLM2-135M Q4_1 + {out['projector']}")
    print(f"threads {out['threads']}, num_predict {out['tokens']}, median of {out['runs']} runs")
    for size, ms in out["encode_ms"].items():
        print(f"encode {size:<9} {ms:8.2f} ms per image")
    base = out["table"]["text only"]
    print(
        f"{'':<10} {'positions':>9} {'prefill tok/s':>14} {'ratio':>6} "
        f"{'decode tok/s':>13} {'ratio':>6} {'first token ms':>15}"
    )
    for name, row in out["table"].items():
        print(
            f"{name:<10} {row['positions']:9.0f} {row['prefill_tok_s']:14.1f} "
            f"{row['prefill_tok_s'] / base['prefill_tok_s']:6.2f} {row['decode_tok_s']:13.1f} "
            f"{row['decode_tok_s'] / base['decode_tok_s']:6.2f} {row['first_token_ms']:15.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--projector", required=True, help="the synthetic projector GGUF (see top)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    out = measure(args)
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
