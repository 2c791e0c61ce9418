"""Copy the browser tests' screenshots that docs/ui.md shows into docs/, made small.

    .venv/bin/python -m pytest tests/test_ui_browser.py --basetemp=/tmp/uishots
    .venv/bin/python -m tests.ui_docs_screenshots /tmp/uishots

Each screenshot (1200x800) is scaled to 900 pixels wide and stored as a 128-colour palette PNG:
a few tens of KB each, text still legible.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image

DOCS = Path(__file__).resolve().parent.parent / "docs"
WIDTH = 900
# docs/<name> <- <test's tmp dir, by the start of the test's name>/<screenshot>
SHOTS = {
    "ui-chat.png": ("test_chat_streams_drafted_toke", "chat.png"),
    "ui-compare.png": ("test_chat_streams_drafted_toke", "compare.png"),
    "ui-pull.png": ("test_a_pull_from_a_loopback_re", "pulling.png"),
    "ui-modelfile-error.png": ("test_a_modelfile_error_is_show", "modelfile-error.png"),
    "ui-image.png": ("test_an_image_dropped_on_a_vis", "image.png"),
    "ui-image-refused.png": ("test_a_model_without_vision_re", "image-refused.png"),
    "ui-thinking.png": ("test_thinking_is_shown_collaps", "thinking-collapsed.png"),
    "ui-tool-call.png": ("test_a_tool_call_is_shown_as_s", "tool-call.png"),
}


def find(basetemp: Path, prefix: str, name: str) -> Path:
    found = sorted(basetemp.glob(f"{prefix}*/{name}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no {prefix}*/{name} under {basetemp}: run the browser tests first")
    return found[-1]


def small(source: Path, target: Path) -> None:
    image = Image.open(source).convert("RGB")
    image = image.resize((WIDTH, round(image.height * WIDTH / image.width)), Image.LANCZOS)
    image.quantize(colors=128, method=Image.Quantize.FASTOCTREE).save(target, optimize=True)


def main() -> None:
    basetemp = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/uishots")
    for name, (prefix, shot) in SHOTS.items():
        source = find(basetemp, prefix, shot)
        small(source, DOCS / name)
        print(f"{DOCS / name}: {(DOCS / name).stat().st_size // 1000} KB from {source}")


if __name__ == "__main__":
    main()
