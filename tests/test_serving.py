"""Serving end to end: runner processes, scheduler, /api/* and /v1/* with real clients."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q4_1

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    base = tmp_path_factory.mktemp("served")
    d = start_daemon(
        base / "models",
        base / "daemon.log",
        {"MODELHUB_KEEP_ALIVE": "10m", "MODELHUB_MAX_LOADED_MODELS": "2"},
    )
    mf = base / "Modelfile"
    # num_predict bounds the CLI's sampled answers (a loop would run to 10 contexts)
    mf.write_text(f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 2048\nPARAMETER num_predict 256\n")
    d.create("smol", mf)
    mf.write_text("FROM smol\nDRAFT ngram\nPARAMETER draft_num_predict 6\n")
    d.create("smol-ngram", mf)
    yield d
    d.stop()


def lines(resp: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in resp.iter_lines() if line.strip()]


def test_generate_stream_and_final_counters(served: Daemon) -> None:
    with (
        served.client() as c,
        c.stream(
            "POST",
            "/api/generate",
            json={"model": "smol", "prompt": "Why is the sky blue?", "options": GREEDY},
        ) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        objs = lines(r)
    *chunks, final = objs
    assert chunks and all(o["done"] is False and "response" in o for o in chunks)
    assert final["done"] is True and final["done_reason"] in ("stop", "length")
    for key in (
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "eval_count",
        "eval_duration",
        "context",
    ):
        assert key in final, key
    assert final["eval_count"] <= 24
    text = "".join(o["response"] for o in chunks)
    with served.client() as c:
        again = c.post(
            "/api/generate",
            json={
                "model": "smol",
                "prompt": "Why is the sky blue?",
                "options": GREEDY,
                "stream": False,
            },
        ).json()
    assert again["response"] == text  # greedy is deterministic, and the prompt cache is exact


def test_ngram_draft_is_lossless_and_counted(served: Daemon) -> None:
    prompt = (
        "Repeat this list exactly: apples, pears, plums, apples, pears, plums, apples, "
        "pears, plums, apples, pears, plums."
    )
    opts = {"temperature": 0, "num_predict": 48}
    with served.client() as c:
        plain = c.post(
            "/api/generate",
            json={"model": "smol", "prompt": prompt, "options": opts, "stream": False},
        ).json()
        # The second time, the model's n-gram pool holds the first answer: drafting is certain
        # whatever this CPU's kernels make the model say.
        first, spec = (
            c.post(
                "/api/generate",
                json={"model": "smol-ngram", "prompt": prompt, "options": opts, "stream": False},
            ).json()
            for _ in range(2)
        )
        ps = c.get("/api/ps").json()["models"]
    assert first["response"] == spec["response"] == plain["response"]
    assert spec["draft_count"] >= spec["draft_accepted_count"] > 0, spec
    entry = next(m for m in ps if m["name"] == "smol-ngram:latest")
    assert entry["draft"]["kind"] == "ngram" and entry["draft"]["adaptive"] is True


def test_fixed_draft_length_drafts_from_the_first_request(served: Daemon, tmp_path: Path) -> None:
    """``PARAMETER draft_adaptive false`` drafts whenever the drafter has guesses, as
    llama.cpp's fixed draft lengths do: no measured costs can talk it out of it."""
    mf = tmp_path / "Modelfile"
    mf.write_text(
        "FROM smol\nDRAFT ngram\nPARAMETER draft_num_predict 6\nPARAMETER draft_adaptive false\n"
    )
    served.create("smol-ngram-fixed", mf)
    prompt = "Repeat this list exactly: red, green, blue, red, green, blue, red, green, blue."
    opts = {"temperature": 0, "num_predict": 32}
    with served.client() as c:
        show = c.post("/api/show", json={"model": "smol-ngram-fixed"}).json()
        assert show["draft"]["draft_adaptive"] is False and show["draft"]["draft_num_predict"] == 6
        default = c.post("/api/show", json={"model": "smol-ngram"}).json()["draft"]
        assert default["draft_num_predict"] == 6 and "draft_adaptive" not in default
        plain, fixed = (
            c.post(
                "/api/generate",
                json={"model": name, "prompt": prompt, "options": opts, "stream": False},
            ).json()
            for name in ("smol", "smol-ngram-fixed")
        )
        bad = c.post(
            "/api/generate",
            json={"model": "smol", "prompt": "hi", "options": {"draft_adaptive": "no"}},
        )
    assert fixed["response"] == plain["response"]
    assert fixed["draft_count"] >= fixed["draft_accepted_count"] > 0, fixed
    assert bad.status_code == 400 and "draft_adaptive" in bad.json()["error"], bad.text
    assert "draft_adaptive" in served.cli("show", "smol-ngram-fixed").stdout
    with served.client() as c:
        ps = {m["name"]: m for m in c.get("/api/ps").json()["models"]}
    assert ps["smol-ngram-fixed:latest"]["draft"]["adaptive"] is False
    assert "ngram =6" in served.cli("ps").stdout


