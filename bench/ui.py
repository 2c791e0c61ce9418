"""Does the web page slow generation? The same greedy request through the page in headless
Chromium, straight to the API, and through the CLI, alternating, in one run.

The daemon is a fresh ``modelhub serve`` with a store of its own and one model, SmolLM2-135M
Q4_1 (``devtools.realmodels``), whose Modelfile sets the request's options (``temperature 0``,
``seed``, ``num_predict``) so that the CLI, which has no flags for them, sends the same request
as the others. Each round runs the three arms once, in an order that rotates round by round:

* ``page``: a fresh browser context opens ``/``, picks the model, fills temperature, seed and
  num_predict, sends the prompt and waits until the reply is complete (the page streams
  ``/api/chat``, repaints, and polls ``/api/ps`` each second while it does, as for a user);
* ``API``: the body the page sent, streamed from ``/api/chat`` with httpx;
* ``CLI``: ``modelhub run MODEL PROMPT --verbose`` (``/api/generate``, same template).

The figure of each arm is the daemon's own: the final object's ``eval_count / eval_duration``
(the CLI prints it as ``eval rate``). A warm-up request loads the model first. Drafting is the
model's default (``auto``) unless ``--draft off``; the three arms always draft alike. The
browser is Debian's Chromium (``/usr/bin/chromium``) driven by Playwright for Python, as in
``tests/test_ui_browser.py``.

    python bench/ui.py [--rounds 4] [--num-predict 128] [--seed 7] [--draft auto|off] \\
      [--json out.json]

It prints one row per round, the medians, the ratios page/API and page/CLI, and the conditions
(cores, load average before and after): a ratio near 1.00 means the page costs nothing
measurable; on a busy machine the spread between rounds says how far to trust it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools import realmodels  # noqa: E402
from devtools.daemons import Daemon, start_daemon  # noqa: E402

MODEL = "bench-ui:latest"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
ARMS = ("page", "API", "CLI")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As tests/test_ui_browser.py: no background connections, no GPU, no sandbox as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGE_TIMEOUT_MS = 600_000


def make_model(daemon: Daemon, work: Path, args: argparse.Namespace) -> None:
    lines = [
        f"FROM {realmodels.smollm2_q4_1()}",
        "PARAMETER num_ctx 1024",
        "PARAMETER temperature 0",
        f"PARAMETER seed {args.seed}",
        f"PARAMETER num_predict {args.num_predict}",
    ]
    if args.draft == "off":
        lines.append("DRAFT none")
    mf = work / "Modelfile"
    mf.write_text("\n".join(lines) + "\n")
    r = daemon.cli("create", MODEL, "-f", str(mf))
    if r.returncode != 0:
        raise SystemExit(f"create failed: {r.stderr}")


def rate(count: int, duration_ns: int) -> float:
    return count / (duration_ns / 1e9) if duration_ns else 0.0


def run_api(daemon: Daemon, body: dict[str, Any]) -> dict[str, Any]:
    text, final = "", {}
    with (
        httpx.Client(base_url=daemon.url, timeout=600) as c,
        c.stream("POST", "/api/chat", json=body) as r,
    ):
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.strip():
                continue
            obj = json.loads(line)
            text += (obj.get("message") or {}).get("content") or ""
            if obj.get("done"):
                final = obj
    return {
        "tok_s": rate(final["eval_count"], final["eval_duration"]),
        "eval_count": final["eval_count"],
        "drafter": final.get("drafter"),
        "text": text,
    }


def run_cli(daemon: Daemon) -> dict[str, Any]:
    r = daemon.cli("run", MODEL, PROMPT, "--verbose", "--nowordwrap", timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"modelhub run failed: {r.stderr}")
    count = re.search(r"^eval count:\s+(\d+)", r.stderr, re.M)
    tok_s = re.search(r"^eval rate:\s+([\d.]+) tokens/s", r.stderr, re.M)
    if not (count and tok_s):
        raise SystemExit(f"no eval figures in the CLI's output:\n{r.stderr}")
    return {"tok_s": float(tok_s.group(1)), "eval_count": int(count.group(1)), "text": r.stdout}


def run_page(browser: Any, daemon: Daemon, args: argparse.Namespace) -> dict[str, Any]:
    """One request as a user makes it, in a fresh context; returns the figures and the body
    the page sent."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    try:
        page = context.new_page()
        sent: list[Any] = []
        page.on("request", lambda r: sent.append(r) if r.url.endswith("/api/chat") else None)
        page.goto(daemon.url + "/")
        page.wait_for_selector("body[data-ready='1']")
        page.select_option("#model", MODEL)
        page.click("#settings summary")
        page.fill("#opt-temperature", "0")
        page.fill("#opt-seed", str(args.seed))
        page.fill("#opt-num_predict", str(args.num_predict))
        page.set_checked("#opt-draft", args.draft != "off")
        page.click("#settings summary")
        page.fill("#prompt", PROMPT)
        page.click("#send")
        page.wait_for_selector("#messages .message.assistant")
        page.wait_for_selector("#send:not([disabled])", timeout=PAGE_TIMEOUT_MS)
        chats = json.loads(page.evaluate("localStorage.getItem('modelhub.chats')"))
        reply = chats[0]["messages"][-1]
        if reply.get("error"):
            raise SystemExit(f"the page's request failed: {reply['error']}")
        stats = reply["stats"]
        return {
            "tok_s": rate(stats["eval_count"], stats["eval_duration"]),
            "eval_count": stats["eval_count"],
            "drafter": stats.get("drafter"),
            "text": reply["content"],
            "body": json.loads(sent[0].post_data),
        }
    finally:
        context.close()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).is_file():
        raise SystemExit(f"no Chromium at {CHROMIUM}: install Debian's chromium package")
    load_before = os.getloadavg()
    samples: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        work = Path(tmp)
        extra = {"MODELHUB_NUM_THREADS": str(args.threads)} if args.threads else {}
        daemon = start_daemon(work / "models", work / "daemon.log", extra)
        try:
            make_model(daemon, work, args)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    warm = run_page(browser, daemon, args)  # loads the model; its body is reused
                    body = warm["body"]
                    for round_ in range(args.rounds):
                        order = ARMS[round_ % 3 :] + ARMS[: round_ % 3]
                        for arm in order:
                            if arm == "page":
                                sample = run_page(browser, daemon, args)
                                sample.pop("body")
                            elif arm == "API":
                                sample = run_api(daemon, body)
                            else:
                                sample = run_cli(daemon)
                            samples[arm].append(sample)
                            print(
                                f"round {round_ + 1} {arm:<4} {sample['tok_s']:7.1f} tok/s "
                                f"({sample['eval_count']} tokens)",
                                file=sys.stderr,
                            )
                finally:
                    browser.close()
        finally:
            daemon.stop()
    texts = {arm: {s["text"].strip() for s in runs} for arm, runs in samples.items()}
    medians = {arm: statistics.median(s["tok_s"] for s in runs) for arm, runs in samples.items()}
    return {
        "model": "SmolLM2-135M-Instruct Q4_1",
        "prompt": PROMPT,
        "options": {"temperature": 0, "seed": args.seed, "num_predict": args.num_predict},
        "draft": args.draft,
        "drafter": samples["API"][0].get("drafter"),
        "threads": args.threads or "daemon default",
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "rounds": args.rounds,
        "tok_s": {arm: [s["tok_s"] for s in runs] for arm, runs in samples.items()},
        "eval_count": {arm: [s["eval_count"] for s in runs] for arm, runs in samples.items()},
        "median_tok_s": medians,
        "page_vs_api": medians["page"] / medians["API"],
        "page_vs_cli": medians["page"] / medians["CLI"],
        "same_text_page_api": texts["page"] == texts["API"] and len(texts["page"]) == 1,
    }


def report(out: dict[str, Any]) -> None:
    print(
        f"{out['model']}, {out['options']}, drafting {out['draft']} "
        f"(drafter {out['drafter']}), threads {out['threads']}, {out['cores']} cores"
    )
    print(f"load average before {out['load_before']}, after {out['load_after']}")
    print(f"{'round':<7}" + "".join(f"{arm + ' tok/s':>13}" for arm in ARMS))
    for i in range(out["rounds"]):
        print(f"{i + 1:<7}" + "".join(f"{out['tok_s'][arm][i]:13.1f}" for arm in ARMS))
    print(f"{'median':<7}" + "".join(f"{out['median_tok_s'][arm]:13.1f}" for arm in ARMS))
    print(f"ratio page/API {out['page_vs_api']:.2f}, page/CLI {out['page_vs_cli']:.2f}")
    same = "yes" if out["same_text_page_api"] else "NO"
    print(f"page and API replies identical in every round: {same}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=4, help="rounds of page, API and CLI")
    ap.add_argument("--num-predict", type=int, default=128, help="tokens per reply")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--draft", choices=("auto", "off"), default="auto")
    ap.add_argument("--threads", type=int, default=0, help="MODELHUB_NUM_THREADS (0: default)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    out = measure(args)
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
