"""The numpy sampler against its definition and against llama.cpp's own sampler chain."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from modelhub.engine.sampling import Sampler, SamplingParams, softmax
from modelhub.errors import InputError

N_VOCAB = 500
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


def _logits(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(N_VOCAB) * 3).astype(np.float32)


def _llama_cpp_probs(logits: np.ndarray, params: SamplingParams, history: list[int]) -> np.ndarray:
    """The distribution llama.cpp's default chain would sample from (applied, not sampled)."""
    from modelhub.engine.llama import llama_cpp  # the engine module loads llama.cpp first

    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    penalties = llama_cpp.llama_sampler_init_penalties(
        N_VOCAB,
        params.repeat_last_n,
        params.repeat_penalty,
        params.frequency_penalty,
        params.presence_penalty,
    )
    add(chain, penalties)
    add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
    add(chain, llama_cpp.llama_sampler_init_typical(params.typical_p, 1))
    add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
    add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
    try:
        for token in history:
            llama_cpp.llama_sampler_accept(chain, token)
        data = np.zeros(N_VOCAB, dtype=TOKEN_DATA)
        data["id"] = np.arange(N_VOCAB)
        data["logit"] = logits
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=N_VOCAB,
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
        size = array.size
        view = np.ctypeslib.as_array(
            ctypes.cast(array.data, ctypes.POINTER(ctypes.c_byte)),
            shape=(size * TOKEN_DATA.itemsize,),
        ).view(TOKEN_DATA)
        ids = view["id"].copy()
        kept = view["logit"].astype(np.float64).copy()
    finally:
        llama_cpp.llama_sampler_free(chain)
    finite = np.isfinite(kept)
    out = np.zeros(N_VOCAB)
    out[ids[finite]] = softmax(kept[finite])
    return out


CASES = [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=0, top_p=0.95, min_p=0.02),
    SamplingParams(temperature=0.5, top_k=100, top_p=1.0, min_p=0.1),
    SamplingParams(temperature=1.0, top_k=60, top_p=0.8, typical_p=0.7),
    SamplingParams(temperature=0.9, top_k=50, repeat_penalty=1.3, repeat_last_n=16),
    SamplingParams(
        temperature=1.0,
        top_k=0,
        top_p=0.99,
        presence_penalty=0.7,
        frequency_penalty=0.4,
        repeat_last_n=32,
    ),
]


@pytest.mark.parametrize("params", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_probabilities_match_llama_cpp_chain(params: SamplingParams) -> None:
    rng = np.random.default_rng(5)
    for seed in range(5):
        logits = _logits(seed)
        history = [int(t) for t in rng.integers(0, N_VOCAB, size=40)]
        # make some history tokens strong candidates so penalties matter
        logits[history[-5:]] += 4.0
        ours = Sampler(params, N_VOCAB).probs(logits, history).astype(np.float64)
        theirs = _llama_cpp_probs(logits, params, history)
        assert np.array_equal(ours > 0, theirs > 0), "different surviving tokens"
        assert np.max(np.abs(ours - theirs)) < 1e-5


def test_greedy_is_argmax_of_penalised_logits() -> None:
    logits = np.zeros(10, dtype=np.float32)
    logits[3], logits[7] = 2.0, 1.9
    plain = Sampler(SamplingParams(temperature=0), 10)
    assert plain.greedy_token(logits, [3, 3]) == 3
    penalised = Sampler(SamplingParams(temperature=0, repeat_penalty=1.2), 10)
    assert penalised.greedy_token(logits, [3]) == 7  # 2.0 / 1.2 < 1.9
    assert penalised.sample(logits, [3]) == 7
    one_hot = penalised.probs(logits, [3])
    assert one_hot[7] == 1.0 and one_hot.sum() == 1.0


def test_negative_logits_are_multiplied_by_the_penalty() -> None:
    logits = np.array([-1.0, -1.1, -5.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=1.5), 3)
    out = s.penalised(logits, [0])
    assert out[0] == pytest.approx(-1.5)
    assert s.greedy_token(logits, [0]) == 1


def test_frequency_and_presence_penalties() -> None:
    logits = np.zeros(4, dtype=np.float32)
    s = Sampler(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), 4)
    out = s.penalised(logits, [1, 1, 1, 2])
    assert out.tolist() == pytest.approx([0.0, -1.75, -0.75, 0.0])
    assert logits.tolist() == [0.0] * 4  # the input (a view of llama.cpp's buffer) is untouched


def test_repeat_last_n_window() -> None:
    logits = np.ones(5, dtype=np.float32)
    s = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=2), 5)
    out = s.penalised(logits, [0, 1, 2])
    assert out.tolist() == [1.0, 0.5, 0.5, 1.0, 1.0]
    off = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=0), 5)
    assert off.penalised(logits, [0, 1, 2]).tolist() == [1.0] * 5
    whole = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=-1), 5, n_ctx=8)
    assert whole.penalised(logits, [0, 1, 2]).tolist() == [0.5, 0.5, 0.5, 1.0, 1.0]


def test_seeded_sampling_is_reproducible_and_follows_p() -> None:
    logits = _logits(1)
    params = SamplingParams(temperature=1.0, top_k=5, top_p=1.0)
    a = Sampler(params, N_VOCAB, seed=42)
    b = Sampler(params, N_VOCAB, seed=42)
    draws_a = [a.sample(logits, []) for _ in range(200)]
    assert draws_a == [b.sample(logits, []) for _ in range(200)]
    c = Sampler(params, N_VOCAB, seed=43)
    assert draws_a != [c.sample(logits, []) for _ in range(200)]
    p = a.probs(logits, [])
    assert set(draws_a) <= set(np.flatnonzero(p))
    counts = np.bincount([a.sample(logits, []) for _ in range(4000)], minlength=N_VOCAB)
    assert np.max(np.abs(counts / 4000 - p)) < 0.03


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_p", 1.5),
        ("min_p", -0.1),
        ("typical_p", 0.0),
        ("repeat_penalty", 0.0),
        ("repeat_last_n", -2),
        ("temperature", float("nan")),
    ],
)
def test_invalid_options_are_refused_with_the_option_name(field: str, value: float) -> None:
    params = SamplingParams(**{field: value})
    with pytest.raises(InputError, match=field):
        Sampler(params, 10)


class _AllowedSet:
    """A constraint that allows a fixed set of tokens (the protocol a grammar implements)."""

    def __init__(self, allowed: np.ndarray) -> None:
        self.allowed = allowed

    def allows(self, token: int) -> bool:
        return bool(self.allowed[token])

    def mask(self, logits: np.ndarray) -> None:
        logits[~self.allowed] = -np.inf

    def accept(self, token: int) -> None:
        pass

    def clone(self) -> _AllowedSet:
        return self

    def close(self) -> None:
        pass


@pytest.mark.parametrize("seed", range(40))
def test_greedy_under_a_constraint_is_the_argmax_of_the_mask(seed: int) -> None:
    """Asking the leading candidates one by one picks what masking everything would, ties
    (lowest id wins) and sparse constraints included."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6 if seed % 2 else 1000, N_VOCAB).astype(np.float32)
    allowed = rng.random(N_VOCAB) < (0.01 if seed % 3 == 0 else 0.5)
    allowed[rng.integers(N_VOCAB)] = True
    sampler = Sampler(SamplingParams(temperature=0), N_VOCAB, constraint=_AllowedSet(allowed))
    masked = np.where(allowed, scores, -np.inf)
    assert sampler.greedy_token(scores, []) == int(np.argmax(masked))
