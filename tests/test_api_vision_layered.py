"""EAGLE-3, DFlash and Gemma 4 assistant drafting with an image in the context, through the real
daemon (issue 23): each tiny synthetic drafter (tests/fixtures/synthetic_drafters.py) beside its
tiny target and a 64-wide synthetic projector as a second FROM, at a fixed draft length (on the
tiny models, measured costs may stop adaptive drafting); /api/generate with an image gives the
same greedy text as the same request with ``options.draft: "off"``, and the drafts are counted
and kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.daemons import Daemon
from tests.fixtures import synthetic, synthetic_drafters
from tests.fixtures.media_daemon import (
    assert_drafting_keeps_greedy_output_with_images,
    create_drafting_seer,
)


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
    k = 3 if kind == "dflash" else 4  # DFlash's cap: block size - 1
    name = f"tiny-{kind}-seer"
    create_drafting_seer(daemon, name, tmp_path, target, str(drafter), k)
    assert_drafting_keeps_greedy_output_with_images(daemon, name)
