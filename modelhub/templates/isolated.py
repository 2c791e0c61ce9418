"""Large templates that come with a request, parsed (and rendered) in a short-lived child.

Parsing a Go template builds Python objects at a few microseconds per character: a 2 MB
TEMPLATE takes seconds and about a million objects, and that work, the garbage collections it
triggers and the freeing of what it built hold the interpreter lock for long stretches, so every
thread of the daemon, its event loop included, would stall for tenths of a second at a time
(RUN-09; issue 26, item 14). So a template longer than ``LARGE_TEMPLATE`` characters that
arrives with a request (a create's TEMPLATE, a generate's ``template``) is parsed by
``python -m modelhub.templates.isolated``, a child with its own memory (at most
``CHILD_MEMORY`` bytes) and time (``CHILD_TIMEOUT_S``); at most ``CHILDREN`` run at once, the
next requests wait for one. Smaller templates are parsed in-process, as before. A verdict is
remembered by the template's digest, so a create checks its template once.

The child reads one JSON request on stdin and writes one JSON answer on stdout:
``{"op": "check", "template"}`` -> ``{"result": null}``; ``{"op": "generate", "args"}`` (the
arguments of ``build_generate_prompt``) -> ``{"result": "<prompt>"}``; a template error is
``{"error": "<message>"}``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from typing import Any

from modelhub.errors import InputError, ModelhubError
from modelhub.templates.gotemplate import parse_template

LARGE_TEMPLATE = 64 * 1024  # characters; real templates are a few thousand
CHILD_TIMEOUT_S = 120.0
CHILD_MEMORY = 4 << 30
CHILDREN = 2

_slots = threading.BoundedSemaphore(CHILDREN)
_verdicts: dict[str, str | None] = {}  # template digest -> error message, or None: it parses
_MAX_VERDICTS = 64


def check_template(text: str) -> None:
    """InputError ``template error: ...`` unless ``text`` parses as a Go template."""
    if len(text) <= LARGE_TEMPLATE:
        parse_template(text)
        return
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    if key not in _verdicts:
        try:
            _run_child({"op": "check", "template": text})
            verdict = None
        except InputError as exc:
            verdict = exc.message
        if len(_verdicts) >= _MAX_VERDICTS:
            _verdicts.clear()
        _verdicts[key] = verdict
    error = _verdicts[key]
    if error is not None:
        raise InputError(error)


def render_generate(args: dict[str, Any]) -> str:
    """``build_generate_prompt(**args)``, in the child when ``args["go_template"]`` is large."""
    from modelhub.templates.prompt import build_generate_prompt

    template = args.get("go_template") or ""
    if len(template) <= LARGE_TEMPLATE:
        return build_generate_prompt(**args)
    return str(_run_child({"op": "generate", "args": args}))


def _run_child(request: dict[str, Any]) -> Any:
    data = json.dumps(request).encode()
    with _slots:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "modelhub.templates.isolated"],
                input=data,
                capture_output=True,
                timeout=CHILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise InputError(
                f"template error: the template took over {CHILD_TIMEOUT_S:.0f} s to parse; "
                "make it smaller"
            ) from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise ModelhubError(
            f"the template checker stopped (exit status {done.returncode}): "
            f"{tail[0] if tail else 'no output'}"
        ) from None
    if "error" in answer:
        raise InputError(str(answer["error"]))
    return answer.get("result")


def _serve(request: dict[str, Any]) -> Any:
    if request.get("op") == "check":
        parse_template(str(request["template"]))
        return None
    from modelhub.templates.prompt import build_generate_prompt

    return build_generate_prompt(**request["args"])


def main() -> None:
    """The child: one request on stdin, one answer on stdout."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
    except (ImportError, ValueError, OSError):  # not on this system: the timeout still holds
        pass
    request = json.loads(sys.stdin.buffer.read())
    try:
        answer: dict[str, Any] = {"result": _serve(request)}
    except InputError as exc:
        answer = {"error": exc.message}
    except MemoryError:
        answer = {
            "error": f"template error: the template needs over {CHILD_MEMORY >> 30} GiB of "
            "memory to parse; make it smaller"
        }
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    main()
