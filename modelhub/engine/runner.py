"""The runner process: hosts one Engine (target + draft) and speaks JSON lines on stdin/stdout.

Each loaded model runs in its own process, so a crash, an abort or an out-of-memory kill in
native code costs that model, not the daemon. The protocol (one JSON object per line):

daemon -> runner
  {"op": "load", "config": {LoadConfig fields: EngineConfig's, paths as strings}}
  {"op": "generate", "id": "...", "prompt": "text", "context": [ids] | null,
   "options": {GenerateOptions fields}, "prediction": "text" | null, "grammar": GBNF | null,
   "image_marker": "regex with one group, the image's index" | absent,
   "images": {"index": {"width": n, "height": n, "rgb": base64}
              | {"audio": base64 WAV/MP3, "frames": n, "sample_rate": n}} | absent}
  {"op": "embed", "id": "...", "texts": ["..."]}
  {"op": "tokenize", "id": "...", "text": "...", "add_special": true}
  {"op": "count", "id": "...", "texts": ["..."], "add_special": true,
   "image_marker": "regex" | absent, "image_sizes": {"index": [width, height]} | absent,
   "audio_frames": {"index": [frames, sample_rate]} | absent}
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

``kind`` is an ``errors.ErrorKind`` label and ``error`` the name of the error's class: the
daemon raises that class again (``errors.rebuilt_error``). Every line is a class of
``engine.protocol``, which refuses a field it does not know: a request this runner cannot read
whole is answered with a ``RunnerProtocolError``, never served with a field dropped.
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
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from modelhub.engine import protocol as p
from modelhub.engine.liveness import LOAD_MARK, Heartbeat, write_mark
from modelhub.engine.load_config import LoadConfig
from modelhub.errors import ModelhubError, RequestCancelledError, RunnerProtocolError

if TYPE_CHECKING:  # the engine (llama.cpp) loads only in the runner's own start-up
    from modelhub.engine.generate import Engine
    from modelhub.engine.options import EngineConfig, TokenLogprob

_STOP = object()
# Numbers per embeddings line: about 1.5 MB of JSON (113 vectors of 576, 16 of 4096).
EMBED_PIECE_FLOATS = 65536
# Inputs embedded in one turn of the engine's thread: up to 8 texts or 64 tokens, so that a
# running generation waits at most about that long per step, while short texts do not pay a
# handover between threads each.
EMBED_GROUP_TEXTS, EMBED_GROUP_TOKENS = 8, 64


def engine_config(config: LoadConfig) -> EngineConfig:
    """The engine's settings for a load plan: paths as paths, the daemon's unset defaults
    (None) left to the engine's."""
    from modelhub.engine.options import DraftSource, EngineConfig

    values = {k: v for k, v in config.model_dump().items() if v is not None}
    for key in ("model_path", "draft_path", "state_dir", "projector_path"):
        if key in values:
            values[key] = Path(values[key])
    values["adapter_paths"] = [Path(a) for a in config.adapter_paths]
    values["tensor_split"] = list(config.tensor_split)
    values["rpc_servers"] = list(config.rpc_servers or ())
    values["draft_candidates"] = [
        DraftSource(c.name, c.kind, Path(c.path) if c.path else None, c.max_k)
        for c in config.draft_candidates
    ]
    return EngineConfig(**values)


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
        self.jobs: queue.Queue[p.Job | object] = queue.Queue()
        self.cancels: dict[str, threading.Event] = {}
        self.cancel_lock = threading.Lock()

    def send(self, event: p.Message | dict[str, Any]) -> None:
        """Write one event (a dict only for the heartbeat's ``alive``)."""
        if isinstance(event, p.Message):
            line = event.encode()
        else:
            line = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
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
            try:
                msg = p.decode_request(raw)
            except RunnerProtocolError as exc:
                self._refuse(raw, exc)
                continue
            if isinstance(msg, p.Load):
                write_mark("begin", LOAD_MARK)
                self._load(msg.config)
                write_mark("end", LOAD_MARK)
            elif isinstance(msg, p.Cancel):
                with self.cancel_lock:
                    event = self.cancels.get(msg.id)
                if event is not None:
                    event.set()
            elif isinstance(msg, p.Shutdown):
                break
            else:
                with self.cancel_lock:
                    self.cancels[msg.id] = threading.Event()
                self.jobs.put(msg)
        self.jobs.put(_STOP)
        if self.heartbeat is not None:
            self.heartbeat.stop()
        worker.join(timeout=5)
        if self.engine is not None:
            self.engine.close()

    def _refuse(self, raw: str, error: RunnerProtocolError) -> None:
        """Answer a line that is not a request of the protocol, where its sender waits."""
        print(f"refused: {error.message}", file=sys.stderr)
        if '"load"' in raw and '"op"' in raw and '"config"' in raw:
            self.send(p.LoadError.of(error))
        else:
            self.send(p.ErrorEvent.of(error, id=p.request_id(raw)))

    def _load(self, config: LoadConfig) -> None:
        from modelhub.engine.generate import Engine

        try:
            self.engine = Engine(engine_config(config))
        except ModelhubError as exc:
            self.send(p.LoadError.of(exc))
            return
        except Exception as exc:
            self.send(p.LoadError(message=f"{type(exc).__name__}: {exc}"))
            return
        engine = self.engine
        self.send(
            p.Loaded(
                pid=os.getpid(),
                n_ctx=engine.n_ctx,
                rss=_rss_bytes(),
                repack=engine.repack.enabled,
                repack_reason=engine.repack.reason,
                n_parallel=engine.n_parallel,
                kv_cache_type=engine.kv_cache_type,
                placement=engine.placement.report(),
                offload=engine.offload.reason,
                devices=[d.label for d in engine.offload.devices],
                draft_devices=[d.label for d in engine.offload.draft_devices],
                drafters=[src.name for src in engine.sources],
                default_drafters=engine.default_drafters,
            )
        )

    # -- worker thread ------------------------------------------------------------------
    def _work(self) -> None:
        while (msg := self.jobs.get()) is not _STOP:
            assert isinstance(msg, p.Job)
            rid = msg.id
            with self.cancel_lock:
                cancel = self.cancels.get(rid) or threading.Event()
            finished = True
            write_mark("begin", rid)
            try:
                if cancel.is_set():
                    raise RequestCancelledError("request canceled")
                if self.engine is None:
                    self.send(p.ErrorEvent(id=rid, message="no model loaded"))
                else:
                    finished = self._dispatch(rid, msg, cancel)
            except ModelhubError as exc:
                self._send_error(rid, exc)
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                self._send_error(rid, exc)
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

    def _send_error(self, rid: str, error: BaseException) -> None:
        """``error`` as the request's final event: one of ours keeps its class and kind."""
        if isinstance(error, ModelhubError):
            self.send(p.ErrorEvent.of(error, id=rid))
        else:
            self.send(p.ErrorEvent(id=rid, message=f"{type(error).__name__}: {error}"))

    def _dispatch(self, rid: str, req: p.Job, cancel: threading.Event) -> bool:
        """Serve one request; False when it goes on in the engine's batch (generate)."""
        engine = self.engine
        if isinstance(req, p.Generate):
            self._generate(rid, req, cancel)
            return False
        if isinstance(req, p.Embed):
            self._embed(rid, req.texts, cancel)
        elif isinstance(req, p.Drafting):
            self.send(p.DraftingReport(id=rid, report=engine.drafting_report()))
        elif isinstance(req, p.Tokenize):
            tokens = engine.tokenize(req.text, add_special=req.add_special)
            self.send(p.Tokens(id=rid, tokens=tokens))
        elif isinstance(req, p.Count):
            from modelhub.engine.vision import count_tokens

            msg, special = req.wire(), req.add_special
            counts = [count_tokens(engine, t, msg, special, cancel) for t in req.texts]
            self.send(p.Counts(id=rid, counts=counts))
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
                self.send(p.Vectors(id=rid, embeddings=piece))
                piece = []
        self.send(p.Embeddings(id=rid, embeddings=piece, prompt_eval_count=count))

    def _generate(self, rid: str, req: p.Generate, cancel: threading.Event) -> None:
        from modelhub.engine.generate import GenerateOptions, GenerateResult, TokenEvent

        engine = self.engine
        context = list(req.context or [])
        prompt = req.prompt
        engine.check_prompt_size(prompt, len(context))
        images = None
        if req.images:  # the prompt's image markers and their pixels (``vision``)
            from modelhub.engine.vision import prompt_with_images

            tokens, images = prompt_with_images(engine, prompt, context, req.wire(), cancel)
        else:
            tokens = context + engine.tokenize(prompt, add_special=not context, cancel=cancel)
        given = req.options.given()
        if req.grammar:  # GBNF, converted from ``format`` by the daemon at the door
            given["grammar"] = req.grammar
        opts = GenerateOptions(**given)
        prediction = req.prediction
        predicted = engine.tokenize(prediction, add_special=False) if prediction else None
        self.send(p.Prompt(id=rid, prompt_tokens=len(tokens)))

        def on_token(ev: TokenEvent) -> None:
            if ev.text or ev.logprob is not None:
                logprob: dict[str, Any] = {}
                if ev.logprob is not None:
                    logprob["logprob"] = _logprob_entry(engine, ev.logprob)
                self.send(p.Token(id=rid, text=ev.text, drafted=ev.drafted, **logprob))

        def on_done(result: GenerateResult | None, error: BaseException | None) -> None:
            try:
                if error is not None:
                    if not isinstance(error, ModelhubError):
                        print(f"request {rid} failed: {error!r}", file=sys.stderr)
                    self._send_error(rid, error)
                elif result is not None:
                    payload = {k: v for k, v in asdict(result).items() if k != "tokens"}
                    context = tokens + list(result.tokens)
                    self.send(p.Done(id=rid, result=p.DoneResult(**payload, context=context)))
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
