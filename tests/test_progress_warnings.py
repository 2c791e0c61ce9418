"""Warnings in pull and create streams are typed, end to end: the library reports a
``ProgressEvent`` whose ``warning`` field is set, the stream's JSON object carries it as its own
``warning`` key beside the ``status`` line Ollama's clients print, and the CLI recognises a
warning by that key. Nothing in ``modelhub/`` recognises one by a ``warning:`` text prefix."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from modelhub.cli import pull
from modelhub.cli.progress import ProgressDisplay
from modelhub.pull import ProgressEvent
from modelhub.store import sha256_file
from tests.fakes.daemon import FakeDaemon, fake_daemon
from tests.fixtures.synthetic import write_tiny_llama_pair

MODELHUB = Path(__file__).resolve().parent.parent / "modelhub"


def test_a_warning_is_a_field_and_its_status_reads_as_before() -> None:
    event = ProgressEvent.warn("draft is large")
    assert event.warning == "draft is large"
    assert event.to_json() == {"status": "warning: draft is large", "warning": "draft is large"}
    assert ProgressEvent("success").to_json() == {"status": "success"}
    # Ollama's rule: fields that are not set are left out; a transfer's zero total stays.
    assert ProgressEvent("pulling 8eeb52dfb3bb", "sha256:8eeb", 0).to_json() == {
        "status": "pulling 8eeb52dfb3bb",
        "digest": "sha256:8eeb",
        "total": 0,
    }
    assert ProgressEvent("warning: not one").warning is None  # a prefix makes no warning


def test_no_module_recognises_a_warning_by_its_text() -> None:
    prefix = re.compile(r"""startswith\(\s*\(?\s*f?["']warning""", re.IGNORECASE)
    offenders = [
        f"{path.relative_to(MODELHUB.parent)}:{number}"
        for path in sorted(MODELHUB.rglob("*.py"))
        for number, text in enumerate(path.read_text().splitlines(), 1)
        if prefix.search(text)
    ]
    assert offenders == [], f"a warning is recognised by its text prefix in {offenders}"


def _terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, color_system="standard", width=200)


def _styled(console: Console, text: str) -> bool:
    """Whether ``text`` was written in a style (ANSI codes right before it)."""
    return bool(re.search(r"\x1b\[[0-9;]+m" + re.escape(text), console.file.getvalue()))  # type: ignore[attr-defined]


def test_the_cli_shows_warnings_by_their_field() -> None:
    stream = [
        {"status": "pulling manifest"},
        {
            "status": "warning: source registry x failed: gone",
            "warning": "source registry x failed: gone",
        },
        {"status": "warning: from another server"},  # no field: an ordinary status
        {"status": "success"},
    ]
    pulled, created = _terminal(), _terminal()
    with pull.PullDisplay(pulled) as display:
        for item in stream:
            display.item(item)
    with ProgressDisplay(created) as progress:
        for item in stream:
            progress.stream_item(item)
    for console in (pulled, created):
        assert _styled(console, "warning: source registry x failed: gone")
        assert not _styled(console, "warning: from another server")
        assert "warning: from another server" in console.file.getvalue()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    with fake_daemon(tmp_path_factory.mktemp("warnings")) as d:
        yield d


def test_a_create_stream_carries_a_warning_in_its_own_field(app: FakeDaemon) -> None:
    """A draft as large as its target: created, with the pairing check's warning."""
    target, draft = write_tiny_llama_pair(app.tmp)
    digests = {}
    for path in (target, draft):
        digests[path.name], _ = sha256_file(path)
        app.client.push_blob(digests[path.name], path)
    body = {
        "model": "paired",
        "files": {target.name: digests[target.name]},
        "draft_files": {draft.name: digests[draft.name]},
    }
    response = app.http.post("/api/create", json=body)
    lines = [json.loads(line) for line in response.text.splitlines()]
    warnings = [line for line in lines if "warning" in line]
    assert len(warnings) == 1, lines
    (warning,) = warnings
    assert "more than a tenth of the target's" in warning["warning"]
    assert warning == {"status": f"warning: {warning['warning']}", "warning": warning["warning"]}
    assert lines[-1] == {"status": "success"}
