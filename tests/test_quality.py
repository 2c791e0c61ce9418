"""Code standards as tests: ruff, ruff format, mypy --strict, layer contracts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return path


def test_ruff_check() -> None:
    r = run(tool("ruff"), "check", "modelhub", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = run(tool("ruff"), "format", "--check", "modelhub", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict() -> None:
    r = run(tool("mypy"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts() -> None:
    r = run(tool("lint-imports"))
    assert r.returncode == 0, r.stdout + r.stderr
