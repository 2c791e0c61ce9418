"""`modelhub run` attaching audio files named in the prompt, as `ollama run` attaches WAV files
(issue 23): .wav and .mp3 paths taken for a model that takes audio, left as text for one that
does not, refused when the file is not audio; and through a real daemon, `run MODEL "what is
said in ./clip.wav"` answers as the API does with that clip."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from modelhub.cli.images import attach, extract_images, is_audio
from modelhub.cli.main import cli
from modelhub.errors import InputError
from tests.fixtures.synthetic_audio_projector import mp3_bytes, tone, wav_bytes

AUDIO = {"capabilities": ["completion", "audio"]}
BOTH = {"capabilities": ["completion", "vision", "audio"]}
PNG = b"\x89PNG\r\n\x1a\n" + bytes(32)


def test_audio_paths_are_attached_for_a_model_that_hears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    wav = wav_bytes(tone(440, 0.2))
    (tmp_path / "clip.wav").write_bytes(wav)
    (tmp_path / "song.mp3").write_bytes(mp3_bytes(tone(440, 0.2)))
    (tmp_path / "photo.png").write_bytes(PNG)
    said: list[str] = []
    found = attach("compare ./clip.wav and ./song.mp3 with ./photo.png", AUDIO, said.append)
    assert found.paths == ["./clip.wav", "./song.mp3"] and found.kinds == ["audio", "audio"]
    assert found.prompt == "compare and with ./photo.png"  # an image stays text: no vision
    assert base64.b64decode(found.images[0]) == wav
    assert said == ["Added audio './clip.wav'", "Added audio './song.mp3'"]
    both = attach("compare ./clip.wav with ./photo.png", BOTH, said.append)
    assert both.kinds == ["audio", "image"] and both.prompt == "compare with"
    deaf = attach("play ./clip.wav", {"capabilities": ["completion", "vision"]}, said.append)
    assert deaf.prompt == "play ./clip.wav" and not deaf.images


def test_a_file_that_is_not_audio_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake.wav").write_bytes(b"not a wav at all")
    with pytest.raises(InputError, match=r"\./fake\.wav is not audio \(WAV or MP3\)"):
        extract_images("what is in ./fake.wav", kinds=("audio",))


def test_audio_by_its_first_bytes() -> None:
    assert is_audio(wav_bytes(tone(440, 0.01))[:16])
    assert is_audio(b"ID3\x04\x00")
    assert is_audio(mp3_bytes(tone(440, 0.2))[:16])
    assert not is_audio(PNG[:16]) and not is_audio(b"\xff\xd8\xff\xe0")  # a JPEG


@pytest.mark.slow
def test_run_attaches_the_named_clip_through_the_daemon(daemon: Any, tmp_path: Path) -> None:
    from devtools.realmodels import smollm2_q4_1
    from tests.fixtures.synthetic_audio_projector import write_audio_projector

    proj = write_audio_projector(tmp_path / "mmproj-audio.gguf")
    mf = tmp_path / "Modelfile"
    mf.write_text(
        f"FROM {smollm2_q4_1()}\nFROM {proj}\nPARAMETER temperature 0\n"
        "PARAMETER num_predict 12\nPARAMETER seed 1\n"
    )
    assert daemon.cli("create", "smol-audio-cli", "-f", str(mf)).returncode == 0
    data = wav_bytes(tone(500, 8.0, noise=7))
    (tmp_path / "clip.wav").write_bytes(data)
    run = daemon.cli("run", "smol-audio-cli", "what is said in ./clip.wav", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Added audio './clip.wav'" in run.stderr
    api = httpx.post(
        daemon.url + "/api/generate",
        json={
            "model": "smol-audio-cli",
            "prompt": "what is said in",
            "images": [base64.b64encode(data).decode()],
        },
        timeout=120,
    )
    answer = "".join(json.loads(line).get("response", "") for line in api.text.splitlines())
    assert run.stdout.strip() == answer.strip() and answer.strip()
    without = daemon.cli("run", "smol-audio-cli", "what is said in", cwd=tmp_path)
    assert without.stdout.strip() != run.stdout.strip()


def test_run_help_mentions_audio_files() -> None:
    out = " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split())
    assert "image files named in the prompt" in out and "audio files (./clip.wav" in out
