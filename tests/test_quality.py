"""Code standards as tests: ruff, ruff format, mypy --strict, layer contracts, what may
import the development helpers (``devtools/``) and ``tests/``, no import cycles, no
``llama_cpp`` in the daemon, and the sizes of modules and functions."""

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


# ---- the import graph: no cycles (issue 22) ---------------------------------------------------


def _modules() -> dict[str, Path]:
    """Every module of modelhub by its dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted((ROOT / "modelhub").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modelhub modules it imports anywhere in its text: at the top, inside a
    function, under ``TYPE_CHECKING`` (a type needed both ways is a cycle too)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                targets.update(resolve(f"{base}.{alias.name}") for alias in node.names)
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_names_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    cycles = _cycles(_import_graph())
    assert cycles == [], "modules that import each other (directly or round a circle):\n" + (
        "\n".join(" <-> ".join(cycle) for cycle in cycles)
    )


# ---- the daemon never loads llama.cpp's native library (issue 22) ------------------------------


def _daemon_side_modules() -> list[str]:
    """What the daemon and the CLI may import: every module outside ``modelhub.engine``, and
    every engine module those import anywhere (a function's lazy import too), transitively.
    The engine's other modules run only in runners and short-lived children."""
    graph = _import_graph()
    wanted = {name for name in graph if not name.startswith("modelhub.engine")}
    todo = list(wanted)
    while todo:
        for nxt in graph[todo.pop()] - wanted:
            wanted.add(nxt)
            todo.append(nxt)
    return sorted(wanted)


def test_the_daemon_and_cli_never_import_llama_cpp() -> None:
    """modelhub.server.app, the CLI and everything they could import (server/images.py and
    engine/vision.py's daemon side included) leave ``llama_cpp`` unimported."""
    modules = ["modelhub.server.app", "modelhub.cli.main", *_daemon_side_modules()]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'llama_cpp' in sys.modules:\n"
        "        sys.exit('importing ' + name + ' loaded llama_cpp')\n"
    )
    r = run(sys.executable, "-c", code)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- sizes (issue 22) --------------------------------------------------------------------------

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# The stated exceptions, each named and justified in docs/architecture.md ("Size").
LONG_MODULES: set[str] = set()  # none: routes_openai.py was split (issue 22)
LONG_FUNCTIONS = {
    "modelhub/modelfile/parser.py:parse_modelfile",  # one state machine, as Ollama's parser
}


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Modules over MAX_MODULE_LINES and functions over MAX_FUNCTION_LINES (``path:name``,
    decorators included), with their lengths."""
    modules, functions = {}, {}
    for path in sorted((ROOT / "modelhub").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            modules[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - start + 1
                if length > MAX_FUNCTION_LINES:
                    functions[f"{rel}:{node.name}"] = length
    return modules, functions


def test_module_and_function_sizes() -> None:
    modules, functions = _sizes()
    long_modules = {m: n for m, n in modules.items() if m not in LONG_MODULES}
    long_functions = {f: n for f, n in functions.items() if f not in LONG_FUNCTIONS}
    assert long_modules == {}, f"modules over {MAX_MODULE_LINES} lines (split them): {long_modules}"
    assert long_functions == {}, (
        f"functions over {MAX_FUNCTION_LINES} lines (split them): {long_functions}"
    )


def test_size_exceptions_are_still_needed() -> None:
    """An exception that fits the limits again comes off the list (and docs/architecture.md)."""
    modules, functions = _sizes()
    assert LONG_MODULES - set(modules) == set()
    assert LONG_FUNCTIONS - set(functions) == set()
