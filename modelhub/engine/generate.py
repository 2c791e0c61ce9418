"""The generation engine: prefill, the draft/verify loop, and everything a request sees.

The loop keeps one invariant: the target's KV cache holds every accepted token except the last,
the *pending* token, which opens the next verification batch ``[pending, d1..dK]`` (one
``llama_decode``, logits on every row). Row i is the target's prediction after row i's token.
Greedy requests keep the drafts that equal the target's choice; sampled requests use rejection
sampling (``speculative.verify``); either way the output is what the target alone would produce
(greedy: token for token; sampled: in distribution). Accepted tokens are committed one by one
through the same stop logic as plain decoding, and every cache is cut back to the committed
sequence after each round, so a stop, an end-of-generation token or a cancellation in the middle
of a chunk leaves the caches consistent for the next request (the prompt cache).

:class:`Engine` loads the models, prefills and starts each request; the draft/verify rounds are
:mod:`modelhub.engine.speculative_loop`, embeddings :mod:`modelhub.engine.embeddings`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from modelhub.engine.cpu import RepackDecision, inject_fault, repack_default
from modelhub.engine.embeddings import embed_texts, embedding_context
from modelhub.engine.grammar import GrammarConstraint
from modelhub.engine.llama import LlamaContext, LlamaModel, default_threads
from modelhub.engine.options import (
    DoneReason,
    EngineConfig,
    GenerateOptions,
    GenerateResult,
    TokenEvent,
    validate_config,
)
from modelhub.engine.sampling import Sampler
from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.base import Drafter
from modelhub.engine.speculative.draft_model import DraftModelDrafter, common_prefix
from modelhub.engine.speculative.factory import (
    Closable,
    Seeded,
    TargetObserver,
    make_drafter,
    ngram_drafter,
    prediction_drafter,
)
from modelhub.engine.speculative_loop import run_loop
from modelhub.engine.textstream import Committer
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
    """A loaded target model (plus drafter) that generates for one request at a time."""

    def __init__(self, cfg: EngineConfig, *, drafter: Drafter | None = None) -> None:
        """Load the target (and the configured drafter). ``drafter`` replaces the configured
        one (any ``base.Drafter``; used by tests with scripted drafters and by embedders)."""
        validate_config(cfg)
        self.cfg = cfg
        self.n_threads = cfg.n_threads if cfg.n_threads > 0 else default_threads()
        want_mtp = cfg.draft_kind == "mtp" and cfg.draft_num_predict > 0 and not cfg.draft_path
        self.repack = (
            RepackDecision(cfg.repack, "set by the daemon")
            if cfg.repack is not None
            else repack_default()
        )
        self.model = LlamaModel(Path(cfg.model_path), load_mtp=want_mtp, repack=self.repack.enabled)
        train = self.model.n_ctx_train
        n_ctx = min(cfg.n_ctx, train) if train > 0 else cfg.n_ctx
        try:
            self.ctx = LlamaContext(
                self.model, n_ctx=n_ctx, n_batch=cfg.n_batch, n_threads=self.n_threads
            )
        except BaseException:
            self.model.close()
            raise
        self.n_ctx = min(n_ctx, self.ctx.n_ctx)  # llama.cpp may round the context up
        self.cached: list[int] = []  # exactly the tokens in the target's KV cache
        self._lock = threading.Lock()
        self._embed_ctx: LlamaContext | None = None
        self.drafting_disabled: str | None = None
        if cfg.draft_kind == "mtp" and cfg.draft_path is not None and not _mtp_only(cfg):
            # gemma4-assistant style drafters share the target's KV cache through ctx_other;
            # that path is not implemented (or testable here): serve without drafting.
            self.drafting_disabled = (
                f"external MTP drafter files other than MTP-only GGUFs "
                f"({Path(cfg.draft_path).name}) are not supported by this engine yet"
            )
        elif self.model.is_recurrent or self.model.is_hybrid:
            # Partial KV removal is impossible there; checkpoints are not implemented.
            self.drafting_disabled = (
                f"{self.model.architecture} keeps recurrent state that cannot be rolled back"
            )
        self.drafter: Drafter | None = drafter if self.drafting_disabled is None else None
        if self.drafting_disabled is not None:
            if cfg.draft_kind != "none" or drafter is not None:
                log.warning("drafting disabled: %s", self.drafting_disabled)
        elif drafter is None:
            try:
                self.drafter = make_drafter(
                    cfg, self.model, self.ctx, self.n_threads, self.repack.enabled
                )
            except BaseException:
                self.close()
                raise
        self._controllers: dict[str, AdaptiveDraftLength] = {}
        self._ngram_fallback: Drafter | None = None
        try:
            self._warm_up()
        except BaseException:
            self.close()
            raise

    def _warm_up(self) -> None:
        """Run one small batch through every loaded model, so that a CPU fault in ggml's
        kernels (SIGILL: see ``cpu``) happens while loading, where the daemon can retry
        without repacking, and not in a user's first request. 16 rows reach the batched
        kernels (ggml's AMX code takes a vector path below 5 rows)."""
        inject_fault(self.repack.enabled)
        contexts = [self.ctx]
        if isinstance(self.drafter, DraftModelDrafter):
            contexts.append(self.drafter.ctx)
        for ctx in contexts:
            token = ctx.model.bos if ctx.model.bos >= 0 else 0
            ctx.decode([token] * min(16, ctx.n_batch, ctx.n_ctx), 0, "last")
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
        """Generate after ``prompt_tokens``; see the module docstring for the guarantees.

        ``on_token`` is called for each emitted token (from this thread); ``cancel`` is checked
        between decode steps and after each emitted token; ``prediction`` (token ids of the
        expected output, OpenAI's Predicted Outputs) drafts for this request in place of the
        configured drafter.
        """
        with self._lock:
            return self._generate(prompt_tokens, options, on_token, cancel, prediction)

    def _generate(
        self,
        prompt: list[int],
        options: GenerateOptions,
        on_token: Callable[[TokenEvent], None] | None,
        cancel: threading.Event | None,
        prediction: list[int] | None,
    ) -> GenerateResult:
        self._check_prompt(prompt)
        constraint = GrammarConstraint(self.model, options.grammar) if options.grammar else None
        sampler = Sampler(
            options,
            self.model.n_vocab,
            n_ctx=self.n_ctx,
            seed=options.seed,
            constraint=constraint,
        )
        committer = Committer(self.model, options, on_token, cancel)
        drafter, k_max = self._request_drafter(options, prediction)

        t_start = time.perf_counter_ns()
        evaluated = self._prefill(prompt, committer)
        t_prefilled = time.perf_counter_ns()
        result = GenerateResult(
            tokens=[],
            text="",
            done_reason="stop",
            prompt_eval_count=evaluated,
            prompt_eval_duration_ns=t_prefilled - t_start,
            eval_count=0,
            eval_duration_ns=0,
            drafter=drafter.kind if drafter is not None else None,
        )
        if committer.cancelled():
            return self._finish(result, committer, "cancel", t_prefilled)
        if options.num_predict == 0:
            return self._finish(result, committer, "length", t_prefilled)

        tokens = list(prompt)
        first = sampler.sample(self.ctx.last_logits(), tokens)
        sampler.accept(first)
        tokens.append(first)
        controller: AdaptiveDraftLength | None = None
        if drafter is not None:
            if isinstance(drafter, Seeded):
                seed = options.seed if options.seed is not None and options.seed >= 0 else None
                drafter.reseed(None if seed is None else seed + 1)
            drafter.begin(prompt)
            controller = self._controller(drafter.kind, k_max)
        if committer.commit(first, drafted=False):
            run_loop(self, tokens, sampler, committer, drafter, controller, k_max, options, result)
        return self._finish(result, committer, committer.done or "stop", t_prefilled)

    def _prefill(self, prompt: list[int], committer: Committer) -> int:
        """Evaluate what the cache does not already hold; the last prompt token always."""
        reuse = min(common_prefix(self.cached, prompt), len(prompt) - 1)
        if reuse < len(self.cached):
            if not self.ctx.truncate(reuse):
                self.ctx.clear()
                reuse = 0
            del self.cached[reuse:]
        if isinstance(self.drafter, TargetObserver):
            resume = self.drafter.rollback(reuse)
            if resume < reuse:  # it needs hidden states from earlier positions: replay them
                self.ctx.truncate(resume)
                del self.cached[resume:]
                reuse = resume
        # Everything but the last token in n_batch chunks, then the last token alone: its logits
        # (the first generated token) then come from a one-row decode whatever was cached, and
        # large batches take different CPU kernels than small ones (not bitwise equal).
        step = self.ctx.n_batch
        bounds = [(a, min(a + step, len(prompt) - 1)) for a in range(reuse, len(prompt) - 1, step)]
        bounds.append((len(prompt) - 1, len(prompt)))
        for start, end in bounds:
            if committer.cancelled():
                break
            chunk = prompt[start:end]
            self.ctx.decode(chunk, start, "last" if end == len(prompt) else "none")
            self.cached.extend(chunk)
            if isinstance(self.drafter, TargetObserver):
                self.drafter.observe_target(chunk, start)
        return len(self.cached) - reuse

    def _finish(
        self, result: GenerateResult, committer: Committer, reason: DoneReason, t_gen: int
    ) -> GenerateResult:
        result.text = committer.finish()
        result.tokens = committer.generated
        result.eval_count = len(committer.generated)
        result.eval_duration_ns = time.perf_counter_ns() - t_gen
        result.done_reason = reason
        return result

    def _request_drafter(
        self, options: GenerateOptions, prediction: list[int] | None
    ) -> tuple[Drafter | None, int]:
        """The drafter and its K bound for this request (None: plain decoding)."""
        if self.drafting_disabled is not None or options.grammar:
            return None, 0
        k_max = self.cfg.draft_num_predict
        if options.draft_num_predict is not None:
            k_max = options.draft_num_predict
        k_max = min(k_max, self.ctx.n_batch - 1)
        if k_max <= 0:
            return None, 0
        if prediction:
            return prediction_drafter(prediction, self._ngram()), k_max
        return self.drafter, k_max

    def _ngram(self) -> Drafter:
        """The model's n-gram drafter: the configured one, or one made for prediction requests
        (kept, with what it learned, for the next)."""
        if self.drafter is not None and self.drafter.kind == "ngram":
            return self.drafter
        if self._ngram_fallback is None:
            self._ngram_fallback = ngram_drafter(self.model.path)
        return self._ngram_fallback

    def _controller(self, kind: str, k_max: int) -> AdaptiveDraftLength:
        """One controller per drafter kind, kept across requests (costs do not change)."""
        ctl = self._controllers.get(kind)
        if ctl is None:
            ctl = AdaptiveDraftLength(k_max, adaptive=self.cfg.adaptive)
            self._controllers[kind] = ctl
        ctl.max_k = k_max
        return ctl

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
        with self._lock:
            return embed_texts(self.model, self._embedding_context(), texts)

    def _embedding_context(self) -> LlamaContext:
        if self._embed_ctx is None:
            self._embed_ctx = embedding_context(self.model, self.n_ctx, self.n_threads)
        return self._embed_ctx

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        if isinstance(self.drafter, Closable):
            self.drafter.close()
        self.drafter = None
        if self._embed_ctx is not None:
            self._embed_ctx.close()
            self._embed_ctx = None
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _mtp_only(cfg: EngineConfig) -> bool:
    """True when the configured MTP draft file holds only a model's NextN heads."""
    from modelhub.gguf.info import read_gguf_info

    return cfg.draft_path is not None and read_gguf_info(Path(cfg.draft_path)).is_mtp_only
