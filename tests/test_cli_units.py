"""Unit tests of the CLI's pure parts and of the client's wire handling.

Formatting (sizes, times, tables, the show summary), building create requests from
Modelfiles in temporary directories, the client against a small real loopback HTTP server,
and CLI error paths that need no daemon.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from devtools.pullservers import serve_handler
from modelhub.cli import render
from modelhub.cli.create_files import (
    hash_files,
    load_modelfile,
    relative_names,
    scan_gguf_directory,
)
from modelhub.cli.create_request import plan_create
from modelhub.cli.info import info_text
from modelhub.cli.main import cli
from modelhub.client import Client, ensure_server, is_local_address
from modelhub.config import Settings
from modelhub.errors import (
    DaemonUnreachableError,
    InputError,
    InvalidNameError,
    ModelfileError,
    ModelhubError,
    NotFoundError,
)
from modelhub.store import sha256_file

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 1, 10, 12, 0, 0, tzinfo=UTC)


# -- sizes and times ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1 KB"),
        (1500, "1.5 KB"),
        (10_500, "10 KB"),
        (98_362_432, "98 MB"),
        (637_000_000, "637 MB"),
        (2_000_000_000, "2 GB"),
        (4_700_000_000, "4.7 GB"),
        (4_749_000_000, "4.7 GB"),
        (1_000_000_000_000, "1 TB"),
        (-1, "-"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert render.format_size(size) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "Less than a second"),
        (1, "1 second"),
        (59, "59 seconds"),
        (60, "About a minute"),
        (119, "About a minute"),
        (120, "2 minutes"),
        (3599, "59 minutes"),
        (3600, "About an hour"),
        (5400, "2 hours"),  # hours are rounded
        (47 * 3600, "47 hours"),
        (48 * 3600, "2 days"),
        (13 * 86400, "13 days"),
        (14 * 86400, "2 weeks"),
        (59 * 86400, "8 weeks"),
        (60 * 86400, "2 months"),
        (729 * 86400, "24 months"),
        (730 * 86400, "2 years"),
    ],
)
def test_duration_words(seconds: float, text: str) -> None:
    assert render.format_duration_words(seconds) == text


def test_relative_time_past_future_and_unknown() -> None:
    assert render.format_relative_time(NOW - timedelta(days=2), NOW) == "2 days ago"
    assert render.format_relative_time(NOW - timedelta(seconds=70), NOW) == "About a minute ago"
    assert render.format_relative_time(NOW, NOW) == "Less than a second ago"
    assert render.format_relative_time(NOW + timedelta(minutes=4, seconds=5), NOW) == (
        "4 minutes from now"
    )
    assert render.format_relative_time(NOW + timedelta(days=365 * 30), NOW) == "Forever"
    assert render.format_relative_time(None, NOW) == "Never"
    assert render.format_relative_time("yesterday", NOW) == "Never"


def test_timestamps_with_nanoseconds_and_offsets() -> None:
    utc = render.parse_timestamp("2026-01-10T11:58:59.123456789Z")
    local = render.parse_timestamp("2026-01-10T04:59:00.5-07:00")
    assert utc is not None and local is not None
    assert render.format_relative_time("2026-01-10T11:58:59.123456789Z", NOW) == (
        "About a minute ago"
    )
    assert (utc - local).total_seconds() == pytest.approx(-1.376544, abs=1e-6)


# -- tables and the list/show output -----------------------------------------------------------


def test_table_columns_are_padded_with_four_spaces_and_no_trailing_space() -> None:
    text = render.format_table(["A", "LONGER"], [["abcdef", "x"], ["g", "yy"]])
    assert text == "A         LONGER\nabcdef    x\ng         yy\n"


def test_list_table() -> None:
    models = [
        {
            "name": "smol:latest",
            "digest": "a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
            "size": 98_363_000,
            "modified_at": (NOW - timedelta(days=2)).isoformat(),
        },
        {
            "name": "user/draft-pair:q8",
            "digest": "0123456789abcdef" * 4,
            "size": 4_700_000_000,
            "modified_at": (NOW - timedelta(seconds=5)).isoformat(),
        },
    ]
    assert render.list_table(models, NOW).splitlines() == [
        "NAME                  ID              SIZE      MODIFIED",
        "smol:latest           a80c4f17acd5    98 MB     2 days ago",
        "user/draft-pair:q8    0123456789ab    4.7 GB    5 seconds ago",
    ]
    assert render.list_table([], NOW) == "NAME    ID    SIZE    MODIFIED\n"


def test_prefix_filter_is_case_insensitive() -> None:
    models = [{"name": "Smol:latest"}, {"name": "gemma:2b"}, {"name": "smollm:x"}]
    assert [m["name"] for m in render.filter_by_prefix(models, "SMOL")] == [
        "Smol:latest",
        "smollm:x",
    ]


SHOW_PAYLOAD: dict[str, Any] = {
    "details": {
        "family": "llama",
        "parameter_size": "134.52M",
        "quantization_level": "Q8_0",
        "draft": {"kind": "draft_model", "architecture": "llama", "parameter_size": "134.52M"},
    },
    "draft": {
        "kind": "draft_model",
        "model_format": "gguf",
        "architecture": "llama",
        "parameter_size": "134.52M",
        "file_type": "Q4_1",
        "digest": "sha256:" + "ab" * 32,
        "from": "draft.gguf",
        "size": 98_362_432,
        "draft_num_predict": 6,
    },
    "model_info": {
        "general.architecture": "llama",
        "general.parameter_count": 134_515_008,
        "llama.context_length": 8192,
        "llama.embedding_length": 576,
    },
    "capabilities": ["completion"],
    "parameters": 'draft_num_predict              6\nstop                           "<|im_end|>"',
    "system": "line one\n\nline two\nline three",
    "license": "Apache-2.0",
    "requires": "0.1.0",
}


def test_show_summary_sections() -> None:
    text = render.show_summary(SHOW_PAYLOAD)
    assert text.split("\n\n")[0].splitlines() == [
        "  Model",
        "    architecture        llama",
        "    parameters          134.52M",
        "    context length      8192",
        "    embedding length    576",
        "    quantization        Q8_0",
        "    requires            0.1.0",
    ]
    titles = [
        line.strip()
        for line in text.splitlines()
        if line.startswith("  ") and not line.startswith("    ")
    ]
    assert titles == ["Model", "Capabilities", "Draft", "Parameters", "System", "License"]
    draft = text.split("  Draft\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [row.split(None, 1)[0] for row in draft] == [
        "kind",
        "from",
        "architecture",
        "parameters",
        "quantization",
        "size",
        "draft_num_predict",
    ]
    assert "98 MB" in draft[5] and draft[0].endswith("draft_model")
    assert "model_format" not in text and "abab" not in text
    system = text.split("  System\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.strip() for line in system] == ["line one", "line two", "..."]
    assert '    stop                 "<|im_end|>"' in text
    assert "Metadata" not in text


def test_show_summary_falls_back_to_details_and_verbose_adds_metadata() -> None:
    payload = {
        "details": {"family": "gemma3", "draft": {"kind": "ngram"}},
        "model_info": {
            "general.architecture": "gemma3",
            "general.parameter_count": 268_098_176,
            "gemma3.block_count": 18,
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(262_144)],
        },
        "tensors": [{"name": "token_embd.weight", "type": "Q8_0", "shape": [640, 262144]}],
    }
    text = render.show_summary(payload, verbose=True)
    assert "    architecture    gemma3\n    parameters      268M\n" in text
    assert "  Draft\n    kind    ngram\n" in text
    assert "gemma3.block_count" in text and "token_embd.weight" in text
    assert "[640, 262144]" in text
    assert "[t0, t1, t2, t3, t4, ... (262144 items)]" in text and len(text) < 2000


def test_show_summary_says_where_a_loaded_model_runs() -> None:
    runtime = {
        "offload": "2 layers did not fit",
        "devices": ["Vulkan0"],
        "layers_offloaded": 28,
        "size_vram": 90_000_000,
        "draft_devices": ["Vulkan0"],
    }
    text = render.show_summary({**SHOW_PAYLOAD, "runtime": runtime})
    loaded = text.split("  Loaded\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [row.split("  ", 3)[2] for row in loaded] == [
        "devices",
        "layers offloaded",
        "device memory",
        "draft devices",
        "offload",
    ]
    assert loaded[1].endswith(" 28") and "90 MB" in loaded[2] and loaded[4].endswith("did not fit")
    on_cpu = render.show_summary({**SHOW_PAYLOAD, "runtime": {"devices": [], "offload": ""}})
    assert "  Loaded\n    devices    CPU\n" in on_cpu
    assert "Loaded" not in render.show_summary(SHOW_PAYLOAD)  # not loaded: no section


def test_info_says_whether_layers_can_leave_the_cpu() -> None:
    cpu = {"name": "CPU", "type": "cpu"}
    gpu = {"name": "Vulkan0", "type": "gpu", "memory_free": 2 << 30, "memory_total": 2 << 30}

    def offload(system: dict) -> str:
        line = next(x for x in info_text({"system": system}).splitlines() if "GPU offload" in x)
        return line.split(":", 1)[1].strip()

    assert offload({"gpu_offload": False, "devices": [cpu]}) == "not in this build"
    assert offload({"gpu_offload": True, "devices": [cpu, gpu]}) == "possible: Vulkan0"
    assert offload({"gpu_offload": True, "devices": [cpu]}).startswith(
        "compiled in, but no GPU device found"
    )


# -- create requests from Modelfiles -----------------------------------------------------------


def gguf(path: Path, payload: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + payload + path.name.encode())
    return path


def sha(path: Path) -> str:
    return sha256_file(path)[0]


def test_from_file_builds_files_with_digests(tmp_path: Path) -> None:
    base = gguf(tmp_path / "models" / "base.gguf")
    plan = plan_create("mine", "FROM ./models/base.gguf\n", tmp_path)
    assert plan.files == {"base.gguf": base}
    body = plan.request(hash_files(plan.local_files()))
    assert body == {"model": "mine", "files": {"base.gguf": sha(base)}}


def test_from_name_is_sent_verbatim(tmp_path: Path) -> None:
    plan = plan_create("mine", "FROM Smol:Q8\nSYSTEM be brief\n", tmp_path)
    assert plan.request({}) == {"model": "mine", "from": "Smol:Q8", "system": "be brief"}


def test_a_file_next_to_the_modelfile_wins_over_a_model_name(tmp_path: Path) -> None:
    gguf(tmp_path / "llama3")
    plan = plan_create("mine", "FROM llama3\n", tmp_path)
    assert list(plan.files) == ["llama3"] and "from" not in plan.fields


def test_paths_absolute_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    in_home = gguf(home / "m" / "a.gguf")
    elsewhere = gguf(tmp_path / "abs" / "b.gguf")
    monkeypatch.setenv("HOME", str(home))
    plan = plan_create("x", f"FROM ~/m/a.gguf\nFROM {elsewhere}\n", tmp_path / "unused")
    # Names are relative to the common parent of all FROM files.
    assert plan.files == {"home/m/a.gguf": in_home, "abs/b.gguf": elsewhere}


def test_directory_scan_takes_gguf_files_only(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    first, second = gguf(weights / "a.gguf"), gguf(weights / "b.gguf")
    (weights / "README.md").write_text("not a model")
    gguf(weights / "sub" / "deeper.gguf")
    assert scan_gguf_directory(weights) == [first, second]
    plan = plan_create("x", "FROM weights\n", tmp_path)
    assert plan.files == {"a.gguf": first, "b.gguf": second}


def test_directory_without_gguf_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelfileError, match=r"\(line 1\): FROM empty: directory .* holds no GGUF"):
        plan_create("x", "FROM empty\n", tmp_path)
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "model.safetensors").write_bytes(b"{}")
    with pytest.raises(ModelfileError, match=r"safetensors .* convert them to GGUF"):
        plan_create("x", "FROM st\n", tmp_path)


def test_missing_gguf_path_is_not_taken_for_a_model_name(tmp_path: Path) -> None:
    with pytest.raises(ModelfileError, match=r"FROM x\.gguf: no such file: .*x\.gguf"):
        plan_create("x", "FROM x.gguf\n", tmp_path)
    with pytest.raises(ModelfileError, match=r"FROM \./gone: no such file, and not a model name"):
        plan_create("x", "FROM ./gone\n", tmp_path)


def test_relative_names() -> None:
    assert relative_names([Path("/a/b/c.gguf")]) == {"c.gguf": Path("/a/b/c.gguf")}
    assert list(relative_names([Path("/a/b/c.gguf"), Path("/a/d/e.gguf")])) == [
        "b/c.gguf",
        "d/e.gguf",
    ]
    assert relative_names([]) == {}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("DRAFT mtp", "mtp"),
        ("DRAFT NGRAM", "ngram"),
        ("DRAFT smollm2:135m", "smollm2:135m"),
        ("DRAFT user/draft", "user/draft"),
    ],
)
def test_draft_keywords_and_model_names(tmp_path: Path, line: str, expected: str) -> None:
    gguf(tmp_path / "base.gguf")
    plan = plan_create("x", f"FROM ./base.gguf\n{line}\n", tmp_path)
    assert plan.fields["draft"] == expected and plan.draft_files == {}
    assert plan.request({p: "sha256:0" for p in plan.local_files()})["draft"] == expected


def test_draft_file_and_directory(tmp_path: Path) -> None:
    gguf(tmp_path / "base.gguf")
    draft = gguf(tmp_path / "drafts" / "small.gguf")
    plan = plan_create("x", "FROM base.gguf\nDRAFT drafts/small.gguf\n", tmp_path)
    assert plan.draft_files == {"small.gguf": draft} and "draft" not in plan.fields
    plan = plan_create("x", "FROM base.gguf\nDRAFT ./drafts\n", tmp_path)
    assert plan.draft_files == {"small.gguf": draft}
    body = plan.request(hash_files(plan.local_files()))
    assert body["draft_files"] == {"small.gguf": sha(draft)}


def test_draft_that_is_neither_path_nor_name(tmp_path: Path) -> None:
    gguf(tmp_path / "base.gguf")
    with pytest.raises(ModelfileError) as caught:
        plan_create("x", "FROM base.gguf\n\nDRAFT ./missing/draft\n", tmp_path)
    assert caught.value.line == 3
    assert "DRAFT ./missing/draft: no such file, and not a model name" in str(caught.value)


def test_draft_same_path_as_from_in_either_order(tmp_path: Path) -> None:
    model = gguf(tmp_path / "m.gguf")
    os.symlink(model, tmp_path / "alias.gguf")
    for text in ("FROM ./m.gguf\nDRAFT alias.gguf\n", "DRAFT ./m.gguf\nFROM m.gguf\n"):
        with pytest.raises(ModelfileError) as caught:
            plan_create("x", text, tmp_path)
        assert caught.value.line == 2
        assert f"DRAFT must not reference the same local path as FROM: {model}" in str(caught.value)


def test_from_directory_skips_the_draft_file_next_to_it(tmp_path: Path) -> None:
    base, draft = gguf(tmp_path / "base.gguf"), gguf(tmp_path / "draft.gguf")
    plan = plan_create("x", "FROM .\nDRAFT ./draft.gguf\n", tmp_path)
    assert plan.files == {"base.gguf": base}
    assert plan.draft_files == {"draft.gguf": draft}


def test_draft_kinds_cannot_be_mixed(tmp_path: Path) -> None:
    gguf(tmp_path / "base.gguf")
    gguf(tmp_path / "d.gguf")
    with pytest.raises(ModelfileError, match=r"DRAFT mtp: conflicts with a DRAFT file"):
        plan_create("x", "FROM base.gguf\nDRAFT d.gguf\nDRAFT mtp\n", tmp_path)
    with pytest.raises(ModelfileError, match=r"DRAFT ngram: conflicts with DRAFT mtp"):
        plan_create("x", "FROM base.gguf\nDRAFT mtp\nDRAFT ngram\n", tmp_path)
    assert plan_create("x", "FROM b\nDRAFT mtp\nDRAFT MTP\n", tmp_path).fields["draft"] == "mtp"


def test_one_draft_file_only(tmp_path: Path) -> None:
    gguf(tmp_path / "base.gguf")
    gguf(tmp_path / "drafts" / "a.gguf")
    gguf(tmp_path / "drafts" / "b.gguf")
    with pytest.raises(ModelfileError, match=r"DRAFT resolves to 2 GGUF files \(a.gguf, b.gguf\)"):
        plan_create("x", "FROM base.gguf\nDRAFT drafts\n", tmp_path)


def test_quantize_flags(tmp_path: Path) -> None:
    gguf(tmp_path / "base.gguf")
    gguf(tmp_path / "d.gguf")
    plan = plan_create("x", "FROM base.gguf\n", tmp_path, quantize="q8_0")
    assert plan.fields["quantize"] == "q8_0"
    with pytest.raises(InputError, match=r"^--draft-quantize requires a DRAFT model$"):
        plan_create("x", "FROM base.gguf\n", tmp_path, draft_quantize="q8_0")
    with pytest.raises(InputError, match="DRAFT mtp is not a file"):
        plan_create("x", "FROM base.gguf\nDRAFT mtp\n", tmp_path, draft_quantize="q8_0")
    plan = plan_create("x", "FROM base.gguf\nDRAFT d.gguf\n", tmp_path, draft_quantize="f16")
    assert plan.fields["draft_quantize"] == "f16"


def test_every_instruction_maps_onto_the_request(tmp_path: Path) -> None:
    gguf(tmp_path / "base.gguf")
    adapter = gguf(tmp_path / "lora" / "adapter.gguf")
    text = (
        "FROM base.gguf\n"
        'TEMPLATE """{{ .Prompt }}"""\n'
        "SYSTEM You are terse.\n"
        "PARAMETER temperature 0.2\n"
        "PARAMETER stop <|im_end|>\n"
        "PARAMETER stop <|endoftext|>\n"
        "PARAMETER draft_num_predict 6\n"
        "PARAMETER mirostat 1\n"
        "LICENSE MIT\n"
        'LICENSE """second\nlicense"""\n'
        "MESSAGE user Hi: there\n"
        "MESSAGE assistant Hello!\n"
        "REQUIRES v0.2\n"
        "RENDERER qwen3\n"
        "PARSER qwen3\n"
        "ADAPTER ./nothing-here-is-used-because-the-last-wins.gguf\n"
    )
    with pytest.raises(ModelfileError, match=r"line 17.*ADAPTER .*: no such file"):
        plan_create("x", text, tmp_path)
    plan = plan_create("x", text.replace("./nothing-here", "./lora/adapter.gguf\n#"), tmp_path)
    assert plan.warnings == ["parameter mirostat is deprecated"]
    assert plan.adapters == {"adapter.gguf": adapter}
    body = plan.request(hash_files(plan.local_files()))
    assert body["template"] == "{{ .Prompt }}"
    assert body["system"] == "You are terse."
    assert body["parameters"] == {
        "temperature": 0.2,
        "stop": ["<|im_end|>", "<|endoftext|>"],
        "draft_num_predict": 6,
    }
    assert body["license"] == ["MIT", "second\nlicense"]
    assert body["messages"] == [
        {"role": "user", "content": "Hi: there"},
        {"role": "assistant", "content": "Hello!"},
    ]
    assert body["requires"] == "0.2"
    assert body["renderer"] == body["parser"] == "qwen3"
    assert body["adapters"] == {"adapter.gguf": sha(adapter)}


def test_bad_values_name_their_line(tmp_path: Path) -> None:
    with pytest.raises(ModelfileError) as caught:
        plan_create("x", "FROM m\nPARAMETER num_ctx many\n", tmp_path)
    assert caught.value.line == 2
    with pytest.raises(ModelfileError) as caught:
        plan_create("x", "FROM m\nREQUIRES later\n", tmp_path)
    assert caught.value.line == 2


def test_invalid_target_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidNameError, match="invalid model name"):
        plan_create("bad name!", "FROM m\n", tmp_path)


def test_load_modelfile_rules(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"Modelfile not found: nope/Modelfile \(looked for .*"):
        load_modelfile("nope/Modelfile", tmp_path)
    with pytest.raises(InputError, match=r"no Modelfile in .* -f FILE"):
        load_modelfile(None, tmp_path)
    gguf(tmp_path / "only.gguf")
    implicit = load_modelfile(None, tmp_path)
    assert implicit.text == "FROM .\n" and implicit.base_dir == tmp_path
    with pytest.raises(InputError, match=r"only\.gguf is a GGUF model, not a Modelfile"):
        load_modelfile("only.gguf", tmp_path)
    with pytest.raises(InputError, match="is a directory"):
        load_modelfile(".", tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "Custom").write_text("FROM ./x.gguf\n")
    explicit = load_modelfile("sub/Custom", tmp_path)
    assert explicit.base_dir == tmp_path / "sub" and explicit.label == "sub/Custom"
    (tmp_path / "Modelfile").write_text("FROM y\n")
    assert load_modelfile(None, tmp_path).text == b"FROM y\n"


# -- the client against a real loopback HTTP server --------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """Answers like the daemon for a handful of routes; records uploads."""

    uploads: dict[str, bytes] = {}  # noqa: RUF012 - shared by design between requests

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        if self.path == "/":
            self._send(200)
        elif self.path.startswith("/api/blobs/"):
            self._send(200 if self.path.rsplit("/", 1)[1] in self.uploads else 404)
        else:
            self._send(404)

    def do_GET(self) -> None:
        if self.path == "/api/version":
            self._send(200, b'{"version":"9.9.9"}')
        elif self.path == "/api/tags":
            self._send(200, b'{"models":[{"name":"a:latest"}]}')
        else:
            self._send(404, b"404 page not found", "text/plain")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.path.startswith("/api/blobs/"):
            self.uploads[self.path.rsplit("/", 1)[1]] = body
            self._send(201)
        elif self.path == "/api/show":
            self._send(404, b'{"error":"model \'nope:latest\' not found"}')
        elif self.path == "/api/create":
            request = json.loads(body)
            if request["model"] == "refused":
                self._send(400, b'{"error":"invalid model name"}')
                return
            if request["model"] == "dies":  # the daemon goes away mid-stream
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b'{"status":"parsing GGUF"}\n')
                self.close_connection = True
                return
            warned = {"status": "warning: draft is large", "warning": "draft is large"}
            lines = [{"status": "parsing GGUF"}, warned]
            lines.append(
                {"error": "boom"} if request["model"] == "midway" else {"status": "success"}
            )
            self._send(
                200, b"".join(json.dumps(x).encode() + b"\n" for x in lines), "application/x-ndjson"
            )


@pytest.fixture(scope="module")
def fake_daemon() -> Iterator[str]:
    with serve_handler(_Handler) as address:
        yield address


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_client_json_calls_and_errors(fake_daemon: str) -> None:
    with Client(fake_daemon) as client:
        assert client.base_url == f"http://{fake_daemon}"
        assert client.heartbeat()
        assert client.version() == "9.9.9"
        assert client.list() == [{"name": "a:latest"}]
        with pytest.raises(NotFoundError) as caught:
            client.show("nope")
        assert caught.value.status == 404 and str(caught.value) == "model 'nope:latest' not found"
        with pytest.raises(NotFoundError, match="404 page not found"):
            client.request_json("GET", "/api/unknown")


def test_client_streams_and_stops_at_error_lines(fake_daemon: str) -> None:
    with Client(fake_daemon) as client:
        statuses = [item["status"] for item in client.create({"model": "ok"})]
        assert statuses == ["parsing GGUF", "warning: draft is large", "success"]
        seen = []
        with pytest.raises(ModelhubError) as caught:
            for item in client.create({"model": "midway"}):
                seen.append(item["status"])
        assert seen == ["parsing GGUF", "warning: draft is large"] and str(caught.value) == "boom"
        assert type(caught.value) is ModelhubError  # a failure mid-stream has no status
        with pytest.raises(InputError) as caught:
            list(client.create({"model": "refused"}))
        assert str(caught.value) == "invalid model name"  # the daemon's words, no status line
        assert caught.value.status == 400
        seen = []
        with pytest.raises(
            DaemonUnreachableError, match=r"the connection to modelhub at .* failed"
        ):
            for item in client.create({"model": "dies"}):
                seen.append(item["status"])
        assert seen == ["parsing GGUF"]


def test_client_uploads_blobs_in_chunks(fake_daemon: str, tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    calls: list[tuple[int, int]] = []
    with Client(fake_daemon) as client:
        assert not client.blob_exists(digest)
        client.push_blob(digest, path, lambda sent, total: calls.append((sent, total)))
        assert client.blob_exists(digest)
    assert _Handler.uploads[digest] == data
    assert calls[0] == (0, len(data)) and calls[-1] == (len(data), len(data)) and len(calls) == 5


def test_nothing_listening_is_server_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{closed_port()}"
    with Client(address) as client:
        assert not client.heartbeat()
        with pytest.raises(
            DaemonUnreachableError, match=f"could not connect to modelhub at http://{address}"
        ):
            client.list()
    monkeypatch.setenv("MODELHUB_CONFIG", str(tmp_path / "none.yaml"))
    settings = Settings.from_env({"MODELHUB_HOST": address, "MODELHUB_NO_AUTOSTART": "1"})
    with Client(settings.base_url) as client, pytest.raises(DaemonUnreachableError) as caught:
        ensure_server(client, settings)
    assert str(caught.value) == (
        f"could not connect to modelhub at http://{address}: start it with `modelhub serve`"
    )


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1:11435", True),
        ("localhost", True),
        ("[::1]:9000", True),
        ("0.0.0.0", True),
        ("example.com", False),
        ("https://models.example.com/hub", False),
    ],
)
def test_autostart_only_for_addresses_on_this_machine(host: str, local: bool) -> None:
    assert is_local_address(Settings.from_env({"MODELHUB_HOST": host}).base_url) is local


# -- the CLI without a daemon -----------------------------------------------------------------


@pytest.fixture
def offline_env(tmp_path: Path) -> dict[str, str]:
    return {
        "MODELHUB_HOST": f"127.0.0.1:{closed_port()}",
        "MODELHUB_NO_AUTOSTART": "1",
        "MODELHUB_CONFIG": str(tmp_path / "none.yaml"),
    }


def test_cli_errors_are_one_line_without_traceback(
    tmp_path: Path, offline_env: dict[str, str]
) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["list"], env=offline_env)
    assert result.exit_code == 69  # the daemon cannot be reached (docs/cli.md, "Errors")
    assert result.stderr.startswith("Error: could not connect to modelhub at http://127.0.0.1:")
    assert "Traceback" not in result.output

    result = runner.invoke(cli, ["show", "m", "--license", "--system"], env=offline_env)
    assert result.exit_code == 1 and "Error: only one of --license, --modelfile" in result.stderr

    mf = tmp_path / "Modelfile"
    mf.write_text("FROM m\nPARAMETER temperature hot\n")
    result = runner.invoke(cli, ["create", "m", "-f", str(mf)], env=offline_env)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {mf} (line 2): ")

    result = runner.invoke(cli, ["create", "m", "-f", str(tmp_path / "absent")], env=offline_env)
    assert result.exit_code == 1 and "Modelfile not found" in result.stderr


def test_cli_version_without_a_daemon(offline_env: dict[str, str]) -> None:
    result = CliRunner().invoke(cli, ["--version"], env=offline_env)
    assert result.exit_code == 0
    assert "Warning: could not connect to a running modelhub daemon" in result.stderr


def test_cli_against_the_loopback_server(fake_daemon: str, tmp_path: Path) -> None:
    env = {"MODELHUB_HOST": fake_daemon, "MODELHUB_CONFIG": str(tmp_path / "none.yaml")}
    runner = CliRunner()
    result = runner.invoke(cli, ["--version"], env=env)
    assert result.stdout == "modelhub version is 9.9.9\n"
    assert "Warning: client version is" in result.stderr
    base = gguf(tmp_path / "base.gguf", os.urandom(64))
    (tmp_path / "Modelfile").write_text("FROM ./base.gguf\nPARAMETER mirostat 1\n")
    result = runner.invoke(cli, ["create", "mine", "-f", str(tmp_path / "Modelfile")], env=env)
    assert result.exit_code == 0, result.output
    assert _Handler.uploads[sha(base)] == base.read_bytes()
    lines = result.stdout.splitlines()
    assert "warning: parameter mirostat is deprecated" in lines
    assert "parsing GGUF" in lines and "warning: draft is large" in lines and lines[-1] == "success"
    result = runner.invoke(cli, ["create", "midway", "-f", str(tmp_path / "Modelfile")], env=env)
    assert result.exit_code == 1 and result.stderr == "Error: boom\n"


def test_help_lists_environment_and_python_m_works() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"])
    for variable in ("MODELHUB_HOST", "MODELHUB_MODELS", "MODELHUB_KEEP_ALIVE", "MODELHUB_ORIGINS"):
        assert variable in result.output
    done = subprocess.run(
        [sys.executable, "-m", "modelhub", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0
    for command in ("create", "list", "ls", "show", "cp", "rm", "serve"):
        assert f"  {command} " in done.stdout


def _processes_with_env(marker: bytes) -> list[int]:
    """PIDs of processes whose environment holds ``marker`` (ours: a unique host:port)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the started daemon through /proc")
def test_autostart_starts_a_daemon_and_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MODELHUB_HOST", address)
    monkeypatch.setenv("MODELHUB_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("MODELHUB_CONFIG", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("MODELHUB_NO_AUTOSTART", raising=False)
    settings = Settings.from_env()
    try:
        with Client(settings.base_url) as client:
            ensure_server(client, settings)
            assert client.heartbeat() and client.list() == []
            ensure_server(client, settings)  # already running: nothing more is started
        err = capsys.readouterr().err
        assert err.count("starting one") == 1
        assert f"modelhub: no daemon at http://{address}; starting one (log: " in err
        assert (tmp_path / "state" / "modelhub" / "log" / "server.log").is_file()
    finally:
        for pid in _processes_with_env(f"MODELHUB_HOST={address}".encode()):
            if pid != os.getpid():
                os.kill(pid, 15)
