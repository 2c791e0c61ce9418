"""Code standards as tests: ruff, ruff format, mypy --strict, layer contracts, and what may
import the development helpers (``devtools/``) and ``tests/``."""

from __future__ import annotations

import ast
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
    r = run(tool("ruff"), "check", "modelhub", "tests", "bench", "devtools")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = run(tool("ruff"), "format", "--check", "modelhub", "tests", "bench", "devtools")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict() -> None:
    r = run(tool("mypy"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts() -> None:
    r = run(tool("lint-imports"))
    assert r.returncode == 0, r.stdout + r.stderr


def _imported_top_levels(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        # bench/ and devtools/ use modelhub and devtools only, never the test suite's modules
        ("bench", {"tests", "conftest", "realmodels", "pullservers", "fixtures"}),
        ("devtools", {"tests", "conftest", "realmodels", "pullservers", "fixtures"}),
        # the installed package never needs what is not installed with it
        ("modelhub", {"tests", "devtools", "bench"}),
    ],
)
def test_import_boundaries(folder: str, forbidden: set[str]) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_levels(path) & forbidden)
        for path in sorted((ROOT / folder).rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}
    if folder != "modelhub":
        for path in (ROOT / folder).rglob("*.py"):
            assert '"tests"' not in path.read_text(), f"{path} puts tests/ on sys.path"