def test_cli_bench_compares_off_adaptive_and_fixed(served: Daemon) -> None:
    prompt = "Repeat this list exactly: one, two, three, one, two, three, one, two, three."
    r = served.cli(
        *("bench", "smol-ngram", "--fixed", "--num-predict", "24", "--prompt", prompt, "--json")
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [c["label"] for c in data["configs"]] == ["off", "≤6", "=6"]
    too_long = served.cli("bench", "smol-ngram", "--draft-num-predict", "8")
    assert too_long.returncode != 0 and "PARAMETER draft_num_predict 8" in too_long.stderr
    rows = {row["config"]: row for row in data["rows"]}
    assert rows["≤6"]["identical"] is True and rows["=6"]["identical"] is True
    fixed = next(run for run in data["runs"] if run["config"] == "=6")
    assert fixed["draft_count"] > 0 and rows["off"]["tokens"] == fixed["eval_count"] > 0


def test_chat_with_ollama_client(served: Daemon) -> None:
    client = ollama.Client(host=served.url)
    parts = list(
        client.chat(
            model="smol",
            messages=[{"role": "user", "content": "Say hi."}],
            stream=True,
            options=GREEDY,
        )
    )
    assert parts[-1].done and "".join(p.message.content for p in parts)
    gen = client.generate(model="smol", prompt="1, 2, 3,", options=GREEDY)
    assert gen.response and gen.eval_count
    emb = client.embed(model="smol", input=["hello", "world"])
    assert len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 576
    norm = sum(x * x for x in emb.embeddings[0]) ** 0.5
    assert abs(norm - 1) < 1e-3
    names = [m.model for m in client.ps().models]
    assert "smol:latest" in names


def test_openai_client(served: Daemon) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused")
    assert "smol:latest" in [m.id for m in client.models.list()]
    assert client.models.retrieve("smol").id == "smol:latest"
    out = client.chat.completions.create(
        model="smol",
        temperature=0,
        max_tokens=16,
        messages=[{"role": "user", "content": "Say hi."}],
    )
    assert out.choices[0].message.content
    assert out.usage is not None and out.usage.completion_tokens <= 16
    details = out.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens is not None
    stream = client.chat.completions.create(
        model="smol",
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Say hi."}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content
    assert chunks[-1].usage is not None
    comp = client.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert comp.choices[0].text
    emb = client.embeddings.create(model="smol", input="hello")
    assert len(emb.data[0].embedding) == 576
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_prediction_counts_accepted_tokens(served: Daemon) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused")
    base = client.chat.completions.create(
        model="smol",
        temperature=0,
        max_tokens=40,
        messages=[{"role": "user", "content": "Write one sentence about the sea."}],
    )
    text = base.choices[0].message.content or ""
    again = client.chat.completions.create(
        model="smol",
        temperature=0,
        max_tokens=40,
        prediction={"type": "content", "content": text},
        messages=[{"role": "user", "content": "Write one sentence about the sea."}],
    )
    assert again.choices[0].message.content == text
    details = again.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details.accepted_prediction_tokens and details.accepted_prediction_tokens > 10


def test_bad_input_is_4xx(served: Daemon) -> None:
    with served.client() as c:
        cases = [
            ("/api/generate", {"model": "nope", "prompt": "x"}, 404),
            ("/api/chat", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404),
            (
                "/api/generate",
                {"model": "smol", "prompt": "x", "options": {"temperature": "hot"}},
                400,
            ),
            ("/api/generate", {"model": "smol", "prompt": "x", "options": {"num_ctx": 10**9}}, 400),
            ("/api/generate", {"model": "smol", "prompt": "x", "keep_alive": "300"}, 400),
            ("/api/chat", {"model": "smol", "messages": "hi"}, 400),
            ("/api/generate", {"model": "smol", "prompt": "x", "format": "yaml"}, 400),
            ("/api/embed", {"model": "smol", "input": [1, 2]}, 400),
        ]
        for path, body, status in cases:
            r = c.post(path, json=body)
            assert r.status_code == status, (path, body, r.status_code, r.text)
            assert r.json()["error"]
        r = c.post("/api/generate", content=b"{oops")
        assert r.status_code == 400


def test_concurrent_clients_all_answered(served: Daemon) -> None:
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        with served.client() as c:
            r = c.post(
                "/api/generate",
                json={
                    "model": "smol",
                    "prompt": f"Count to {i + 3}.",
                    "options": {"temperature": 0, "num_predict": 12},
                    "stream": False,
                },
            )
            results[i] = r.json()["response"] if r.status_code == 200 else f"HTTP {r.status_code}"

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 4 and all(not v.startswith("HTTP") and v for v in results.values())


def test_hung_up_stream_frees_the_model(served: Daemon) -> None:
    with (
        served.client() as c,
        c.stream(
            "POST",
            "/api/generate",
            json={
                "model": "smol",
                "prompt": "Tell me a very long story.",
                "options": {"temperature": 0, "num_predict": 2000},
            },
        ) as r,
    ):
        for _ in r.iter_lines():
            break  # hang up after the first token
    assert _wait_for_runner_ns(served) < 5e9  # 2000 more tokens would take far longer


def test_killed_runner_is_survived(served: Daemon) -> None:
    with served.client() as c:
        c.post(
            "/api/generate",
            json={"model": "smol", "prompt": "Hi", "options": GREEDY, "stream": False},
        )
        pids = _runner_pids(served)
        assert pids
        with c.stream(
            "POST",
            "/api/generate",
            json={
                "model": "smol",
                "prompt": "Tell me a long story.",
                "options": {"temperature": 0, "num_predict": 3000},
            },
        ) as r:
            it = r.iter_lines()
            next(it)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            rest = [json.loads(line) for line in it if line.strip()]
        assert rest and "error" in rest[-1] and "stopped unexpectedly" in rest[-1]["error"]
        r = c.post(
            "/api/generate",
            json={"model": "smol", "prompt": "Hi", "options": GREEDY, "stream": False},
        )
        assert r.status_code == 200 and r.json()["done"]
        assert _runner_pids(served) and set(_runner_pids(served)).isdisjoint(pids)


def test_keep_alive_zero_unloads(served: Daemon) -> None:
    with served.client() as c:
        c.post("/api/generate", json={"model": "smol", "keep_alive": -1})
        assert "smol:latest" in [m["name"] for m in c.get("/api/ps").json()["models"]]
        r = c.post("/api/generate", json={"model": "smol", "keep_alive": 0}).json()
        assert r["done_reason"] == "unload"
        assert "smol:latest" not in [m["name"] for m in c.get("/api/ps").json()["models"]]


def test_metrics(served: Daemon) -> None:
    with served.client() as c:
        text = c.get("/metrics").text
    assert "modelhub_generated_tokens_total" in text
    assert "modelhub_draft_proposed_tokens_total" in text
    assert "modelhub_requests_total" in text


def _runner_pids(d: Daemon) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"modelhub.engine.runner" in cmd and f"MODELHUB_MODELS={d.models}".encode() in env:
            pids.append(int(proc.name))
    return pids


def test_cli_run_ps_stop(served: Daemon) -> None:
    r = served.cli("run", "smol-ngram", "List the days of the week.", "--verbose")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "eval rate:" in r.stderr and "tokens/s" in r.stderr
    ps = served.cli("ps")
    assert ps.returncode == 0 and "smol-ngram:latest" in ps.stdout and "ngram" in ps.stdout
    stop = served.cli("stop", "smol-ngram")
    assert stop.returncode == 0, stop.stderr
    assert "smol-ngram:latest" not in served.cli("ps").stdout
    missing = served.cli("stop", "nope")
    assert missing.returncode == 1 and 'couldn\'t find model "nope" to stop' in missing.stderr
    piped = served.cli("run", "smol", "Summarise:", input="The cat sat on the mat.\n")
    assert piped.returncode == 0 and piped.stdout.strip()


def test_client_gone_while_queued_frees_the_runner(served: Daemon) -> None:
    """A non-streamed request whose client gives up is cancelled, not run to the end."""
    body = {
        "model": "smol",
        "prompt": "Tell me a very long story.",
        "stream": False,
        "options": {"temperature": 0, "num_predict": 3000},
    }
    with served.client(timeout=1.5) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/api/generate", json=body)
    assert _wait_for_runner_ns(served) < 5e9  # 3000 tokens would take minutes


def _wait_for_runner_ns(d: Daemon) -> int:
    """How long the next request waited for the runner (queue + load): ``load_duration``."""
    with d.client() as c:
        r = c.post(
            "/api/generate",
            json={
                "model": "smol",
                "prompt": "Hi",
                "stream": False,
                "options": {"temperature": 0, "num_predict": 1},
            },
        )
    assert r.status_code == 200, r.text
    return int(r.json()["load_duration"])
