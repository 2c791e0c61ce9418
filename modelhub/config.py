"""Settings from environment variables and an optional YAML file (env wins).

Variables follow Ollama's, renamed: MODELHUB_HOST, MODELHUB_MODELS, MODELHUB_KEEP_ALIVE,
MODELHUB_ORIGINS, MODELHUB_MAX_LOADED_MODELS, MODELHUB_NUM_PARALLEL, MODELHUB_NUM_THREADS,
MODELHUB_NOPRUNE, MODELHUB_NO_AUTOSTART, MODELHUB_KV_CACHE_TYPE (OLLAMA_KV_CACHE_TYPE),
MODELHUB_CONTEXT_LENGTH (OLLAMA_CONTEXT_LENGTH), MODELHUB_FLASH_ATTENTION (OLLAMA_FLASH_ATTENTION),
plus MODELHUB_MEMORY_LIMIT, MODELHUB_REPACK, MODELHUB_NUM_GPU (the default num_gpu) and
MODELHUB_RPC_SERVERS (ggml RPC workers, host:port,...), MODELHUB_DRAFT (auto or off: how models
without a DRAFT line draft) and MODELHUB_NGRAM_PERSIST (0: keep no n-gram pool on disk).
MODELHUB_RUNNER_TIMEOUT (how long a runner that says nothing is waited for) is modelhub's own, and
so are MODELHUB_RESPONSES_STORE (0: /v1/responses stores nothing), MODELHUB_RESPONSES_MAX and
MODELHUB_RESPONSES_MAX_BYTES (how many stored responses, and how many bytes of them, are kept).
The YAML file (``config.yaml`` in the platformdirs config dir, or MODELHUB_CONFIG) uses the same
names in lower case without the prefix.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs
import yaml

from modelhub.errors import InputError

APP = "modelhub"
DEFAULT_PORT = 11435
DEFAULT_KEEP_ALIVE = 300.0
DEFAULT_CONTEXT_LENGTH = 4096  # num_ctx when neither a request nor the model sets one
MIN_CONTEXT_LENGTH = 16
DEFAULT_RUNNER_TIMEOUT = 30.0  # seconds a runner may say nothing before it is replaced
MIN_RUNNER_TIMEOUT = 1.0


@dataclass(frozen=True)
class HostAddress:
    scheme: str
    host: str
    port: int
    base_path: str = ""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else (self.host or "127.0.0.1")
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"


def parse_host(value: str | None, default_port: int = DEFAULT_PORT) -> HostAddress:
    """Parse MODELHUB_HOST the way Ollama parses OLLAMA_HOST (scheme, host, port, base path)."""
    raw = _clean(value or "")
    scheme, port = "http", default_port
    if "://" in raw:
        scheme, raw = raw.split("://", 1)
        port = 443 if scheme == "https" else 80
    base_path = ""
    if "/" in raw:
        raw, rest = raw.split("/", 1)
        base_path = "/" + rest.rstrip("/") if rest.strip("/") else ""
    host = raw
    m = re.fullmatch(r"\[(?P<h6>[^\]]*)\](?::(?P<p6>\d*))?|(?P<h>[^:]*):(?P<p>\d*)", raw)
    if m:
        host = m.group("h6") if m.group("h6") is not None else (m.group("h") or "")
        p = m.group("p6") if m.group("h6") is not None else m.group("p")
        if p:
            port = int(p) if 0 <= int(p) <= 65535 else default_port
    elif raw == "":
        host = "127.0.0.1"
    return HostAddress(scheme, host, port, base_path)


_DURATION_RE = re.compile(r"(-?)((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


# The longest duration a clock holds: Go's time.Duration (int64 nanoseconds), about 292 years.
MAX_DURATION_SECONDS = (2**63 - 1) / 1e9


def parse_duration(value: Any) -> float:
    """Keep-alive value -> seconds; negative means forever (returned as ``float('inf')``), and
    so does a value beyond :data:`MAX_DURATION_SECONDS` (no deadline can be set that far).

    Numbers are seconds; strings use Go duration syntax ("5m", "1h30m", "250ms", "0", "-1m").
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"keep_alive: unsupported type {type(value).__name__!r}")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an integer beyond a double: forever, whichever its sign
            return float("inf")
        if math.isnan(seconds):
            raise InputError("keep_alive: NaN is not a duration (e.g. '5m', '30s', '-1')")
    else:
        text = value.strip()
        if text in ("0", "-0"):
            return 0.0
        if not _DURATION_RE.fullmatch(text):
            hint = "missing unit in duration" if re.fullmatch(r"-?\d+(\.\d+)?", text) else ""
            raise InputError(
                f"keep_alive: invalid duration {text!r}"
                + (f" ({hint}; e.g. '5m', '30s', '-1')" if hint else " (e.g. '5m', '30s', '-1')")
            )
        sign = -1.0 if text.startswith("-") else 1.0
        parts = re.findall(r"((?:\d+(?:\.\d*)?|\.\d+))(ns|us|µs|ms|s|m|h)", text)
        seconds = sign * sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    return float("inf") if seconds < 0 or seconds > MAX_DURATION_SECONDS else seconds


