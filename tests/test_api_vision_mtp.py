"""MTP drafting with an image in the context, through the real daemon (issue 23): the tiny
NextN model (``write_tiny_mtp``) with a 64-wide synthetic projector as a second FROM and
``DRAFT mtp`` at a fixed length (on the tiny model, measured costs may stop adaptive drafting);
/api/generate with an image gives the same greedy text as the same request with
``options.draft: "off"``, and the heads' drafts are counted and kept."""

from __future__ import annotations

from pathlib import Path

from devtools.daemons import Daemon
from tests.fixtures.media_daemon import (
    assert_drafting_keeps_greedy_output_with_images,
    create_drafting_seer,
)
from tests.fixtures.synthetic import write_tiny_mtp


def test_mtp_drafts_with_an_image_and_keeps_greedy_output(daemon: Daemon, tmp_path: Path) -> None:
    model = write_tiny_mtp(tmp_path / "tiny-mtp.gguf")
    create_drafting_seer(daemon, "tiny-mtp-seer", tmp_path, model, "mtp", 4)
    assert_drafting_keeps_greedy_output_with_images(daemon, "tiny-mtp-seer")
