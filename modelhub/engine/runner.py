"""The runner process: hosts one Engine (target + draft) and speaks JSON lines on stdin/stdout.

Each loaded model runs in its own process, so a crash, an abort or an out-of-memory kill in
native code costs that model, not the daemon. The protocol (one JSON object per line):

daemon -> runner
  {"op": "load", "config": {EngineConfig fields}}
  {"op": "generate", "id": "...", "prompt": "text", "context": [ids] | null,
   "options": {GenerateOptions fields}, "prediction": "text" | null, "grammar": GBNF | null,
   "image_marker": "regex with one group, the image's index" | absent,
   "images": {"index": {"width": n, "height": n, "rgb": base64}} | absent}
  {"op": "embed", "id": "...", "texts": ["..."]}
  {"op": "tokenize", "id": "...", "text": "...", "add_special": true}
  {"op": "count", "id": "...", "texts": ["..."], "add_special": true,
   "image_marker": "regex" | absent, "image_sizes": {"index": [width, height]} | absent}
                                              (token counts; an image counts its positions)
  {"op": "drafting", "id": "..."}             (what drafting measured: ``Engine.drafting_report``)
  {"op": "cancel", "id": "..."}
  {"op": "shutdown"}
runner -> daemon
  {"event": "loaded", "pid": n, "n_ctx": n, "rss": bytes, "repack": bool, "repack_reason": "...",
   "n_parallel": n, "kv_cache_type": "..."}
  {"event": "load_error", "message": "...", "kind": "invalid_request" | ...}
  {"id": "...", "event": "prompt", "prompt_tokens": n}          (generation started)
  {"id": "...", "event": "token", "text": "...", "drafted": bool}
  {"id": "...", "event": "done", "result": {GenerateResult fields, "context": [ids]}}
  {"id": "...", "event": "vectors", "embeddings": [[...]]}      (a piece; more follow)
  {"id": "...", "event": "embeddings", "embeddings": [[...]], "prompt_eval_count": n}
  {"id": "...", "event": "tokens", "tokens": [ids]}
  {"id": "...", "event": "counts", "counts": [n]}
  {"id": "...", "event": "drafting", "report": {...}}
  {"id": "...", "event": "error", "message": "...", "kind": "invalid_request" | ...}
  {"event": "alive"}                    (every second or so with ``--heartbeat SECONDS``)

``kind`` is an ``errors.ErrorKind`` label; the daemon raises the error class of that kind.
Embeddings come in pieces of at most about ``EMBED_PIECE_FLOATS`` numbers (``vectors`` events,
then the final ``embeddings`` with the last piece), so no line outgrows what the daemon reads
whatever the batch. A heartbeat thread says ``alive`` however busy the others are, and stderr
carries marks that tie its log lines to requests (``engine.liveness``).

Generation requests run together in the engine's batch (up to ``n_parallel`` at once, the
others wait for a slot in arrival order; ``engine.batching``), each answered by its own
events; ``cancel`` stops a running request between decode steps or drops a waiting one.
Embeddings and tokenization are answered in arrival order beside them.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import traceback
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from modelhub.engine.liveness import LOAD_MARK, Heartbeat, write_mark
from modelhub.errors import ErrorKind, ModelhubError, RequestCancelledError

if TYPE_CHECKING:  # the engine (llama.cpp) loads only in the runner's own start-up
    from modelhub.engine.generate import Engine
    from modelhub.engine.options import TokenLogprob

_STOP = object()
# Numbers per embeddings line: about 1.5 MB of JSON (113 vectors of 576, 16 of 4096).
EMBED_PIECE_FLOATS = 65536
# Inputs embedded in one turn of the engine's thread: up to 8 texts or 64 tokens, so that a
# running generation waits at most about that long per step, while short texts do not pay a
# handover between threads each.
EMBED_GROUP_TEXTS, EMBED_GROUP_TOKENS = 8, 64


def _rss_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Runner:
    def __init__(self, out: IO[str], heartbeat: float = 0.0) -> None:
        """``heartbeat`` > 0: say ``alive`` that often (seconds) while serving."""
        self.out = out
        self.heartbeat = Heartbeat(self.send, heartbeat) if heartbeat > 0 else None
        self.out_lock = threading.Lock()
        self.engine: Any = None
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.cancels: dict[str, threading.Event] = {}
        self.cancel_lock = threading.Lock()

    def send(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        with self.out_lock:
            self.out.write(line + "\n")
            self.out.flush()

    # -- control thread (stdin) ---------------------------------------------------------
    def serve(self, inp: IO[str]) -> None:
        worker = threading.Thread(target=self._work, daemon=True)
        worker.start()
        if self.heartbeat is not None:
            self.heartbeat.start()
        for raw in inp:
            if not raw.strip():
                continue
            msg = json.loads(raw)
            op = msg.get("op")
            if op == "load":
                write_mark("begin", LOAD_MARK)
                self._load(msg.get("config") or {})
                write_mark("end", LOAD_MARK)
            elif op == "cancel":
                with self.cancel_lock:
                    event = self.cancels.get(str(msg.get("id")))
                if event is not None:
                    event.set()
            elif op == "shutdown":
                break
            else:
                with self.cancel_lock:
                    self.cancels[str(msg.get("id"))] = threading.Event()
                self.jobs.put(msg)
        self.jobs.put(_STOP)
        if self.heartbeat is not None:
            self.heartbeat.stop()
        worker.join(timeout=5)
        if self.engine is not None:
            self.engine.close()

    def _load(self, config: dict[str, Any]) -> None:
        from modelhub.engine.generate import Engine, EngineConfig
        from modelhub.engine.options import DraftSource

        known = {f.name for f in fields(EngineConfig)}
        cfg = {k: v for k, v in config.items() if k in known}
        for key in ("model_path", "draft_path", "state_dir"):
            if cfg.get(key):
                cfg[key] = Path(cfg[key])
        cfg["draft_candidates"] = [
            DraftSource(
                str(c["name"]),
                c["kind"],
                Path(c["path"]) if c.get("path") else None,
                int(c["max_k"]),
            )
            for c in cfg.get("draft_candidates") or []
        ]
        cfg["adapter_paths"] = [Path(p) for p in cfg.get("adapter_paths") or []]
        try:
            self.engine = Engine(EngineConfig(**cfg))
        except ModelhubError as exc:
            self.send({"event": "load_error", "message": exc.message, "kind": exc.kind.label})
            return
        except Exception as exc:
            self.send({"event": "load_error", "message": f"{type(exc).__name__}: {exc}"})
            return
        self.send(
            {
                "event": "loaded",
                "pid": os.getpid(),
                "n_ctx": self.engine.n_ctx,
                "rss": _rss_bytes(),
                "repack": self.engine.repack.enabled,
                "repack_reason": self.engine.repack.reason,
                "n_parallel": self.engine.n_parallel,
                "kv_cache_type": self.engine.kv_cache_type,
                "placement": self.engine.placement.as_json(),
                "offload": self.engine.offload.reason,
                "devices": [d.label for d in self.engine.offload.devices],
                "draft_devices": [d.label for d in self.engine.offload.draft_devices],
                "drafters": [src.name for src in self.engine.sources],
                "default_drafters": self.engine.default_drafters,
            }
        )

    # -- worker thread ------------------------------------------------------------------
    def _work(self) -> None:
        while (msg := self.jobs.get()) is not _STOP:
            rid = str(msg.get("id"))
            with self.cancel_lock:
                cancel = self.cancels.get(rid) or threading.Event()
            finished = True
            write_mark("begin", rid)
            try:
                if cancel.is_set():
                    self._send_error(rid, "request canceled", ErrorKind.CANCELLED.label)
                elif self.engine is None:
                    self.send({"id": rid, "event": "error", "message": "no model loaded"})
                else:
                    finished = self._dispatch(rid, msg, cancel)
            except ModelhubError as exc:
                self._send_error(rid, exc.message, exc.kind.label)
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                self._send_error(rid, f"{type(exc).__name__}: {exc}")
            finally:
                if finished:
                    self._forget(rid)
                else:
                    write_mark("run", rid)

    def _forget(self, rid: str) -> None:
        """The request has had its final event."""
        with self.cancel_lock:
            self.cancels.pop(rid, None)
        write_mark("end", rid)

    def _send_error(self, rid: str, message: str, kind: str | None = None) -> None:
        event: dict[str, Any] = {"id": rid, "event": "error", "message": message}
        if kind is not None:
            event["kind"] = kind
        self.send(event)

    def _dispatch(self, rid: str, msg: dict[str, Any], cancel: threading.Event) -> bool:
        """Serve one request; False when it goes on in the engine's batch (generate)."""
        op = msg.get("op")
        engine = self.engine
        if op == "generate":
            self._generate(rid, msg, cancel)
            return False
        if op == "embed":
            self._embed(rid, [str(t) for t in msg.get("texts") or []], cancel)
        elif op == "drafting":
            report = engine.drafting_report()
            self.send({"id": rid, "event": "drafting", "report": report})
        elif op == "tokenize":
            tokens = engine.tokenize(
                str(msg.get("text", "")), add_special=bool(msg.get("add_special", True))
            )
            self.send({"id": rid, "event": "tokens", "tokens": tokens})
        elif op == "count":
            from modelhub.engine.vision import count_tokens

            special = bool(msg.get("add_special", True))
            counts = [
                count_tokens(engine, str(t), msg, special, cancel) for t in msg.get("texts") or []
            ]
            self.send({"id": rid, "event": "counts", "counts": counts})
        else:
            self._send_error(rid, f"unknown op {op!r}", ErrorKind.INVALID.label)
        return True

    def _embed(self, rid: str, texts: list[str], cancel: threading.Event) -> None:
        """Embed ``texts`` a few at a time (``EMBED_GROUP_*``), so that running generations take
        their steps in between, and send the vectors in pieces (see the protocol above)."""
        engine = self.engine
        piece: list[list[float]] = []
        group: list[str] = []
        count = group_tokens = 0
        for i, text in enumerate(texts):
            if cancel.is_set():
                raise RequestCancelledError("request canceled")
            tokens = len(engine.tokenize(text))
            count, group_tokens = count + tokens, group_tokens + tokens
            group.append(text)
            full = len(group) >= EMBED_GROUP_TEXTS or group_tokens >= EMBED_GROUP_TOKENS
            if not full and i + 1 < len(texts):
                continue
            piece.extend(engine.embed(group))
            group, group_tokens = [], 0
            if len(piece) * len(piece[0]) >= EMBED_PIECE_FLOATS:
                self.send({"id": rid, "event": "vectors", "embeddings": piece})
                piece = []
        final = {"id": rid, "event": "embeddings", "embeddings": piece, "prompt_eval_count": count}
        self.send(final)

    def _generate(self, rid: str, msg: dict[str, Any], cancel: threading.Event) -> None:
        from modelhub.engine.generate import GenerateOptions, GenerateResult, TokenEvent

        engine = self.engine
        context = [int(t) for t in msg.get("context") or []]
        prompt = str(msg.get("prompt") or "")
        engine.check_prompt_size(prompt, len(context))
        images = None
        if msg.get("images"):  # the prompt's image markers and their pixels (``vision``)
            from modelhub.engine.vision import prompt_with_images

            tokens, images = prompt_with_images(engine, prompt, context, msg, cancel)
        else:
            tokens = context + engine.tokenize(prompt, add_special=not context, cancel=cancel)
        known = {f.name for f in fields(GenerateOptions)} - {"acceptance_rule"}
        given = {k: v for k, v in (msg.get("options") or {}).items() if k in known}
        if msg.get("grammar"):  # GBNF, converted from ``format`` by the daemon at the door
            given["grammar"] = str(msg["grammar"])
        opts = GenerateOptions(**given)
        prediction = msg.get("prediction")
        predicted = engine.tokenize(prediction, add_special=False) if prediction else None
        self.send({"id": rid, "event": "prompt", "prompt_tokens": len(tokens)})

        def on_token(ev: TokenEvent) -> None:
            if ev.text or ev.logprob is not None:
                event = {"id": rid, "event": "token", "text": ev.text, "drafted": ev.drafted}
                if ev.logprob is not None:
                    event["logprob"] = _logprob_entry(engine, ev.logprob)
                self.send(event)

        def on_done(result: GenerateResult | None, error: BaseException | None) -> None:
            try:
                if isinstance(error, ModelhubError):
                    self._send_error(rid, error.message, error.kind.label)
                elif error is not None:
                    print(f"request {rid} failed: {error!r}", file=sys.stderr)
                    self._send_error(rid, f"{type(error).__name__}: {error}")
                elif result is not None:
                    payload = {k: v for k, v in asdict(result).items() if k != "tokens"}
                    payload["context"] = tokens + list(result.tokens)
                    self.send({"id": rid, "event": "done", "result": payload})
            finally:
                self._forget(rid)

        engine.submit(
            tokens,
            opts,
            on_done,
            on_token=on_token,
            cancel=cancel,
            prediction=predicted,
            images=images,
        )


def _logprob_entry(engine: Engine, lp: TokenLogprob) -> dict[str, Any]:
    """A token's log-probability as the APIs spell it: the token's text and bytes too."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        piece = engine.token_piece_bytes(token)
        text = piece.decode("utf-8", "replace")
        return {"token": text, "logprob": logprob, "bytes": list(piece)}

    return {**entry(lp.token, lp.logprob), "top": [entry(t, v) for t, v in lp.top]}


def die_with_parent() -> None:
    """Linux: the kernel kills this process when the daemon dies, even by SIGKILL mid-decode
    (stdin's end of file would only be seen between requests). Elsewhere, stdin EOF."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the daemon died before the request was made
        os._exit(1)


def main() -> None:
    die_with_parent()
    # Native libraries may print to stdout; keep the protocol channel private.
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    args = sys.argv[1:]
    heartbeat = float(args[1]) if args[:1] == ["--heartbeat"] and len(args) > 1 else 0.0
    Runner(proto, heartbeat).serve(sys.stdin)


if __name__ == "__main__":
    main()
