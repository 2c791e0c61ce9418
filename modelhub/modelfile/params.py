"""PARAMETER typing: Modelfile text and API JSON -> typed option values.

Types and error texts follow Ollama (``invalid int value [1.0]``, ``option "x" must be of type
float32``...). On top of that, values users commonly get wrong (a negative context, a draft
length of 1000, a probability of 1.5) are refused with a message saying what is allowed.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from modelhub.config import valid_endpoint
from modelhub.errors import InputError, ModelfileError
from modelhub.modelfile.parser import INSTRUCTION_NAMES, Command

PARAMETER_TYPES: dict[str, type] = {
    # load-time options (part of a runner's identity)
    "num_ctx": int,
    "num_batch": int,
    "num_gpu": int,
    "main_gpu": int,
    "use_mmap": bool,
    "num_thread": int,
    "num_parallel": int,
    "rpc_servers": list,  # ggml RPC workers (host:port), this project's extension
    # speculative decoding; draft_min, draft_p_min, draft_adaptive are this project's extension
    "draft_num_predict": int,
    "draft_min": int,
    "draft_p_min": float,
    "draft_adaptive": bool,
    # per-request sampling options
    "num_keep": int,
    "seed": int,
    "num_predict": int,
    "top_k": int,
    "top_p": float,
    "min_p": float,
    "typical_p": float,
    "repeat_last_n": int,
    "temperature": float,
    "repeat_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "stop": list,
}

# Accepted in a Modelfile with a warning and dropped; any other unknown name is an error.
DEPRECATED_PARAMETERS: frozenset[str] = frozenset(
    {
        "penalize_newline",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mlock",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
    }
)

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|[+-]?(?:inf|infinity|nan)",
    re.IGNORECASE,
)
_HEX_FLOAT = re.compile(
    r"[+-]?0[xX](?:[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+"
)
_BOOLS = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}
_INT64 = range(-(2**63), 2**63)
# float options are float32, as in Ollama and llama.cpp: the largest finite value and the
# smallest normal one (nonzero values closer to 0 are refused: divided by, they overflow).
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38
# stop: how many strings and how long each (characters). Every generated token is matched
# against each of them, so the bounds keep one request from slowing the others on its runner.
MAX_STOP_COUNT = 64
MAX_STOP_LENGTH = 256


@dataclass(frozen=True)
class _Range:
    low: float | None
    high: float | None
    meaning: str  # says what the bounds mean, for the error message


_RANGES: dict[str, _Range] = {
    "num_ctx": _Range(0, None, "0 means the default, otherwise a number of tokens"),
    "num_batch": _Range(1, None, "tokens evaluated per step"),
    "num_gpu": _Range(-1, None, "-1 means automatic, 0 means CPU only"),
    "main_gpu": _Range(0, None, "an accelerator index"),
    "num_thread": _Range(0, None, "0 means automatic"),
    "num_parallel": _Range(0, 64, "requests served at once; 0 means automatic"),
    "num_keep": _Range(-1, None, "-1 keeps the whole prompt"),
    "num_predict": _Range(-2, None, "-1 means until a stop, -2 until the context is full"),
    "top_k": _Range(0, None, "0 disables top-k"),
    "repeat_last_n": _Range(-1, None, "0 disables, -1 means the whole context"),
    "temperature": _Range(0, None, "0 means greedy"),
    "top_p": _Range(0, 1, "a probability"),
    "min_p": _Range(0, 1, "a probability"),
    "typical_p": _Range(0, 1, "a probability"),
    # Penalties are bounded where the sampler's float32 arithmetic would overflow.
    "repeat_penalty": _Range(1e-6, 1e6, "1 means no penalty"),
    "presence_penalty": _Range(-1e6, 1e6, "0 means no penalty"),
    "frequency_penalty": _Range(-1e6, 1e6, "0 means no penalty"),
    "draft_num_predict": _Range(0, 64, "0 turns speculative decoding off"),
    "draft_min": _Range(0, None, "0 means always speculate when drafts exist"),
    "draft_p_min": _Range(0, 1, "a probability"),
}


def parse_parameter(name: str, value: str) -> int | float | bool | str:
    """Type one PARAMETER value: int, float, bool, or str (one ``stop`` element).

    Raises ModelfileError ``unknown parameter 'x'`` (also for deprecated names: check
    :data:`DEPRECATED_PARAMETERS` first to warn instead) or ``invalid <type> value [v]``.
    Ranges are not checked here; see :func:`check_parameter`.
    """
    kind = PARAMETER_TYPES.get(name)
    if kind is None:
        if name in DEPRECATED_PARAMETERS:
            raise ModelfileError(f"parameter {name} is deprecated and no longer has any effect")
        raise ModelfileError(f"unknown parameter '{name}'")
    if kind is int:
        if _INT.fullmatch(value) and int(value) in _INT64:
            return int(value)
        raise ModelfileError(f"invalid int value [{value}]")
    if kind is float:
        number = _parse_float32(value)
        if number is None:
            raise ModelfileError(f"invalid float value [{value}]")
        return number
    if kind is bool:
        if value in _BOOLS:
            return _BOOLS[value]
        raise ModelfileError(f"invalid bool value [{value}]")
    return value  # stop, rpc_servers: the raw text is one element


def check_parameter(name: str, value: Any) -> None:
    """Refuse values outside what the parameter can mean (ModelfileError, no line number)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ModelfileError(f"{name} must be a finite number, got {value}")
    if name == "stop" and value == "":
        raise ModelfileError("stop must not be empty: an empty stop sequence ends every reply")
    if name == "stop" and isinstance(value, str) and len(value) > MAX_STOP_LENGTH:
        raise ModelfileError(
            f"stop strings must be at most {MAX_STOP_LENGTH} characters each, got one of "
            f"{len(value)}"
        )
    if name == "rpc_servers" and isinstance(value, str):
        for part in value.split(","):
            if not valid_endpoint(part.strip()):
                raise ModelfileError(
                    f"rpc_servers must be host:port entries (e.g. 192.168.1.20:50052), "
                    f"got {part.strip()!r}"
                )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    bounds = _RANGES.get(name)
    if bounds is not None:
        too_low = bounds.low is not None and value < bounds.low
        too_high = bounds.high is not None and value > bounds.high
        if too_low or too_high:
            raise ModelfileError(
                f"{name} must be {_describe(bounds)} ({bounds.meaning}), got {value}"
            )
    if PARAMETER_TYPES.get(name) is float:
        _check_float32(name, value)


