"""The benches (serving, concurrency, recurrent, kvcache, ui) run end to end on a tiny budget and
write the JSON they document."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from devtools.realmodels import smollm2_q4_1
from modelhub.engine.native import default_threads

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "serving.py"
# The benches decode on this process's CPUs (a parallel worker's share), never more threads:
# llama.cpp's busy-waiting threads would fight over fewer cores.
THREADS = str(default_threads())


def _bench(
    *args: str, timeout: float = 120, script: Path = BENCH
) -> subprocess.CompletedProcess[str]:
    """Runs the bench with a temporary directory of its own, and checks it left nothing there
    (its daemons write their drafting state as they stop: the directory must outlive them).
    The directory's path is short: Chromium refuses a socket path over ~100 characters."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        run = subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env={**os.environ, "TMPDIR": str(scratch)},
        )
        left = list(scratch.iterdir())
        assert not left, f"left behind: {left}\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return run


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_concurrency_section_smoke(tmp_path: Path) -> None:
    """``--concurrency`` without llama-server: every daemon figure measured, the
    llama-server goals reported as not measured."""
    model = smollm2_q4_1()
    out = tmp_path / "concurrency.json"
    run = _bench(
        *("--model", str(model), "--threads", THREADS, "--num-ctx", "512", "--num-predict", "4"),
        *("--repeats", "1", "--prompts", "2", "--concurrency", "--clients", "1,2"),
        *("--per-client", "1", "--ttft-trials", "2", "--ttft-settle", "0.2", "--out", str(out)),
        timeout=480,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    section = json.loads(out.read_text())["concurrency"]
    agg = section["aggregate"]
    assert set(agg["daemon np=4"]) == set(agg["daemon np=1"]) == {"1", "2"}
    assert set(agg["daemon np=4 draft off"]) == set(agg["daemon np=4, edit"]) == {"1", "2"}
    assert set(agg["daemon np=4 DRAFT ngram"]) == {"4"}
    for cells in agg.values():
        assert all(c["tokens"] > 0 and c["tok_s"] > 0 for c in cells.values()), cells
    for name in ("daemon np=4", "daemon np=1"):
        ttft = section["ttft_under_load"][name]
        assert ttft["trials"] == 2 and 0 < ttft["p50_ms"] <= ttft["p95_ms"]
    goals = section["goals"]
    assert goals["np4_single_vs_np1_single"]["value"] > 0
    assert goals["auto_vs_off_prose_at_2"]["value"] > 0
    assert goals["auto_vs_off_edit_at_1"]["goal"] == ">= 1.0"
    assert goals["np4_vs_llama_server_at_4"] == {"value": None, "goal": ">= 1.0", "met": None}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serving_bench_smoke(tmp_path: Path) -> None:
    model = smollm2_q4_1()  # fetched (and cached) before the clock matters
    out = tmp_path / "serving.json"
    run = _bench(
        *("--model", str(model), "--threads", THREADS, "--num-ctx", "512"),
        *("--num-predict", "8", "--repeats", "1", "--prompts", "2", "--out", str(out)),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "goal daemon tok/s vs in-process" in run.stdout
    assert "not measured (no --llama-server)" in run.stdout

    data = json.loads(out.read_text())
    cond = data["conditions"]
    assert (cond["threads"], cond["num_ctx"], cond["num_predict"], cond["repeats"]) == (
        int(THREADS),
        512,
        8,
        1,
    )
    assert len(cond["prompts"]) == 2
    assert cond["llama_server"] is None and cond["candidate_pythonpath"] is None
    (result,) = data["models"]
    assert result["model"] == model.name
    assert set(result["configs"]) == {"in-process", "daemon"}
    for name, config in result["configs"].items():
        for key in ("tok_s", "eval_tok_s", "ttft_ms"):
            assert math.isfinite(config[key]) and config[key] > 0, (name, key, config)
        assert 2 <= config["eval_count"] <= 8, (name, config)
        assert config["prompt_eval_count"] > 10, (name, config)
        # Greedy, same engine, same prompt tokens: the daemon must say exactly the same.
        assert config["same_text_as_in_process"] is True, name
    prompt_tokens = {c["prompt_eval_count"] for c in result["configs"].values()}
    assert len(prompt_tokens) == 1, "the daemon and the engine saw different prompts"

    ratios = result["ratios"]
    samples = result["samples"]
    assert len(samples["in-process"]) == len(samples["daemon"]) == 2  # 2 prompts x 1 round
    pairs = list(zip(samples["daemon"], samples["in-process"], strict=True))
    assert all(d["prompt"] == b["prompt"] for d, b in pairs)
    assert ratios["daemon_vs_in_process_tok_s"] == pytest.approx(
        statistics.median(d["stream_tok_s"] / b["stream_tok_s"] for d, b in pairs)
    )
    assert ratios["daemon_ttft_overhead_ms"] == pytest.approx(
        statistics.median(d["ttft_ms"] - b["ttft_ms"] for d, b in pairs)
    )
    assert result["configs"]["in-process"]["vs_in_process"] == {
        "tok_s_ratio": 1.0,
        "ttft_diff_ms": 0.0,
    }
    assert ratios["daemon_vs_llama_server_tok_s"] is None
    goals = result["goals"]
    assert goals["daemon_tok_s_vs_in_process"]["goal"] == ">= 0.95"
    assert goals["daemon_tok_s_vs_in_process"]["met"] == (
        ratios["daemon_vs_in_process_tok_s"] >= 0.95
    )
    assert goals["daemon_tok_s_vs_llama_server"]["met"] is None
    assert result["other_processes_cores"] >= 0.0
    assert "other processes kept" in run.stdout
    (cpu,) = result["cpu_ms_per_token"].values()  # one daemon (no --candidate)
    assert set(cpu) == {"daemon", "runner", "client"} and cpu["runner"] > 0


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    run = _bench("--model", str(missing), "--repeats", "1", timeout=60)
    assert run.returncode != 0
    assert f"--model {missing}: no such file" in run.stderr
    assert "Traceback" not in run.stderr

    not_exe = tmp_path / "llama-server"
    not_exe.write_text("")
    run = _bench("--llama-server", str(not_exe), timeout=60)
    assert run.returncode == 2 and "not an executable file" in run.stderr
    assert "Traceback" not in run.stderr

    run = _bench("--num-predict", "1", timeout=60)
    assert run.returncode == 2 and "--num-predict must be at least 2" in run.stderr


@pytest.mark.timeout(300)
def test_recurrent_section_smoke(tmp_path: Path) -> None:
    """Section h of the speculative bench runs on the synthetic recurrent fixtures alone and
    reports every figure (its outputs are checked identical to plain decoding inside)."""
    from tests.fixtures.synthetic import write_tiny_mamba
    from tests.fixtures.synthetic_hybrid import write_tiny_qwen35

    write_tiny_qwen35(tmp_path / "tiny-qwen35.gguf")
    write_tiny_mamba(tmp_path / "tiny-mamba.gguf")
    out = tmp_path / "h.json"
    script = str(ROOT / "bench" / "speculative.py")
    run = subprocess.run(
        [
            sys.executable,
            script,
            *("--sections", "h", "--runs", "1", "--threads", THREADS, "--json", str(out)),
            *("--fixtures", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(out.read_text())["h"]["rows"]
    assert set(rows) == {"qwen35", "mamba"}
    for row in rows.values():
        assert row["checkpoint_over_decode"] > 0
        medians = row["generation"]["median_speedup"]
        assert medians["plain"] == 1.0 and all(v > 0 for v in medians.values())
    assert rows["qwen35"]["generation"]["restores"]["ngram+checkpoint"] > 0
    assert "[h] recurrent state" in run.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kvcache_bench_smoke(tmp_path: Path) -> None:
    """bench/kvcache.py at one tiny length: every cell measured, the ratios, the exactness
    counts and the conditions in the JSON, and the table printed."""
    from devtools.realmodels import smollm2_q8_0

    smollm2_q8_0()  # made (and cached) before the clock matters
    out = tmp_path / "kvcache.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "kvcache.py"),
            *("--lengths", "64", "--runs", "1", "--threads", THREADS, "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "f16/auto" in run.stdout and "auto on=off" in run.stdout
    data = json.loads(out.read_text())
    cond = data["conditions"]
    assert (cond["threads"], cond["runs"], cond["tokens"]) == (int(THREADS), 1, 64)
    assert cond["kv_types"] == {"auto": ["q8_0", "f16"], "f16": ["f16", "f16"]}
    assert data["auto_lossless"] is True
    (length,) = data["lengths"].values()
    assert set(data["lengths"]) == {"64"} and 40 < length["prompt_tokens"] <= 64
    for drafting in ("off", "on"):
        for kv in ("auto", "f16"):
            cell = length["cells"][drafting][kv]
            assert cell["prefill_tok_s"] > 0 and cell["decode_tok_s"] > 0, (drafting, kv)
            assert cell["prompt_tokens"] == length["prompt_tokens"]
            assert 0 < cell["tokens"] <= 64
            assert len(cell["prefill_runs"]) == len(cell["decode_runs"]) == 1
        ratios = length["ratios_f16_over_auto"][drafting]
        assert ratios["prefill"] > 0 and ratios["decode"] > 0
    assert length["cells"]["off"]["auto"]["drafted"] == 0
    exact = length["same_with_drafting"]
    assert exact["auto"] == {"same": 1, "runs": 1, "first_difference": []}
    assert exact["f16"]["runs"] == 1
    (agree,) = length["auto_f16_plain_agree_tokens"]
    assert 0 <= agree <= length["plain_tokens"] <= 64


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ui_bench_smoke(tmp_path: Path) -> None:
    """bench/ui.py, one round of 8 tokens: the page, the API and the CLI each measured, the
    page's reply the API's (greedy), the figures and conditions in the JSON."""
    pytest.importorskip("playwright", reason="Playwright for Python is not installed")
    from tests.test_ui_browser import CHROMIUM

    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium package")
    smollm2_q4_1()  # fetched (and cached) before the clock matters
    out = tmp_path / "ui.json"
    run = _bench(
        *("--rounds", "1", "--num-predict", "8", "--json", str(out)),
        timeout=180,
        script=ROOT / "bench" / "ui.py",
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["options"] == {"temperature": 0, "seed": 7, "num_predict": 8}
    assert data["eval_count"] == {"page": [8], "API": [8], "CLI": [8]}
    assert data["same_text_page_api"] is True
    assert all(v > 0 for v in data["median_tok_s"].values())
    assert data["page_vs_api"] == pytest.approx(
        data["median_tok_s"]["page"] / data["median_tok_s"]["API"]
    )
    assert "page and API replies identical in every round: yes" in run.stdout