def _clean(value: str) -> str:
    return value.strip().strip("\"'").strip()


def _bool(value: str | None) -> bool:
    if value is None or _clean(value) == "":
        return False
    v = _clean(value).lower()
    # As Ollama: any non-empty value that is not a recognisable false counts as true.
    return v not in ("0", "f", "false", "no", "off")


def _int(value: str | None, default: int) -> int:
    try:
        return int(_clean(value)) if value is not None and _clean(value) else default
    except ValueError:
        return default


def config_file() -> Path:
    explicit = os.environ.get("MODELHUB_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    return Path(platformdirs.user_config_dir(APP)) / "config.yaml"


def log_dir() -> Path:
    return Path(platformdirs.user_log_dir(APP))


def _file_values() -> dict[str, str]:
    path = config_file()
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"config file {path}: expected a mapping of settings")
    return {f"MODELHUB_{str(k).upper()}": str(v) for k, v in data.items() if v is not None}


@dataclass(frozen=True)
class Settings:
    address: HostAddress
    models_dir: Path
    keep_alive: float = DEFAULT_KEEP_ALIVE
    origins: tuple[str, ...] = ()
    max_loaded_models: int = 3
    num_parallel: int = 0  # sequences per loaded model (0: 4 when memory allows, else 1)
    kv_cache_type: str = "auto"  # auto (exact on CPU), f16, q8_0, q4_0
    context_length: int = DEFAULT_CONTEXT_LENGTH  # the default num_ctx
    num_threads: int = 0
    max_queue: int = 512
    responses_store: bool = True  # keep /v1/responses answers for previous_response_id
    responses_max: int = 1000  # stored responses kept (the oldest go first)
    responses_max_bytes: int = 256 * 1024**2  # and their bytes on disk
    noprune: bool = False
    no_autostart: bool = False
    memory_limit: int | None = None  # bytes all loaded models may use together (None: the system's)
    repack: bool | None = None  # ggml's CPU weight repacking (None: decided per machine)
    flash_attention: bool = True  # off: batched verification is no longer bit-exact on CPU
    num_gpu: int = -1  # layers offloaded when a model does not say (-1: as many as fit)
    rpc_servers: tuple[str, ...] = ()  # ggml RPC workers every model may use
    runner_timeout: float = DEFAULT_RUNNER_TIMEOUT  # 0: never kill a silent runner
    draft: str = "auto"  # how models without a DRAFT line draft: auto (measured) or off
    ngram_persist: bool = True  # keep each model's n-gram pool on disk across loads
    ui: bool = True  # the web page at / (MODELHUB_UI=0: only "modelhub is running")
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return self.address.host

    @property
    def port(self) -> int:
        return self.address.port

    @property
    def base_url(self) -> str:
        return self.address.url

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        values = _file_values()
        values.update({k: v for k, v in (env if env is not None else os.environ).items()})
        get = values.get
        models = get("MODELHUB_MODELS")
        keep_alive = DEFAULT_KEEP_ALIVE
        if get("MODELHUB_KEEP_ALIVE"):
            raw = _clean(get("MODELHUB_KEEP_ALIVE") or "")
            try:  # as Ollama: a bare integer is seconds; garbage falls back to the default
                keep_alive = parse_duration(int(raw) if re.fullmatch(r"-?\d+", raw) else raw)
            except InputError:
                keep_alive = DEFAULT_KEEP_ALIVE
        origins = tuple(o.strip() for o in (get("MODELHUB_ORIGINS") or "").split(",") if o.strip())
        return cls(
            address=parse_host(get("MODELHUB_HOST")),
            models_dir=Path(_clean(models)).expanduser()
            if models
            else Path(platformdirs.user_data_dir(APP)) / "models",
            keep_alive=keep_alive,
            origins=origins,
            max_loaded_models=max(1, _int(get("MODELHUB_MAX_LOADED_MODELS"), 3)),
            num_parallel=max(0, _int(get("MODELHUB_NUM_PARALLEL"), 0)),
            num_threads=max(0, _int(get("MODELHUB_NUM_THREADS"), 0)),
            max_queue=max(1, _int(get("MODELHUB_MAX_QUEUE"), 512)),
            responses_store=_tristate("MODELHUB_RESPONSES_STORE", get("MODELHUB_RESPONSES_STORE"))
            is not False,
            responses_max=_count("MODELHUB_RESPONSES_MAX", get("MODELHUB_RESPONSES_MAX"), 1000),
            responses_max_bytes=_bytes(
                "MODELHUB_RESPONSES_MAX_BYTES", get("MODELHUB_RESPONSES_MAX_BYTES"), 256 * 1024**2
            ),
            noprune=_bool(get("MODELHUB_NOPRUNE")),
            no_autostart=_bool(get("MODELHUB_NO_AUTOSTART")),
            memory_limit=_size(get("MODELHUB_MEMORY_LIMIT")),
            repack=_tristate("MODELHUB_REPACK", get("MODELHUB_REPACK")),
            kv_cache_type=_kv_cache_type(get("MODELHUB_KV_CACHE_TYPE")),
            context_length=_context_length(get("MODELHUB_CONTEXT_LENGTH")),
            flash_attention=_tristate("MODELHUB_FLASH_ATTENTION", get("MODELHUB_FLASH_ATTENTION"))
            is not False,
            num_gpu=_num_gpu(get("MODELHUB_NUM_GPU")),
            rpc_servers=_rpc_servers(get("MODELHUB_RPC_SERVERS")),
            runner_timeout=_runner_timeout(get("MODELHUB_RUNNER_TIMEOUT")),
            draft=_draft_default(get("MODELHUB_DRAFT")),
            ngram_persist=_tristate("MODELHUB_NGRAM_PERSIST", get("MODELHUB_NGRAM_PERSIST"))
            is not False,
            ui=_tristate("MODELHUB_UI", get("MODELHUB_UI")) is not False,
        )


