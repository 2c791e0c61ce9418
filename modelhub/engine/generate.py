"""The generation engine: prefill, the draft/verify loop, and everything a request sees.

Each request keeps one invariant: its KV sequence holds every accepted token except the last,
the *pending* token, which opens the next verification batch ``[pending, d1..dK]`` (one
``llama_decode``, logits on every row). Row i is the target's prediction after row i's token.
Greedy requests keep the drafts that equal the target's choice; sampled requests use rejection
sampling (``speculative.verify``); either way the output is what the target alone would produce
(greedy: token for token; sampled: in distribution). Accepted tokens are committed one by one
through the same stop logic as plain decoding, and every cache is cut back to the committed
sequence after each round, so a stop, an end-of-generation token or a cancellation in the middle
of a chunk leaves the caches consistent for the next request (the prompt cache).

:class:`Engine` loads the models and holds ``n_parallel`` slots (KV sequences, each with its
drafter and prompt cache); :mod:`modelhub.engine.batching` runs the requests of all slots in one
batch per step, :mod:`modelhub.engine.sequence` is one request's prefill and rounds, embeddings
are :mod:`modelhub.engine.embeddings`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from modelhub.engine.batching import BatchLoop
from modelhub.engine.context import LlamaContext
from modelhub.engine.cpu import RepackDecision, inject_fault, repack_default
from modelhub.engine.drafting_state import DraftLearning
from modelhub.engine.embeddings import embed_texts, embedding_context
from modelhub.engine.grammar import GrammarConstraint
from modelhub.engine.llama import LlamaModel, LoadPlacement
from modelhub.engine.members import fork_drafters, load_drafters, unsupported_drafter
from modelhub.engine.native import clear_allocation_log, default_threads
from modelhub.engine.offload import placement, plan_offload
from modelhub.engine.options import (
    DoneReason,
    EngineConfig,
    GenerateOptions,
    GenerateResult,
    TokenEvent,
    bounded_num_predict,
    validate_config,
)
from modelhub.engine.rollback import MAX_SNAPSHOTS, Rollback
from modelhub.engine.sampling import Sampler
from modelhub.engine.sequence import Generation, OnDone
from modelhub.engine.slot import Slot
from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.draft_model import DraftModelDrafter
from modelhub.engine.speculative.factory import (
    Closable,
    draft_sources,
    install_ngram_pool,
    ngram_pool,
)
from modelhub.engine.speculative.ngram import NgramPool
from modelhub.engine.textstream import Committer
from modelhub.engine.vision import IMAGES_WITH_OBSERVERS, ImageSpan, Projector, open_projector
from modelhub.engine.vision_drafting import follows_images
from modelhub.errors import InputError

__all__ = [
    "DoneReason",
    "Engine",
    "EngineConfig",
    "GenerateOptions",
    "GenerateResult",
    "TokenEvent",
]

log = logging.getLogger("modelhub.engine")


class Engine:
    """A loaded target model (plus drafter) serving up to ``n_parallel`` requests at once."""

    def __init__(self, cfg: EngineConfig, *, drafter: Drafter | None = None) -> None:
        """Load the target (and the configured drafter). ``drafter`` replaces the configured
        one (any ``base.Drafter``; used by tests with scripted drafters and by embedders)."""
        validate_config(cfg)
        self.cfg = cfg
        self.n_threads = cfg.n_threads if cfg.n_threads > 0 else default_threads()
        self.n_parallel = max(1, cfg.n_parallel)
        if self.n_parallel > 1 and drafter is not None:
            # A caller's drafter object is one sequence's state.
            log.info("num_parallel %d -> 1: a drafter given by the caller", self.n_parallel)
            self.n_parallel = 1
        self.sources, self.default_drafters = draft_sources(cfg, drafter)
        self._load_model()
        self._open_context(wants_draft=bool(self.sources) or drafter is not None)
        self._embed_ctx: LlamaContext | None = None
        self.projector: Projector | None = None
        try:
            self.projector = open_projector(self.model, cfg, self.n_threads, self.offload.devices)
        except BaseException:
            self.close()
            raise
        self.drafting_disabled = unsupported_drafter(cfg)
        if self.drafting_disabled is not None:
            log.warning("drafting disabled: %s", self.drafting_disabled)
            self.sources = [src for src in self.sources if src.path != cfg.draft_path]
            names = {src.name for src in self.sources}
            self.default_drafters = [n for n in self.default_drafters if n in names]
        self.learning = DraftLearning(cfg, self._conditions())
        self.slots: list[Slot] = []
        try:
            self._start_slots(drafter)
        except BaseException:
            self.close()
            raise

    def _load_model(self) -> None:
        """Plan where the target's layers go and load its weights (``self.model``)."""
        cfg = self.cfg
        self.repack = (
            RepackDecision(cfg.repack, "set by the daemon")
            if cfg.repack is not None
            else repack_default()
        )
        clear_allocation_log()
        self.offload = plan_offload(
            Path(cfg.model_path),
            cfg.num_gpu,
            cfg.rpc_servers,
            cfg.n_ctx * self.n_parallel,
            cfg.n_batch,
        )
        if self.offload.devices:
            log.info("offload: %s", self.offload.reason)
        self.model = LlamaModel(
            Path(cfg.model_path),
            load_mtp=any(src.kind == "mtp" and src.path is None for src in self.sources),
            placement=LoadPlacement(
                self.repack.enabled,
                self.offload.n_gpu_layers,
                cfg.main_gpu,
                tuple(cfg.tensor_split),
                cpu_only=self.offload.n_gpu_layers == 0,
            ),
        )

    def _open_context(self, wants_draft: bool) -> None:
        """The target's context (``self.ctx``: one KV sequence per slot, its adapters) and the
        rollback of its sequences; closes the model if that fails."""
        cfg = self.cfg
        train = self.model.n_ctx_train
        n_ctx = min(cfg.n_ctx, train) if train > 0 else cfg.n_ctx
        self.kv_cache_type = self.offload.kv_cache_type(cfg.kv_cache_type)
        if self.kv_cache_type != "f16" and self.model.head_size_k() % 32:
            # Q8_0/Q4_0 keys need heads of a multiple of 32 (llama.cpp refuses others).
            log.info("head size %d: F16 KV cache", self.model.head_size_k())
            self.kv_cache_type = "f16"
        recurrent = self.model.is_recurrent or self.model.is_hybrid
        snapshots = 0
        if recurrent and wants_draft and cfg.recurrent_rollback == "auto":
            bound = max([cfg.draft_num_predict, *(src.max_k for src in self.sources)])
            snapshots = min(MAX_SNAPSHOTS, bound)
        try:
            for path in cfg.adapter_paths:  # the model's ADAPTER: the target's contexts apply it
                self.model.load_adapter(Path(path))
            self.ctx = LlamaContext(
                self.model,
                n_ctx=n_ctx,
                n_batch=cfg.n_batch,
                n_threads=self.n_threads,
                n_seq=self.n_parallel,
                kv_cache_type=self.kv_cache_type,
                n_rs_seq=snapshots,
                flash_attn=cfg.flash_attn,
            )
            self.ctx.set_adapters(self.model.adapters, cfg.adapter_scale)
        except BaseException:
            self.model.close()
            raise
        self.n_ctx = min(n_ctx, self.ctx.n_ctx)  # llama.cpp may round the context up
        self.placement = placement()  # the target's weights, caches and buffers, per device
        # Recurrent state is cut back with snapshots or checkpoints (see ``rollback``).
        self.rollback = Rollback(self.ctx, recurrent)
        if recurrent and wants_draft:
            log.info(
                "%s keeps recurrent state: drafts are cut back with %s",
                self.model.architecture,
                f"{self.ctx.n_rs_seq} state snapshots" if self.ctx.n_rs_seq else "checkpoints",
            )

    def _start_slots(self, drafter: Drafter | None) -> None:
        """Load sequence 0's drafters, fork them for the other sequences, start the batch
        loop and warm every model up on its thread."""
        if drafter is None:  # the n-gram pool a previous run of this model kept
            saved = self.learning.memory.load_ngram_pool(self.cfg.ngram_persist)
            if saved is not None:
                install_ngram_pool(self.model.path, saved)
        target = (self.model, self.ctx, self.n_threads)
        draft_placement = self.offload.draft(self.repack)
        members = load_drafters(self.cfg, target, draft_placement, self.sources, drafter)
        defaults = len(self.default_drafters)
        self.slots.append(Slot(0, members, defaults))
        self.drafter: Drafter | None = self.slots[0].drafter
        self._loop = BatchLoop(self.ctx, self.slots)
        self.slots += [
            Slot(i, fork_drafters(self.model, members), defaults) for i in range(1, self.n_parallel)
        ]
        self._loop.call(self._warm_up)  # on the thread that will decode (see batching)

    def _conditions(self) -> dict[str, object]:
        """What the measured costs depend on besides the model: restored only where they match."""
        return {
            "n_threads": self.n_threads,
            "n_parallel": self.n_parallel,
            "kv_cache_type": self.kv_cache_type,
            "n_gpu_layers": self.offload.n_gpu_layers,
            "flash_attn": self.cfg.flash_attn,
            "verify_rows": "step",  # costs keyed by a step's rows (once: a round's own)
        }

    def _warm_up(self) -> None:
        """Run one small batch through every loaded model, so that a CPU fault in ggml's
        kernels (SIGILL: see ``cpu``) happens while loading (the daemon can retry without
        repacking): 16 rows reach the batched kernels (ggml's AMX code takes a vector path below
        5 rows); one if every layer is offloaded: no matrix product is the CPU's then."""
        inject_fault(self.repack.enabled)
        layers = self.placement.layers
        on_device = layers is not None and 0 < layers[1] <= layers[0]
        contexts = [(self.ctx, 1 if on_device else 16)]
        for member in self.slots[0].members:
            if isinstance(member.drafter, DraftModelDrafter):  # wholly on the draft devices
                contexts.append((member.drafter.ctx, 1 if self.offload.draft_devices else 16))
        for ctx, rows in contexts:
            token = ctx.model.bos if ctx.model.bos >= 0 else 0
            ctx.decode([token] * min(rows, ctx.n_batch, ctx.n_ctx), 0, "last")
            ctx.clear()

    # ---- text --------------------------------------------------------------------------------
    def tokenize(
        self,
        text: str,
        *,
        add_special: bool = True,
        parse_special: bool = True,
        cancel: threading.Event | None = None,
    ) -> list[int]:
        return self.model.tokenize(
            text, add_special=add_special, parse_special=parse_special, cancel=cancel
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize(tokens)

    def token_piece_bytes(self, token: int) -> bytes:
        return self.model.token_piece_bytes(token)

    # ---- generation --------------------------------------------------------------------------
    def generate(
        self,
        prompt_tokens: list[int],
        options: GenerateOptions,
        on_token: Callable[[TokenEvent], None] | None = None,
        cancel: threading.Event | None = None,
        prediction: list[int] | None = None,
    ) -> GenerateResult:
        """Generate after ``prompt_tokens`` and wait for the result; see the module docstring
        for the guarantees. Several threads may call it at once: up to ``n_parallel``
        requests run together, the others wait for a slot.

        ``on_token`` is called for each emitted token (from the engine's batch thread);
        ``cancel`` is checked between decode steps and after each emitted token;
        ``prediction`` (token ids of the expected output, OpenAI's Predicted Outputs) drafts
        for this request in place of the configured drafter.
        """
        done = threading.Event()
        outcome: list[GenerateResult | BaseException] = []

        def finished(result: GenerateResult | None, error: BaseException | None) -> None:
            outcome.append(error if error is not None else result)  # type: ignore[arg-type]
            done.set()

        self.submit(prompt_tokens, options, finished, on_token, cancel, prediction)
        done.wait()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def submit(
        self,
        prompt_tokens: list[int],
        options: GenerateOptions,
        on_done: OnDone,
        on_token: Callable[[TokenEvent], None] | None = None,
        cancel: threading.Event | None = None,
        prediction: list[int] | None = None,
        images: list[ImageSpan] | None = None,
    ) -> None:
        """Queue a request and return at once; ``on_done(result, None)`` or
        ``on_done(None, error)`` is called from the batch thread when it ends. A prompt that
        cannot be served raises here."""
        self._check_prompt(prompt_tokens)
        if images and not follows_images(self.slots[0].observers()):
            raise InputError(IMAGES_WITH_OBSERVERS)
        options = bounded_num_predict(options, self.n_ctx)
        constraint = GrammarConstraint(self.model, options.grammar) if options.grammar else None
        sampler = Sampler(
            options, self.model.n_vocab, n_ctx=self.n_ctx, seed=options.seed, constraint=constraint
        )
        mode = options.sampling_verify
        if mode == "coupled" or (mode == "auto" and sampler.seed is not None):
            sampler.couple()
        committer = Committer(self.model, options, on_token, cancel)
        gen = Generation(
            self, list(prompt_tokens), options, sampler, committer, prediction, on_done, images
        )
        self._loop.submit(gen)

    @property
    def load(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        return self._loop.counts

    def controller(self, name: str, klass: str, load: int, k_max: int) -> AdaptiveDraftLength:
        return self.learning.controller(name, klass, load, k_max)

    def finished(self, result: GenerateResult) -> None:
        """A request ended (on the batch thread): count it, keep what was learned now and
        then."""
        self.learning.finished(result, self._pool_to_keep())

    def _pool_to_keep(self) -> NgramPool | None:
        if not self.cfg.ngram_persist:
            return None
        return ngram_pool(self.model.path) if self.slots and self.slots[0].members else None

    def drafting_report(self) -> dict[str, object]:
        """What drafting learned so far (``show`` and ``ps`` print it)."""
        return self.learning.report([src.name for src in self.sources])

    def check_prompt_size(self, text: str, already: int = 0) -> None:
        """Refuse, before tokenizing, a prompt that cannot fit whatever its tokens are: one
        token covers at most ``max_piece_bytes`` bytes, so ``text`` has at least this many."""
        at_least = -(-len(text.encode("utf-8")) // self.model.max_piece_bytes()) + already
        if at_least >= self.n_ctx:
            raise InputError(
                f"the prompt has at least {at_least} tokens but the context holds {self.n_ctx}: "
                "shorten the prompt or load the model with a larger num_ctx"
            )

    def _check_prompt(self, prompt: Sequence[int]) -> None:
        if not prompt:
            raise InputError("the prompt is empty: at least one token is needed")
        if len(prompt) >= self.n_ctx:
            raise InputError(
                f"the prompt has {len(prompt)} tokens but the context holds {self.n_ctx}: "
                "shorten the prompt or load the model with a larger num_ctx"
            )
        bad = [t for t in prompt if not 0 <= t < self.model.n_vocab]
        if bad:
            raise InputError(
                f"token id {bad[0]} is outside the vocabulary (0..{self.model.n_vocab - 1})"
            )

    # ---- embeddings ----------------------------------------------------------------------------
    def embed(self, texts: list[str]) -> list[list[float]]:
        """Mean-pooled, L2-normalised embeddings (one per text), from a separate context."""
        return self._loop.call(lambda: embed_texts(self.model, self._embedding_context(), texts))

    def _embedding_context(self) -> LlamaContext:
        if self._embed_ctx is None:
            self._embed_ctx = embedding_context(self.model, self.n_ctx, self.n_threads)
            self._embed_ctx.set_adapters(self.model.adapters, self.cfg.adapter_scale)
        return self._embed_ctx

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.close()
        learning = getattr(self, "learning", None)
        if learning is not None and getattr(self, "slots", None):
            learning.close(self._pool_to_keep())
        for slot in reversed(getattr(self, "slots", [])):  # forks before the drafter they share
            for member in slot.members:
                if isinstance(member.drafter, Closable):
                    member.drafter.close()
            slot.members = []
        self.drafter = None
        if self._embed_ctx is not None:
            self._embed_ctx.close()
            self._embed_ctx = None
        projector: Projector | None = getattr(self, "projector", None)
        if projector is not None:
            projector.close()
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
