"""What the engine takes and returns: load settings, request options, events and results.

These are the engine's public API (the runner and the benchmarks build them); see
:class:`modelhub.engine.generate.Engine` for the behaviour behind them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from modelhub.engine.load_config import DraftKind
from modelhub.engine.sampling import SamplingParams
from modelhub.engine.speculative.verify import AcceptanceRule, rejection_step
from modelhub.errors import InputError

DoneReason = Literal["stop", "length", "cancel"]
# ``GenerateOptions.draft`` values other than a drafter's name.
DRAFT_AUTO, DRAFT_OFF = "auto", "off"


@dataclass(frozen=True)
class DraftSource:
    """A drafter an engine loads besides the configured one: ``name`` is what a request's
    ``draft`` option and ``show`` call it, ``kind`` an engine drafter kind, ``path`` its GGUF
    (None for the target's own MTP heads and for n-gram), ``max_k`` its bound on guesses."""

    name: str
    kind: DraftKind
    path: Path | None = None
    max_k: int = 4


@dataclass
class EngineConfig:
    """Load-time settings (changing one means loading the model again).

    ``n_threads`` 0 means every core this process may use. ``draft_num_predict`` is the upper
    bound K on drafts per round (0 disables drafting); with ``adaptive`` the engine picks K in
    ``0..draft_num_predict`` from measured costs and acceptance. ``draft_min`` discards proposals
    shorter than that; ``draft_p_min`` stops a draft model once its top probability falls below
    it. ``draft_path`` is the draft GGUF for ``draft_model`` (for ``mtp`` it is unused: the
    target's own NextN heads draft). ``draft_n_ctx`` caps the draft model's context (0: the
    target's); once a sequence outgrows it, that request continues without drafting.
    ``repack`` lets ggml repack weights into its extra CPU buffer types (AMX, AVX-512/NEON
    layouts); None decides per machine (``cpu.repack_default``), False is the SIGILL fallback.
    ``n_parallel`` sequences run at once, each with ``n_ctx`` positions of its own (MTP
    drafting serves one). ``kv_cache_type`` is the target's KV cache type: ``auto`` (keys Q8_0,
    values F16: the CPU attention kernel then is the same for every batch shape, see
    ``llama.KV_TYPES``), or ``f16``, ``q8_0``, ``q4_0`` for both. ``adapter_paths`` are GGUF
    LoRA adapters applied to the target (its generation and embedding contexts, not a draft
    model) at ``adapter_scale`` times their own ``alpha / rank``. ``recurrent_rollback``: how a
    target with recurrent state is cut back after a rejected draft (``engine.rollback``):
    ``auto`` uses llama.cpp's state snapshots where the architecture has them and checkpoints
    otherwise, ``checkpoint`` always checkpoints (for comparisons). ``num_gpu`` layers of the
    target go to the offload devices (``engine.offload``: -1 as many as fit, 0 CPU only),
    split by ``tensor_split`` with ``main_gpu`` first; ``rpc_servers`` (``host:port``) are
    ggml RPC workers registered as such devices. Draft files go wholly to the local
    accelerators when the target uses them, never to RPC workers. ``flash_attn``
    False turns flash attention off for the target (batched verification is then no longer
    bit-identical to one-token decoding on CPU: greedy drafting may change the output).
    """

    model_path: Path
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0
    draft_kind: DraftKind = "none"
    draft_path: Path | None = None
    draft_name: str = ""
    draft_candidates: list[DraftSource] = field(default_factory=list)
    state_dir: Path | None = None
    ngram_persist: bool = True
    draft_num_predict: int = 4
    draft_min: int = 0
    draft_p_min: float = 0.0
    adaptive: bool = True
    draft_n_ctx: int = 0
    repack: bool | None = None
    n_parallel: int = 1
    kv_cache_type: str = "auto"
    adapter_paths: list[Path] = field(default_factory=list)
    adapter_scale: float = 1.0
    projector_path: Path | None = None  # a vision projector (mmproj) GGUF: images in prompts
    recurrent_rollback: Literal["auto", "checkpoint"] = "auto"
    num_gpu: int = -1
    flash_attn: bool = True
    main_gpu: int = 0
    tensor_split: list[float] = field(default_factory=list)
    rpc_servers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GenerateOptions(SamplingParams):
    """Per-request options (Ollama's runtime options, docs/api.md "Options"): the sampling
    options of :class:`SamplingParams` plus what shapes the request.

    ``num_predict`` < 0 means no limit but ten contexts (see :func:`bounded_num_predict`; the
    context itself without ``shift``). ``seed`` < 0 or None draws a random seed.
    ``grammar`` is GBNF text (see ``gbnf.format_grammar`` for Ollama's ``format``); a
    constrained request is decoded without drafting. ``draft_num_predict`` overrides the engine's
    bound for this request (0 turns drafting off). ``acceptance_rule`` is the rejection-sampling
    step; it is a parameter only so that tests can prove a wrong rule is detected.
    ``sampling_verify`` selects how sampled requests verify drafts: ``"rejection"`` (rejection
    sampling), ``"coupled"`` (Gumbel-max sampling with noise fixed by the seed and the token's
    index, a draft kept when it is the token the target draws: the output is the same with any
    drafter or none), ``"compare"`` (sample the target, accept while it equals the draft:
    llama.cpp's rule, kept for benchmarks); ``"auto"``: coupled when a seed is given, else
    rejection.
    ``draft`` picks this request's drafter: None or ``"auto"`` the model's default, ``"off"``
    none, else the name of one of the engine's drafters (``EngineConfig.draft_candidates``).
    ``top_logprobs``: None returns no log-probabilities; n >= 0 gives every emitted token its
    log-probability and the n most likely alternatives (``Sampler.log_distribution``).
    ``shift`` (Ollama's request field): when the context fills, keep the first ``num_keep``
    tokens (plus BOS; < 0: the whole prompt), discard half of the rest and go on (False:
    stop with ``length``).
    """

    num_predict: int = -1
    num_keep: int = 4
    shift: bool = True
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    grammar: str | None = None
    draft_num_predict: int | None = None
    draft: str | None = None
    acceptance_rule: AcceptanceRule = rejection_step
    sampling_verify: Literal["auto", "rejection", "coupled", "compare"] = "auto"
    top_logprobs: int | None = None


@dataclass
class TokenEvent:
    """One emitted token. ``text`` is what is safe to show now: incomplete UTF-8 sequences and a
    possible beginning of a stop string are held back and arrive with later events. At the end,
    held-back text that turned out not to be a stop string arrives in an event with
    ``token == -1``. ``drafted`` is True when the token came from an accepted draft;
    ``logprob`` is set when the request asked for log-probabilities."""

    token: int
    text: str
    drafted: bool
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability and the ``top`` alternatives, (token, logprob) best
    first."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class GenerateResult:
    """The outcome of one request.

    ``tokens`` are the generated ids (without a final end-of-generation token); ``text`` is their
    text cut before any stop string. ``prompt_eval_count`` counts the prompt tokens actually
    evaluated (a prefix reused from the previous request is not); durations are nanoseconds.
    Draft statistics follow SPEC-09: ``draft_count`` tokens proposed, ``draft_accepted_count``
    of them kept (bonus tokens excluded), ``draft_steps`` rounds that verified drafts;
    ``draft_count_by_position[i]`` rounds that verified a draft at position i + 1, of which
    ``draft_accepted_by_position[i]`` kept it. ``drafter`` is the kind and ``drafter_name`` the
    name of the drafter that guessed the most; ``plain_estimate_ns`` the time the controllers
    predict plain decoding would have taken for the same tokens (0: no estimate).
    ``stop_sequence`` is the stop string that ended generation (None: it ended otherwise).
    """

    tokens: list[int]
    text: str
    done_reason: DoneReason
    prompt_eval_count: int
    prompt_eval_duration_ns: int
    eval_count: int
    eval_duration_ns: int
    draft_count: int = 0
    draft_accepted_count: int = 0
    draft_steps: int = 0
    draft_time_ns: int = 0
    verify_time_ns: int = 0
    drafter: str | None = None
    drafter_name: str | None = None
    draft_count_by_position: list[int] = field(default_factory=list)
    draft_accepted_by_position: list[int] = field(default_factory=list)
    plain_estimate_ns: int = 0
    stop_sequence: str | None = None

    @property
    def acceptance(self) -> float:
        return self.draft_accepted_count / self.draft_count if self.draft_count else 0.0


# With context shift a generation could go on for ever: as Ollama, at most this many contexts.
OPEN_ENDED_CONTEXTS = 10


def bounded_num_predict(options: GenerateOptions, n_ctx: int) -> GenerateOptions:
    """``options`` with ``num_predict`` at most ``OPEN_ENDED_CONTEXTS * n_ctx`` when the
    context shifts (-1 included: Ollama's ``boundedNumPredict``); without ``shift`` the
    context itself bounds it."""
    limit = OPEN_ENDED_CONTEXTS * n_ctx
    if not options.shift or 0 <= options.num_predict <= limit:
        return options
    return replace(options, num_predict=limit)


def validate_config(cfg: EngineConfig) -> None:
    if cfg.n_ctx < 8:
        raise InputError(f"num_ctx={cfg.n_ctx} is too small: use at least 8")
    if cfg.n_batch < 1:
        raise InputError(f"num_batch={cfg.n_batch} must be at least 1")
    if cfg.draft_num_predict < 0:
        raise InputError("draft_num_predict must be 0 (off) or positive")
    if cfg.draft_kind not in ("none", "auto") and cfg.draft_num_predict + 1 > cfg.n_batch:
        raise InputError(
            f"draft_num_predict={cfg.draft_num_predict} needs num_batch >= "
            f"{cfg.draft_num_predict + 1} (the pending token plus every draft in one batch); "
            f"num_batch is {cfg.n_batch}"
        )
    from modelhub.engine.llama import KV_TYPES

    if cfg.kv_cache_type not in KV_TYPES:
        raise InputError(f"kv_cache_type {cfg.kv_cache_type!r} is not one of {', '.join(KV_TYPES)}")
    if not 0.0 <= cfg.draft_p_min <= 1.0:
        raise InputError(f"draft_p_min={cfg.draft_p_min} must be between 0 and 1")
    if not math.isfinite(cfg.adapter_scale):
        raise InputError(f"adapter_scale={cfg.adapter_scale} must be a finite number")
    if cfg.draft_kind == "draft_model" and cfg.draft_path is None:
        raise InputError("draft_kind 'draft_model' needs draft_path")
