"""`modelhub run` attaching image files named in the prompt, as `ollama run` does (issue 23):
which paths are taken, what is left in the prompt, what is refused; the REPL's chat turn; and
through a real daemon, `run MODEL "describe ./photo.png"` answers as the API does with that
image."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from modelhub.cli import repl
from modelhub.cli.images import attach, extract_images, image_kind
from modelhub.errors import InputError

VISION = {"capabilities": ["completion", "vision"]}


def write_png(path: Path, seed: int = 1) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    path.write_bytes(out.getvalue())
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_paths_that_name_images_are_attached_and_taken_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    a = write_png(tmp_path / "photo.png", 1)
    (tmp_path / "my pics").mkdir()
    b = write_png(tmp_path / "my pics" / "b.JPG", 2)  # the content decides, not the name
    c = write_png(tmp_path / "quoted one.webp", 3)
    prompt = f"compare ./photo.png, ./my\\ pics/b.JPG and '{tmp_path}/quoted one.webp' please"
    found = extract_images(prompt)
    assert found.paths == ["./photo.png", "./my\\ pics/b.JPG", f"{tmp_path}/quoted one.webp"]
    assert found.images == [b64(a), b64(b), b64(c)]
    assert found.prompt == "compare , and please"


def test_paths_that_name_no_file_stay_in_the_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_png(tmp_path / "here.png")
    (tmp_path / "dir.png").mkdir()
    prompt = "what about ./missing.png, ./dir.png, photo/here.png, here.png and ./here.pngx?"
    found = extract_images(prompt)
    assert (found.prompt, found.paths, found.images) == (prompt, [], [])


def test_a_file_that_is_not_an_image_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake.png").write_text("not an image")
    with pytest.raises(InputError, match=r"\./fake\.png is not an image \(PNG, JPEG, WebP"):
        extract_images("look at ./fake.png")


def test_image_kinds_by_their_first_bytes() -> None:
    assert image_kind(b"\x89PNG\r\n\x1a\n....") == "PNG"
    assert image_kind(b"\xff\xd8\xff\xe0") == "JPEG"
    assert image_kind(b"GIF89a") == "GIF"
    assert image_kind(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "WebP"
    assert image_kind(b"RIFF\x00\x00\x00\x00WAVEfmt ") is None
    assert image_kind(b"") is None


def test_only_a_model_that_reads_images_gets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_png(tmp_path / "photo.png")
    said: list[str] = []
    plain = attach("describe ./photo.png", {"capabilities": ["completion"]}, said.append)
    assert (plain.prompt, plain.images, said) == ("describe ./photo.png", [], [])
    seen = attach("describe ./photo.png", VISION, said.append)
    assert seen.prompt == "describe" and len(seen.images) == 1
    assert said == ["Added image './photo.png'"]


class _Recording:
    """A client whose chat stream answers "ok" and remembers the bodies it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def stream(self, method: str, path: str, body: dict[str, Any]) -> Any:
        self.bodies.append(body)
        yield {"message": {"role": "assistant", "content": "ok"}, "done": False}
        yield {"message": {"role": "assistant", "content": ""}, "done": True}


def test_the_chat_attaches_images_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = write_png(tmp_path / "photo.png")
    (tmp_path / "fake.gif").write_text("no")
    out, err = io.StringIO(), io.StringIO()
    client = _Recording()
    session = repl.Repl(client, repl.ReplState("seer"), VISION, out=out, err=err)  # type: ignore[arg-type]
    assert session.submit(repl.Submission("line", "what is in ./photo.png?"))
    assert "Added image './photo.png'" in err.getvalue()
    first = session.state.messages[0]
    assert first == {"role": "user", "content": "what is in ?", "images": [b64(data)]}
    assert session.submit(repl.Submission("line", "and ./fake.gif"))
    assert "Error: ./fake.gif is not an image" in err.getvalue()
    assert len(client.bodies) == 1 and len(session.state.messages) == 2  # nothing was sent


@pytest.mark.slow
def test_run_attaches_the_named_image_through_the_daemon(daemon: Any, tmp_path: Path) -> None:
    from devtools.realmodels import smollm2_q4_1
    from tests.fixtures.synthetic_projector import write_projector

    proj = write_projector(tmp_path / "mmproj-smol.gguf")
    mf = tmp_path / "Modelfile"
    mf.write_text(
        f"FROM {smollm2_q4_1()}\nFROM {proj}\nPARAMETER temperature 0\n"
        "PARAMETER num_predict 12\nPARAMETER seed 1\n"
    )
    assert daemon.cli("create", "smol-vision-cli", "-f", str(mf)).returncode == 0
    data = write_png(tmp_path / "photo.png", 7)
    run = daemon.cli("run", "smol-vision-cli", "describe ./photo.png", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Added image './photo.png'" in run.stderr
    api = httpx.post(
        daemon.url + "/api/generate",
        json={"model": "smol-vision-cli", "prompt": "describe", "images": [b64(data)]},
        timeout=120,
    )
    answer = "".join(json.loads(line).get("response", "") for line in api.text.splitlines())
    assert run.stdout.strip() == answer.strip() and answer.strip()
    without = daemon.cli("run", "smol-vision-cli", "describe", cwd=tmp_path)
    assert without.stdout.strip() != run.stdout.strip()