def check_stop_count(stops: list[Any]) -> None:
    """At most :data:`MAX_STOP_COUNT` stop strings (ModelfileError, no line number)."""
    if len(stops) > MAX_STOP_COUNT:
        raise ModelfileError(
            f"stop takes at most {MAX_STOP_COUNT} strings, got {len(stops)}: keep the ones "
            "that can end a reply"
        )


def _check_float32(name: str, value: float) -> None:
    magnitude = abs(value)
    if magnitude > FLOAT32_MAX or 0 < magnitude < FLOAT32_TINY:
        raise ModelfileError(
            f"{name} must be a float32: 0, or between {FLOAT32_TINY:.3g} and {FLOAT32_MAX:.3g} "
            f"in magnitude, got {value}"
        )


def parameters_from_commands(cmds: Iterable[Command]) -> tuple[dict[str, Any], list[str]]:
    """Collect typed PARAMETERs: ``stop`` accumulates in order, any other key keeps its last value.

    Returns the parameters and warnings (deprecated names, knobs that cancel each other).
    Errors carry the line of the offending PARAMETER.
    """
    parameters: dict[str, Any] = {}
    warnings: list[str] = []
    for cmd in cmds:
        # Like Ollama, a PARAMETER named after an instruction ("system") acts as that instruction.
        if cmd.name in INSTRUCTION_NAMES:
            continue
        if cmd.name in DEPRECATED_PARAMETERS:
            warning = f"parameter {cmd.name} is deprecated"
            if warning not in warnings:
                warnings.append(warning)
            continue
        try:
            value = parse_parameter(cmd.name, cmd.args)
            check_parameter(cmd.name, value)
        except ModelfileError as exc:
            raise ModelfileError(exc.message, cmd.line) from None
        if PARAMETER_TYPES.get(cmd.name) is list:  # stop, rpc_servers: one element per line
            parameters.setdefault(cmd.name, []).append(value)
            if cmd.name == "stop":
                try:
                    check_stop_count(parameters["stop"])
                except ModelfileError as exc:
                    raise ModelfileError(exc.message, cmd.line) from None
        else:
            parameters[cmd.name] = value
    draft_min, draft_max = parameters.get("draft_min"), parameters.get("draft_num_predict")
    if draft_min is not None and draft_max is not None and 0 < draft_max < draft_min:
        warnings.append(
            f"draft_min {draft_min} is larger than draft_num_predict {draft_max}: "
            "no draft can ever be long enough, so speculative decoding never runs"
        )
    return parameters, warnings