def _tristate(name: str, value: str | None) -> bool | None:
    """``auto`` (or unset) -> None; the usual true and false words -> True / False."""
    text = _clean(value or "").lower()
    if text in ("", "auto"):
        return None
    if text in ("1", "t", "true", "yes", "on"):
        return True
    if text in ("0", "f", "false", "no", "off"):
        return False
    raise InputError(f"{name}={value!r}: use auto, on or off")


KV_CACHE_TYPES = ("auto", "f16", "q8_0", "q4_0")


def _draft_default(value: str | None) -> str:
    text = _clean(value or "").lower() or "auto"
    if text in ("0", "false", "no", "none"):
        text = "off"
    if text not in ("auto", "off"):
        raise InputError(f"MODELHUB_DRAFT={value!r}: use auto (the default) or off")
    return text


def _kv_cache_type(value: str | None) -> str:
    text = _clean(value or "").lower() or "auto"
    if text not in KV_CACHE_TYPES:
        raise InputError(f"MODELHUB_KV_CACHE_TYPE={value!r}: use {', '.join(KV_CACHE_TYPES)}")
    return text


def _num_gpu(value: str | None) -> int:
    text = _clean(value or "")
    if text in ("", "auto"):
        return -1
    if not re.fullmatch(r"-?\d+", text) or int(text) < -1:
        raise InputError(
            f"MODELHUB_NUM_GPU={value!r}: use -1 (as many layers as fit), 0 (CPU only) or a "
            "number of layers"
        )
    return int(text)


