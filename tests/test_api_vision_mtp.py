"""MTP drafting with an image in the context, through the real daemon (issue 23): the tiny
NextN model (``write_tiny_mtp``) with a 64-wide synthetic projector as a second FROM and
``DRAFT mtp`` at a fixed length (on the tiny model, measured costs may stop adaptive drafting);
/api/generate with an image gives the same greedy text as the same request with
``options.draft: "off"``, and the heads' drafts are counted and kept."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from devtools.daemons import Daemon
from tests.fixtures.synthetic import write_tiny_mtp
from tests.fixtures.synthetic_projector import write_projector


def png(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def test_mtp_drafts_with_an_image_and_keeps_greedy_output(daemon: Daemon, tmp_path: Path) -> None:
    model = write_tiny_mtp(tmp_path / "tiny-mtp.gguf")
    proj = write_projector(tmp_path / "mmproj-64.gguf", n_embd_text=64)
    mf = tmp_path / "Modelfile"
    params = "PARAMETER draft_num_predict 4\nPARAMETER draft_adaptive false\n"
    mf.write_text(f"FROM {model}\nFROM {proj}\nDRAFT mtp\n{params}")
    r = daemon.cli("create", "tiny-mtp-seer", "-f", str(mf))
    assert r.returncode == 0, r.stderr

    def generate(image: str, draft: str) -> dict[str, object]:
        options = {"temperature": 0, "num_predict": 48, "draft": draft}
        body = {"model": "tiny-mtp-seer", "prompt": "the hello world", "raw": True}
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