def coerce_option(name: str, value: Any) -> Any:
    """Type- and range-check one API option given as JSON (a request's ``options``, a create
    request's ``parameters``), the way Ollama types them.

    Integers accept any JSON number (the fraction is truncated), floats accept integers, ``stop``
    must be a list of strings. ``None`` and unknown names come back unchanged (callers decide);
    a wrong type raises InputError ``option "<name>" must be of type <type>``, a value out of
    range (:func:`check_parameter`) InputError ``option <name> must be ...``.
    """
    typed = _typed_option(name, value)
    if typed is not None and name in PARAMETER_TYPES:
        try:
            for item in typed if isinstance(typed, list) else [typed]:
                check_parameter(name, item)
        except ModelfileError as exc:
            raise InputError(f"option {exc.message}") from None
    return typed


def _typed_option(name: str, value: Any) -> Any:
    kind = PARAMETER_TYPES.get(name)
    if kind is None or value is None:
        return value
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        if not is_number:
            raise InputError(f'option "{name}" must be of type integer')
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f'option "{name}" must be a finite number, got {value}')
        number = int(value)  # truncates toward zero, like Go's int64(float64)
        if number not in _INT64:
            raise InputError(f'option "{name}" is out of range for a 64-bit integer')
        return number
    if kind is float:
        if not is_number:
            raise InputError(f'option "{name}" must be of type float32')
        if isinstance(value, int) and abs(value) > FLOAT32_MAX:
            raise InputError(f'option "{name}" is out of range for a float32, got {value}')
        if not math.isfinite(value):
            raise InputError(f'option "{name}" must be a finite number, got {value}')
        return float(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise InputError(f'option "{name}" must be of type boolean')
        return value
    if not isinstance(value, list):
        raise InputError(f'option "{name}" must be of type array')
    if not all(isinstance(item, str) for item in value):
        raise InputError(f'option "{name}" must be of an array of strings')
    if name == "stop":
        try:
            check_stop_count(value)
        except ModelfileError as exc:
            raise InputError(f"option {exc.message}") from None
    return list(value)


_SEMVER_NUMBER = r"(?:0|[1-9][0-9]*)"
_SEMVER_IDENT = r"[0-9A-Za-z-]+"
_SEMVER = re.compile(
    rf"{_SEMVER_NUMBER}(?:\.{_SEMVER_NUMBER})?"
    rf"|{_SEMVER_NUMBER}\.{_SEMVER_NUMBER}\.{_SEMVER_NUMBER}"
    rf"(?:-{_SEMVER_IDENT}(?:\.{_SEMVER_IDENT})*)?(?:\+{_SEMVER_IDENT}(?:\.{_SEMVER_IDENT})*)?"
)


def normalize_requires(value: str, line: int | None = None) -> str:
    """REQUIRES: a semantic version, ``v`` optional (``1``, ``0.14``, ``1.2.3-rc1``), stored
    without the ``v``."""
    version = value.removeprefix("v")
    match = _SEMVER.fullmatch(version)
    if match is None or not _numeric_prerelease_ok(version):
        raise ModelfileError("requires must be a valid semver (e.g. 0.14.0)", line)
    return version


def version_at_least(have: str, need: str) -> bool:
    """Whether semantic version ``have`` is ``need`` or later (``v`` optional, missing minor or
    patch numbers are 0, a pre-release comes before its release, build metadata is ignored)."""
    return _semver_key(have) >= _semver_key(need)


def _semver_key(version: str) -> tuple[tuple[int, ...], int, tuple[tuple[int, int, str], ...]]:
    core, _, pre = version.removeprefix("v").split("+", 1)[0].partition("-")
    numbers = tuple(int(n) for n in core.split("."))
    numbers += (0,) * (3 - len(numbers))
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".") if p)
    return numbers, 0 if pre else 1, ids


def _numeric_prerelease_ok(version: str) -> bool:
    """Numeric pre-release identifiers must not have leading zeros (``1.0.0-01`` is invalid)."""
    core = version.split("+", 1)[0]
    if "-" not in core:
        return True
    prerelease = core.split("-", 1)[1]
    return not any(
        part.isdigit() and len(part) > 1 and part[0] == "0" for part in prerelease.split(".")
    )


def _parse_float32(text: str) -> float | None:
    """Go's ``strconv.ParseFloat(text, 32)``: None when malformed or beyond float32's range."""
    try:
        if _FLOAT.fullmatch(text):
            number = float(text)
        elif _HEX_FLOAT.fullmatch(text):
            number = float.fromhex(text)
        else:
            return None
        if math.isinf(number) and "inf" not in text.lower():
            return None  # a finite literal too large even for float64
        struct.pack("<f", number)  # raises when the value rounds beyond float32's range
    except OverflowError:
        return None
    return number


def _describe(bounds: _Range) -> str:
    def show(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else str(x)

    if bounds.low is not None and bounds.high is not None:
        return f"between {show(bounds.low)} and {show(bounds.high)}"
    if bounds.low is not None:
        return f"at least {show(bounds.low)}"
    assert bounds.high is not None
    return f"at most {show(bounds.high)}"