_ENDPOINT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([1-9][0-9]{0,4})")


def valid_endpoint(text: str) -> bool:
    """``host:port`` (IPv6 in brackets) with a port of 1..65535."""
    m = _ENDPOINT.fullmatch(text)
    return m is not None and int(m[1]) < 65536


def _rpc_servers(value: str | None) -> tuple[str, ...]:
    parts = [p.strip() for p in _clean(value or "").split(",") if p.strip()]
    for part in parts:
        if not valid_endpoint(part):
            raise InputError(
                f"MODELHUB_RPC_SERVERS: {part!r} is not host:port (e.g. "
                "192.168.1.20:50052,192.168.1.21:50052)"
            )
    return tuple(parts)


def _context_length(value: str | None) -> int:
    """MODELHUB_CONTEXT_LENGTH: tokens, at least 16; unset, empty or 0 is the default. Unlike
    Ollama, which falls back silently, a bad value stops the daemon at start."""
    text = _clean(value or "")
    if text in ("", "0"):
        return DEFAULT_CONTEXT_LENGTH
    if not re.fullmatch(r"\d+", text) or int(text) < MIN_CONTEXT_LENGTH:
        raise InputError(
            f"MODELHUB_CONTEXT_LENGTH={value!r}: use a number of tokens of at least "
            f"{MIN_CONTEXT_LENGTH} (e.g. 8192), or 0 for the default {DEFAULT_CONTEXT_LENGTH}"
        )
    return int(text)


def _runner_timeout(value: str | None) -> float:
    """MODELHUB_RUNNER_TIMEOUT: seconds (``45``) or a duration (``2m``), at least one second;
    ``0`` (or ``off``) never kills a silent runner; unset or empty is the default."""
    text = _clean(value or "").lower()
    if text == "":
        return DEFAULT_RUNNER_TIMEOUT
    if text in ("0", "off"):
        return 0.0
    try:
        seconds = float(text) if re.fullmatch(r"\d+(\.\d*)?", text) else parse_duration(text)
    except InputError:
        seconds = -1.0
    if not MIN_RUNNER_TIMEOUT <= seconds < float("inf"):
        raise InputError(
            f"MODELHUB_RUNNER_TIMEOUT={value!r}: use seconds (e.g. 60) or a duration (e.g. 2m) "
            f"of at least {MIN_RUNNER_TIMEOUT:g} s, or 0 to never stop a silent runner "
            f"(default {DEFAULT_RUNNER_TIMEOUT:g})"
        )
    return seconds


def _count(name: str, value: str | None, default: int) -> int:
    """A positive count; unset or empty is the default."""
    text = _clean(value or "")
    if text == "":
        return default
    if not re.fullmatch(r"\d+", text) or int(text) < 1:
        raise InputError(f"{name}={value!r}: use a positive number (default {default})")
    return int(text)


def _bytes(name: str, value: str | None, default: int) -> int:
    """A size (``512MiB``, ``1GB``, a byte count); unset or empty is the default."""
    text = _clean(value or "")
    if text == "":
        return default
    try:
        size = parse_size(text)
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
    if size < 1:
        raise InputError(f"{name}={value!r}: use a size of at least one byte")
    return size


def _size(value: str | None) -> int | None:
    if not value or not _clean(value):
        return None
    try:
        return parse_size(_clean(value))
    except InputError as exc:
        raise InputError(f"MODELHUB_MEMORY_LIMIT: {exc}") from None


_SIZE = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$")


def parse_size(text: str) -> int:
    """``"8GiB"``, ``"512MB"``, ``"2g"`` or a plain byte count -> bytes (powers of 1024)."""
    m = _SIZE.match(text)
    if m is None:
        raise InputError(f"invalid size {text!r}: use a byte count or a size such as 8GiB or 512MB")
    scale = 1024 ** "kmgt".find(m.group(2).lower()) * 1024 if m.group(2) else 1
    return int(float(m.group(1)) * scale)
