"""EAGLE-3, DFlash and Gemma 4 assistant drafting with an image in the context, through the real
daemon (issue 23): each tiny synthetic drafter (tests/fixtures/synthetic_drafters.py) beside its
tiny target and a 64-wide synthetic projector as a second FROM, at a fixed draft length (on the
tiny models, measured costs may stop adaptive drafting); /api/generate with an image gives the
same greedy text as the same request with ``options.draft: "off"``, and the drafts are counted
and kept."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from devtools.daemons import Daemon
from tests.fixtures import synthetic, synthetic_drafters
from tests.fixtures.synthetic_projector import write_projector


def png(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def files(kind: str, d: Path) -> tuple[Path, Path]:
    """The target and the drafter of ``kind``."""
    if kind == "assistant":
        target = synthetic_drafters.write_tiny_gemma4(d / "tiny-gemma4.gguf")
        return target, synthetic_drafters.write_tiny_gemma4_assistant(d / "a.gguf", target)
    target = synthetic.write_tiny_llama(d / "tiny-llama.gguf")
    write = getattr(synthetic_drafters, f"write_tiny_{kind}")
    return target, write(d / f"tiny-{kind}.gguf", target)


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "assistant"])
def test_drafts_with_an_image_and_keeps_greedy_output(
    daemon: Daemon, tmp_path: Path, kind: str
) -> None:
    target, drafter = files(kind, tmp_path)
    proj = write_projector(tmp_path / "mmproj-64.gguf", n_embd_text=64)
    k = 3 if kind == "dflash" else 4  # DFlash's cap: block size - 1
    mf = tmp_path / "Modelfile"
    params = f"PARAMETER draft_num_predict {k}\nPARAMETER draft_adaptive false\n"
    mf.write_text(f"FROM {target}\nFROM {proj}\nDRAFT {drafter}\n{params}")
    name = f"tiny-{kind}-seer"
    r = daemon.cli("create", name, "-f", str(mf))
    assert r.returncode == 0, r.stderr

    def generate(image: str, draft: str) -> dict[str, object]:
        options = {"temperature": 0, "num_predict": 48, "draft": draft}
        body = {"model": name, "prompt": "the hello world", "raw": True}
        r = httpx.post(
            daemon.url + "/api/generate",
            json={**body, "images": [image], "options": options, "stream": False},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        return dict(r.json())

    answers = []
    for seed in (1, 2):
        plain = generate(png(seed), "off")
        drafted = generate(png(seed), "auto")
        assert drafted["response"] == plain["response"]
        assert int(drafted.get("draft_count", 0)) > 0  # type: ignore[call-overload]
        assert int(drafted.get("draft_accepted_count", 0)) > 0  # type: ignore[call-overload]
        answers.append(plain["response"])
    assert answers[0] != answers[1]  # the image is read
