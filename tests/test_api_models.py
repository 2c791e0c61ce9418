"""Model management end to end: real daemon, real GGUFs, our CLI, httpx, the ollama client.

What the daemon decides without a runner or a real model's weights (request checks, blob
uploads, the Host/Origin guard, create's checks of a GGUF, a template or a DRAFT form, the
catalog) runs in-process over fake runners (``app``, ``tests/fakes``), the CLI in-process too."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from devtools.daemons import Daemon
from devtools.realmodels import gemma3_270m, smollm2_q4_1
from modelhub.store import sha256_file
from tests.fakes.daemon import FakeDaemon, fake_daemon
from tests.fixtures.synthetic import (
    write_malformed,
    write_tiny_llama,
    write_tiny_mamba,
    write_tiny_mtp,
)
from tests.fixtures.synthetic_drafters import (
    write_tiny_dflash,
    write_tiny_eagle3,
    write_tiny_gemma4,
    write_tiny_gemma4_assistant,
)
from tests.fixtures.synthetic_hybrid import write_tiny_qwen35

pytestmark = pytest.mark.slow


def sha256(path: Path) -> str:
    return sha256_file(path)[0]


def modelfile(tmp: Path, text: str) -> Path:
    path = tmp / "Modelfile"
    path.write_text(text)
    return path


def link(src: Path, tmp: Path, name: str) -> Path:
    dst = tmp / name
    if not dst.exists():
        os.symlink(src, dst)
    return dst


def ok(result: object) -> str:
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"  # type: ignore[attr-defined]
    return str(result.stdout)  # type: ignore[attr-defined]


def fails(result: object) -> str:
    assert result.returncode != 0, result.stdout  # type: ignore[attr-defined]
    err = str(result.stderr)  # type: ignore[attr-defined]
    assert err.startswith("Error: "), err
    assert "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    """The app over fake runners, with the tiny synthetic model as ``smol`` (the name the
    request bodies use: what these checks decide does not read the weights)."""
    with fake_daemon(tmp_path_factory.mktemp("models-fake")) as d:
        d.add_model("smol")
        yield d


@pytest.fixture(scope="module")
def smol(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    """SmolLM2-135M Q4_1 created through the CLI as `smol` (chat template, system, params)."""
    tmp = tmp_path_factory.mktemp("smol")
    link(smollm2_q4_1(), tmp, "smol.gguf")
    mf = modelfile(
        tmp,
        'FROM ./smol.gguf\nSYSTEM """You are terse."""\nPARAMETER temperature 0.2\n'
        "PARAMETER stop <|im_end|>\nPARAMETER stop <|endoftext|>\n"
        "MESSAGE user Hi\nMESSAGE assistant Hello!\nLICENSE Apache-2.0\n",
    )
    start = time.perf_counter()
    out = ok(daemon.cli("create", "smol", "-f", str(mf)))
    elapsed = time.perf_counter() - start
    print(f"create smol (98 MB, upload + create through the CLI): {elapsed:.2f} s")
    assert "success" in out
    return "smol"


def test_create_list_show(daemon: Daemon, smol: str) -> None:
    with daemon.client() as c:
        tags = c.get("/api/tags").json()["models"]
        entry = next(m for m in tags if m["name"] == "smol:latest")
        assert entry["details"]["family"] == "llama"
        assert entry["details"]["parameter_size"] == "134.52M"
        assert entry["details"]["quantization_level"] == "Q4_1"
        assert entry["size"] > 98_362_432
        assert len(entry["digest"]) == 64
        show = c.post("/api/show", json={"model": "SMOL"}).json()  # case-insensitive
    assert show["system"] == "You are terse."
    assert "temperature" in show["parameters"] and "<|im_end|>" in show["parameters"]
    assert show["messages"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    assert show["license"] == "Apache-2.0"
    assert show["model_info"]["general.architecture"] == "llama"
    assert "completion" in show["capabilities"]
    assert "{%" in show["template"]  # the GGUF's own chat template
    listing = ok(daemon.cli("list"))
    header, *rows = listing.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert any(r.startswith("smol:latest") and "MB" in r for r in rows)
    summary = ok(daemon.cli("show", "smol"))
    assert "llama" in summary and "134.52M" in summary and "Q4_1" in summary


def test_show_modelfile_round_trips(daemon: Daemon, smol: str, tmp_path: Path) -> None:
    text = ok(daemon.cli("show", "smol", "--modelfile"))
    assert "FROM " in text and "PARAMETER temperature 0.2" in text
    mf = modelfile(tmp_path, text)
    ok(daemon.cli("create", "smol-rt", "-f", str(mf)))
    with daemon.client() as c:
        a = c.post("/api/show", json={"model": "smol"}).json()
        b = c.post("/api/show", json={"model": "smol-rt"}).json()
    for key in ("system", "parameters", "messages", "license", "template"):
        assert a.get(key) == b.get(key), key
    assert a["modelfile"].split("\n", 3)[3] == b["modelfile"].split("\n", 3)[3]


def test_cp_and_rm_share_and_prune_blobs(daemon: Daemon, smol: str) -> None:
    assert "copied 'smol' to 'smol-copy'" in ok(daemon.cli("cp", "smol", "smol-copy"))
    blobs_before = set(os.listdir(daemon.models / "blobs"))
    assert "deleted 'smol-copy'" in ok(daemon.cli("rm", "smol-copy"))
    assert set(os.listdir(daemon.models / "blobs")) == blobs_before  # shared: nothing pruned
    err = fails(daemon.cli("rm", "smol-copy"))
    assert "not found" in err


def test_rm_prunes_unshared_blobs(daemon: Daemon, smol: str, tmp_path: Path) -> None:
    mf = modelfile(tmp_path, "FROM smol\nSYSTEM only-in-this-model\n")
    ok(daemon.cli("create", "smol-sys", "-f", str(mf)))
    system_digest = "sha256:" + hashlib.sha256(b"only-in-this-model").hexdigest()
    blob = daemon.models / "blobs" / system_digest.replace(":", "-")
    assert blob.exists()
    ok(daemon.cli("rm", "smol-sys"))
    assert not blob.exists()
    assert (daemon.models / "blobs" / ("sha256-" + sha256(smollm2_q4_1()).split(":")[1])).exists()


def test_quantize_and_draft_pairing(daemon: Daemon, smol: str, tmp_path: Path) -> None:
    mf = modelfile(tmp_path, "FROM smol\n")
    start = time.perf_counter()
    ok(daemon.cli("create", "smol-f16", "-f", str(mf), "--quantize", "f16"))
    print(f"create --quantize f16 (requantise 98 MB Q4_1): {time.perf_counter() - start:.2f} s")
    with daemon.client() as c:
        show = c.post("/api/show", json={"model": "smol-f16"}).json()
        assert show["details"]["quantization_level"] == "F16"
    mf = modelfile(tmp_path, "FROM smol-f16\nDRAFT smol\nPARAMETER draft_num_predict 6\n")
    out = ok(daemon.cli("create", "smol-spec", "-f", str(mf)))
    assert "success" in out
    with daemon.client() as c:
        show = c.post("/api/show", json={"model": "smol-spec"}).json()
    draft = show["details"]["draft"]
    assert draft["kind"] == "draft_model" and draft["architecture"] == "llama"
    assert draft["parameter_size"] == "134.52M"
    assert "DRAFT " in show["modelfile"] and "draft_num_predict" in show["parameters"]
    summary = ok(daemon.cli("show", "smol-spec"))
    assert "Draft" in summary
    # A draft as large as its target is allowed, with a warning in the stream.
    assert "warning" in out.lower() and "parameters" in out.lower()


def test_draft_same_file_refused(daemon: Daemon, smol: str, tmp_path: Path) -> None:
    link(smollm2_q4_1(), tmp_path, "m.gguf")
    err = fails(
        daemon.cli(
            "create", "bad", "-f", str(modelfile(tmp_path, "FROM ./m.gguf\nDRAFT ./m.gguf\n"))
        )
    )
    assert "same local path as FROM" in err
    err = fails(
        daemon.cli("create", "bad", "-f", str(modelfile(tmp_path, "FROM smol\nDRAFT smol\n")))
    )
    assert "same file" in err


def test_draft_other_tokenizer_refused(daemon: Daemon, smol: str, tmp_path: Path) -> None:
    link(gemma3_270m(), tmp_path, "gemma.gguf")
    err = fails(
        daemon.cli(
            "create", "bad-pair", "-f", str(modelfile(tmp_path, "FROM smol\nDRAFT ./gemma.gguf\n"))
        )
    )
    assert "tokenizer" in err.lower() or "vocab" in err.lower()
    with daemon.client() as c:
        assert c.post("/api/show", json={"model": "bad-pair"}).status_code == 404


def test_mtp_and_ngram(app: FakeDaemon, tmp_path: Path) -> None:
    mtp = write_tiny_mtp(tmp_path / "mtp.gguf")
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")
    ok(app.cli("create", "tiny-mtp", "-f", str(modelfile(tmp_path, f"FROM {mtp}\nDRAFT mtp\n"))))
    with app.http_client() as c:
        show = c.post("/api/show", json={"model": "tiny-mtp"}).json()
    assert show["details"]["draft"]["kind"] == "mtp"
    assert "DRAFT mtp" in show["modelfile"]
    err = fails(
        app.cli("create", "tiny-bad", "-f", str(modelfile(tmp_path, f"FROM {tiny}\nDRAFT mtp\n")))
    )
    assert "MTP" in err
    ok(
        app.cli(
            "create", "tiny-ngram", "-f", str(modelfile(tmp_path, f"FROM {tiny}\nDRAFT ngram\n"))
        )
    )
    with app.http_client() as c:
        show = c.post("/api/show", json={"model": "tiny-ngram"}).json()
    assert show["details"]["draft"] == {"kind": "ngram"}
    assert show["draft"]["draft_num_predict"] == 16  # the bound in effect: ngram's default


def test_split_mtp_heads_file_is_a_draft(daemon: Daemon, tmp_path: Path) -> None:
    """A trunk-only target with its MTP heads in a separate file drafts like the whole model."""
    whole = write_tiny_mtp(tmp_path / "whole.gguf")
    trunk = write_tiny_mtp(tmp_path / "trunk.gguf", trunk_only=True)
    heads = write_tiny_mtp(tmp_path / "heads.gguf", mtp_only=True)
    ok(
        daemon.cli(
            "create", "tiny-whole", "-f", str(modelfile(tmp_path, f"FROM {whole}\nDRAFT mtp\n"))
        )
    )
    split = modelfile(tmp_path, f"FROM {trunk}\nDRAFT {heads}\n")
    ok(daemon.cli("create", "tiny-split", "-f", str(split)))
    body = {"prompt": "the hello world", "raw": True, "stream": False}
    body["options"] = {"temperature": 0, "num_predict": 40}
    with daemon.client() as c:
        show = c.post("/api/show", json={"model": "tiny-split"}).json()
        assert show["details"]["draft"]["kind"] == "mtp_drafter"
        want = c.post("/api/generate", json={**body, "model": "tiny-whole"}).json()
        got = c.post("/api/generate", json={**body, "model": "tiny-split"}).json()
    assert got["response"] == want["response"]
    assert got["draft_count"] > 0 and got["draft_accepted_count"] > 0
    # heads of another model are refused when the model is created
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")
    err = fails(
        daemon.cli("create", "bad", "-f", str(modelfile(tmp_path, f"FROM {tiny}\nDRAFT {heads}\n")))
    )
    assert "MTP drafter for 'hy_v3' models" in err


def test_targets_with_recurrent_state_draft(daemon: Daemon, tmp_path: Path) -> None:
    """A hybrid (qwen35 with its MTP head) and a recurrent model (mamba, n-grams) draft through
    the daemon, with the same greedy text as without a drafter; ``show`` names the drafter."""
    qwen35 = write_tiny_qwen35(tmp_path / "qwen35.gguf")
    mamba = write_tiny_mamba(tmp_path / "mamba.gguf")
    # Fixed draft lengths: what drafting learned on these weights elsewhere in the session
    # (kept per weights, SPEC-16) cannot talk these requests out of drafting.
    fixed = "PARAMETER draft_adaptive false\n"
    created = {
        "tiny-qwen35-mtp": f"FROM {qwen35}\nDRAFT mtp\n{fixed}",
        "tiny-qwen35": f"FROM {qwen35}\nDRAFT none\n",
        "tiny-mamba-ngram": f"FROM {mamba}\nDRAFT ngram\n{fixed}",
        "tiny-mamba": f"FROM {mamba}\nDRAFT none\n",
    }
    for name, text in created.items():
        ok(daemon.cli("create", name, "-f", str(modelfile(tmp_path, text))))
    body = {"prompt": "hello world the model", "raw": True, "stream": False}
    body["options"] = {"temperature": 0, "num_predict": 120}
    with daemon.client() as c:
        for drafted, plain, kind in (
            ("tiny-qwen35-mtp", "tiny-qwen35", "mtp"),
            ("tiny-mamba-ngram", "tiny-mamba", "ngram"),
        ):
            show = c.post("/api/show", json={"model": drafted}).json()
            assert show["details"]["draft"]["kind"] == kind
            want = c.post("/api/generate", json={**body, "model": plain}).json()
            got = c.post("/api/generate", json={**body, "model": drafted}).json()
            assert got["response"] == want["response"]
            assert got["draft_count"] > 0 and got["draft_accepted_count"] > 0, got
    assert "mtp" in ok(daemon.cli("show", "tiny-qwen35-mtp"))


def test_gemma4_assistant_drafts(daemon: Daemon, tmp_path: Path) -> None:
    """``DRAFT ./assistant.gguf`` on a Gemma 4 target drafts through the daemon; the assistant
    of a Gemma 4 model is refused for another architecture when the model is created."""
    target = write_tiny_gemma4(tmp_path / "gemma4.gguf")
    assistant = write_tiny_gemma4_assistant(tmp_path / "gemma4-assistant.gguf", target)
    qwen35 = write_tiny_qwen35(tmp_path / "qwen35.gguf")
    text = f"FROM {target}\nDRAFT {assistant}\n"
    ok(daemon.cli("create", "tiny-gemma4-assisted", "-f", str(modelfile(tmp_path, text))))
    ok(daemon.cli("create", "tiny-gemma4", "-f", str(modelfile(tmp_path, f"FROM {target}\n"))))
    body = {"prompt": "hello world the model", "raw": True, "stream": False}
    body["options"] = {"temperature": 0, "num_predict": 60, "draft_num_predict": 4}
    with daemon.client() as c:
        show = c.post("/api/show", json={"model": "tiny-gemma4-assisted"}).json()
        assert show["details"]["draft"]["kind"] == "mtp_drafter"
        assert show["details"]["draft"]["architecture"] == "gemma4-assistant"
        want = c.post("/api/generate", json={**body, "model": "tiny-gemma4"}).json()
        got = c.post("/api/generate", json={**body, "model": "tiny-gemma4-assisted"}).json()
    assert got["response"] == want["response"]
    assert got["draft_count"] > 0 and got["draft_accepted_count"] > 0, got
    bad = modelfile(tmp_path, f"FROM {qwen35}\nDRAFT {assistant}\n")
    err = fails(daemon.cli("create", "tiny-bad-assistant", "-f", str(bad)))
    assert "MTP drafter for 'gemma4' models" in err and "'qwen35' model" in err


def test_eagle3_and_dflash_draft(daemon: Daemon, tmp_path: Path) -> None:
    """``DRAFT ./eagle3.gguf`` and ``DRAFT ./dflash.gguf`` are recognised by architecture at
    create, draft through the daemon with the target's greedy text, and are named by ``show``;
    a head or block drafter made for another target is refused when the model is created."""
    target = write_tiny_llama(tmp_path / "tiny-llama.gguf")
    eagle3 = write_tiny_eagle3(tmp_path / "tiny-eagle3.gguf", target)
    dflash = write_tiny_dflash(tmp_path / "tiny-dflash.gguf", target)
    ok(daemon.cli("create", "tiny-layered", "-f", str(modelfile(tmp_path, f"FROM {target}\n"))))
    body = {"prompt": "hello world the model", "raw": True, "stream": False}
    body["options"] = {"temperature": 0, "num_predict": 80, "draft_num_predict": 3}
    with daemon.client() as c:
        want = c.post("/api/generate", json={**body, "model": "tiny-layered"}).json()
        for kind, draft in (("eagle3", eagle3), ("dflash", dflash)):
            name = f"tiny-{kind}"
            text = f"FROM {target}\nDRAFT {draft}\n"
            ok(daemon.cli("create", name, "-f", str(modelfile(tmp_path, text))))
            show = c.post("/api/show", json={"model": name}).json()
            assert show["details"]["draft"]["kind"] == kind, show["details"]
            got = c.post("/api/generate", json={**body, "model": name}).json()
            assert got["response"] == want["response"], kind
            assert got["draft_count"] > 0 and got["draft_accepted_count"] > 0, got
            assert kind in ok(daemon.cli("show", name))
    other = write_tiny_eagle3(tmp_path / "other-eagle3.gguf", target, target_hidden_size=128)
    bad = modelfile(tmp_path, f"FROM {target}\nDRAFT {other}\n")
    err = fails(daemon.cli("create", "tiny-bad-eagle3", "-f", str(bad)))
    assert err.startswith("Error: DRAFT other-eagle3.gguf:"), err
    assert "target hidden size 128" in err and "has hidden size 64" in err, err
    far = write_tiny_dflash(tmp_path / "other-dflash.gguf", target, target_layers=(0, 5))
    bad = modelfile(tmp_path, f"FROM {target}\nDRAFT {far}\n")
    err = fails(daemon.cli("create", "tiny-bad-dflash", "-f", str(bad)))
    assert "reads target layer 5" in err and "has 2 blocks" in err, err


def test_malformed_gguf_is_a_clear_error(app: FakeDaemon, tmp_path: Path) -> None:
    for case in ("truncated_kv", "huge_n_kv", "huge_string", "wrong_magic"):
        bad = write_malformed(tmp_path, case)
        start = time.perf_counter()
        err = fails(app.cli("create", "broken", "-f", str(modelfile(tmp_path, f"FROM {bad}\n"))))
        assert time.perf_counter() - start < 30
        assert "GGUF" in err or "gguf" in err, err
    with app.http_client() as c:
        assert c.post("/api/show", json={"model": "broken"}).status_code == 404


def test_blob_upload_rules(app: FakeDaemon) -> None:
    data = os.urandom(4096)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    wrong = "sha256:" + hashlib.sha256(b"other").hexdigest()
    with app.http_client() as c:
        assert c.head(f"/api/blobs/{digest}").status_code == 404
        r = c.post(f"/api/blobs/{wrong}", content=data)
        assert r.status_code == 400 and "digest mismatch" in r.json()["error"]
        names = os.listdir(app.models / "blobs")
        assert not any(digest.split(":")[1] in n or wrong.split(":")[1] in n for n in names)
        assert not any(n.startswith(".tmp") for n in names)
        assert c.post(f"/api/blobs/{digest}", content=data).status_code == 201
        assert c.post(f"/api/blobs/{digest}", content=data).status_code == 200
        assert c.head(f"/api/blobs/{digest}").status_code == 200
        for bad in (
            "sha256:../../etc",
            "sha256:" + "a" * 63,
            "md5:" + "a" * 32,
            "sha256-" + "A" * 64,
        ):
            assert c.post(f"/api/blobs/{bad}", content=b"x").status_code in (400, 404)


def test_bad_requests_are_4xx(app: FakeDaemon) -> None:
    with app.http_client() as c:
        assert c.post("/api/show", content=b"").json() == {"error": "missing request body"}
        cases = [
            ("POST", "/api/show", b"{not json"),
            ("POST", "/api/show", b"[]"),
            ("POST", "/api/show", b'{"model": 5}'),
            ("POST", "/api/show", b'{"model": ""}'),
            ("POST", "/api/show", b'{"model": "../../x"}'),
            ("DELETE", "/api/delete", b'{"model": "a/b/c/d"}'),
            ("POST", "/api/copy", b'{"source": "smol", "destination": "../evil"}'),
            ("POST", "/api/create", b'{"model": "x"}'),
            (
                "POST",
                "/api/create",
                b'{"model": "x", "files": {"../a.gguf": "sha256:' + b"a" * 64 + b'"}}',
            ),
            ("POST", "/api/create", b'{"model": "x", "files": {"a.gguf": "nope"}}'),
            (
                "POST",
                "/api/create",
                b'{"model": "x", "files": {"a.gguf": "sha256:' + b"a" * 64 + b'"}}',
            ),
            (
                "POST",
                "/api/create",
                b'{"model": "x", "from": "smol", "parameters": {"temperature": "hot"}}',
            ),
            ("POST", "/api/create", b'{"model": "x", "from": "smol", "quantize": "q9_z"}'),
            ("POST", "/api/create", b'{"model": "x", "from": "/etc/passwd"}'),
            ("POST", "/api/create", b'{"model": "x", "files": 3}'),
        ]
        for method, path, body in cases:
            r = c.request(method, path, content=body)
            assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)
            assert r.json()["error"], (path, body)
        assert c.get("/api/nope").status_code == 404
    assert not (app.models.parent / "evil").exists()


def test_host_and_origin_guard(app: FakeDaemon) -> None:
    with app.http_client() as c:
        for host in ("evil.example:11435", "localhost.evil.example", "127.0.0.1.nip.io"):
            assert c.get("/api/version", headers={"Host": host}).status_code == 403, host
        for host in ("LOCALHOST:1", "127.0.0.1", "[::1]:11435", "foo.localhost"):
            assert c.get("/api/version", headers={"Host": host}).status_code == 200, host
        evil = c.post(
            "/api/delete",
            headers={"Origin": "https://evil.example", "Content-Type": "text/plain"},
            content=json.dumps({"model": "smol"}),
        )
        assert evil.status_code == 403
        r = c.get("/api/version", headers={"Origin": "http://localhost:5173"})
        assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
        pre = c.options(
            "/api/tags",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
        )
        assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers


def test_ollama_client(daemon: Daemon, smol: str) -> None:
    client = ollama.Client(host=daemon.url)
    names = [m.model for m in client.list().models]
    assert "smol:latest" in names
    info = client.show("smol")
    assert info.details is not None and info.details.family == "llama"
    client.copy("smol", "smol-oc")
    assert "smol-oc:latest" in [m.model for m in client.list().models]
    progress = client.create(model="smol-oc2", from_="smol-oc", system="Be brief.")
    assert progress.status == "success"
    assert "SYSTEM Be brief." in (client.show("smol-oc2").modelfile or "")
    client.delete("smol-oc")
    client.delete("smol-oc2")
    with pytest.raises(ollama.ResponseError) as exc:
        client.show("smol-oc")
    assert exc.value.status_code == 404
    # create from an uploaded blob, as the ollama client does it
    path = smollm2_q4_1()
    digest = client.create_blob(path)
    assert client.create(model="smol-oc3", files={"smol.gguf": digest}).status == "success"
    client.delete("smol-oc3")


def test_store_invariant_after_everything(daemon: Daemon, smol: str) -> None:
    from modelhub.store import Store

    assert Store(daemon.models).verify() == []


def test_autostart(tmp_path: Path) -> None:
    """Without a daemon, the CLI starts one in the background and says so."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        MODELHUB_HOST=f"127.0.0.1:{port}",
        MODELHUB_MODELS=str(tmp_path / "m"),
        MODELHUB_CONFIG=str(tmp_path / "none.yaml"),
        XDG_STATE_HOME=str(tmp_path / "state"),
    )
    env.pop("MODELHUB_NO_AUTOSTART", None)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "modelhub", "list"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert "starting" in r.stderr.lower()
        assert httpx.get(f"http://127.0.0.1:{port}/api/version").status_code == 200
        env["MODELHUB_NO_AUTOSTART"] = "1"
        env["MODELHUB_HOST"] = f"127.0.0.1:{port + 1 if port < 65535 else port - 1}"
        r = subprocess.run(
            [sys.executable, "-m", "modelhub", "list"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 0 and "Error: " in r.stderr
    finally:
        _kill_daemons_for(f"MODELHUB_HOST=127.0.0.1:{port}")


def _kill_daemons_for(marker: str) -> None:
    """Stop the daemon the CLI started (found by its environment, since we did not spawn it)."""
    import signal

    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in environ:
            os.kill(int(proc.name), signal.SIGTERM)


def test_list_catalog(app: FakeDaemon) -> None:
    out = ok(app.cli("list", "--catalog"))
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "pinned" in rows["smollm2:135m"] and "98 MB" in rows["smollm2:135m"]
    assert "not verified here" in rows["llama3.1:8b"] and "llama3.2:1b" in rows["llama3.1:8b"]


def test_template_is_checked_at_create(app: FakeDaemon) -> None:
    with app.http_client() as c:
        r = c.post(
            "/api/create",
            json={"model": "bad-tpl", "from": "smol", "template": "{{ if .System }}unclosed"},
        )
        assert r.status_code == 400 and "template error" in r.json()["error"]
        ok_tpl = "{{ if .System }}{{ .System }}\n{{ end }}USER: {{ .Prompt }}\nASSISTANT: "
        r = c.post(
            "/api/create",
            json={"model": "good-tpl", "from": "smol", "template": ok_tpl, "stream": False},
        )
        assert r.status_code == 200, r.text
        assert c.post("/api/show", json={"model": "good-tpl"}).json()["template"] == ok_tpl
        c.request("DELETE", "/api/delete", json={"model": "good-tpl"})
