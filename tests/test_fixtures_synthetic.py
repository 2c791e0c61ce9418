"""The synthetic GGUF fixtures: deterministic, small, and usable by llama-cpp-python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from modelhub.gguf.info import read_gguf_info
from tests.fixtures.synthetic import (
    MALFORMED_CASES,
    MISMATCH_FIELDS,
    NORMAL,
    tiny_vocab,
    write_malformed,
    write_mismatched_draft,
    write_tiny_llama,
    write_tiny_llama_pair,
    write_tiny_mtp,
)

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ("hello world the model", "the tiny draft is fast", "token model world hello the")

try:
    import llama_cpp
except ImportError:  # pragma: no cover - llama-cpp-python is a hard dependency
    llama_cpp = None

needs_llama_cpp = pytest.mark.skipif(llama_cpp is None, reason="llama-cpp-python not installed")


def write_all(d: Path) -> list[Path]:
    paths = [*write_tiny_llama_pair(d), write_tiny_mtp(d / "mtp1.gguf")]
    paths.append(write_tiny_mtp(d / "mtp2.gguf", heads=2))
    paths += [write_mismatched_draft(d, f) for f in MISMATCH_FIELDS]
    paths += [write_malformed(d, c) for c in MALFORMED_CASES]
    return paths


def test_fixtures_are_deterministic_and_small(tmp_path: Path) -> None:
    first = write_all(tmp_path / "a")
    second = write_all(tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second]
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
        assert a.stat().st_size < 300_000, a.name
    assert len({p.name for p in first}) == len(first)


def test_draft_shares_shape_and_vocab_but_not_weights(tmp_path: Path) -> None:
    target, draft = write_tiny_llama_pair(tmp_path)
    t, d = read_gguf_info(target), read_gguf_info(draft)
    assert t.tokens_fingerprint == d.tokens_fingerprint
    assert [(x.name, x.shape) for x in t.tensors] == [(x.name, x.shape) for x in d.tensors]
    assert target.read_bytes() != draft.read_bytes()


TOKENIZER_FIELDS = ("tokenizer_model", "vocab_size", "eos_id", "add_bos", "tokens_fingerprint")
CHANGED = {
    "vocab_size": {"vocab_size", "tokens_fingerprint"},
    "token_text": {"tokens_fingerprint"},
    "tokenizer_model": {"tokenizer_model"},
    "eos_id": {"eos_id"},
    "add_bos": {"add_bos"},
}


@pytest.mark.parametrize("field", MISMATCH_FIELDS)
def test_mismatched_draft_differs_in_exactly_one_field(field: str, tmp_path: Path) -> None:
    base = read_gguf_info(write_tiny_llama(tmp_path / "base.gguf"))
    variant = read_gguf_info(write_mismatched_draft(tmp_path, field))
    changed = {f for f in TOKENIZER_FIELDS if getattr(base, f) != getattr(variant, f)}
    assert changed == CHANGED[field]
    others = ("bos_id", "add_eos", "tokenizer_pre", "architecture", "block_count")
    assert all(getattr(base, f) == getattr(variant, f) for f in others)


def test_unknown_cases_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown malformed case"):
        write_malformed(tmp_path, "nope")
    with pytest.raises(ValueError, match="unknown mismatch field"):
        write_mismatched_draft(tmp_path, "nope")
    with pytest.raises(ValueError, match="quant must be one of"):
        write_tiny_llama(tmp_path / "x.gguf", quant="Q2_K")


def _greedy_rows(model: llama_cpp.Llama, tokens: list[int]) -> np.ndarray:
    model.reset()
    model.eval(tokens)
    return np.asarray(model.scores[: len(tokens)]).argmax(axis=1)


@pytest.mark.slow
@needs_llama_cpp
def test_tiny_llama_loads_tokenizes_and_generates(tmp_path: Path) -> None:
    target, draft = write_tiny_llama_pair(tmp_path)
    vocab = tiny_vocab()
    from modelhub.engine.native import default_threads

    kw = {"n_ctx": 256, "n_threads": default_threads(), "verbose": False, "logits_all": True}
    model = llama_cpp.Llama(model_path=str(target), **kw)
    ids = model.tokenize(b"hello world")
    assert ids == [1, vocab.tokens.index("▁hello"), vocab.tokens.index("▁world")]
    assert model.detokenize(ids[1:]) == b" hello world"
    out = model.create_completion("hello world", max_tokens=24, temperature=0.0)
    text = out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == 24 and text.strip()
    # Greedy continuations use ordinary tokens only, and the draft agrees often, not always.
    draft_model = llama_cpp.Llama(model_path=str(draft), **kw)
    agreement = []
    for prompt in PROMPTS:
        seq = model.tokenize(prompt.encode())
        n_prompt = len(seq)
        model.reset()
        model.eval(seq)
        for _ in range(48):
            seq.append(int(np.argmax(model.scores[len(seq) - 1])))
            model.eval(seq[-1:])
        assert all(vocab.types[t] == NORMAL for t in seq[n_prompt:])
        rows = slice(n_prompt - 1, len(seq) - 1)
        same = _greedy_rows(model, seq)[rows] == _greedy_rows(draft_model, seq)[rows]
        agreement.append(float(np.mean(same)))
    print("draft/target greedy agreement per prompt:", agreement)
    assert 0.5 < float(np.mean(agreement)) < 0.97, agreement
    chat = model.create_chat_completion(
        messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0.0
    )
    assert chat["usage"]["prompt_tokens"] > 3


# Runs in a child process: a C assertion while creating an MTP context would otherwise take
# the whole test session down with it.
def mtp_probe(path: str) -> dict[str, float]:
    """Load with load_mtp, decode a greedy sequence with the trunk, run the NextN head on the
    (token, previous hidden state) rows and report how often it predicts the target's token."""
    import ctypes

    from llama_cpp import llama_cpp as L
    from llama_cpp import llama_cpp_ext as X

    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.load_mtp = True
    model = L.llama_model_load_from_file(path.encode(), params)
    assert model, "model failed to load"
    vocab = L.llama_model_get_vocab(model)
    n_vocab, n_embd = L.llama_vocab_n_tokens(vocab), L.llama_model_n_embd(model)

    def context(mtp: bool, other: object = None) -> object:
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
        cp.n_threads = cp.n_threads_batch = 2
        cp.flash_attn_type = 1
        if mtp:
            cp.ctx_type, cp.ctx_other = 1, other
        ctx = L.llama_init_from_model(model, cp)
        assert ctx, "context creation failed"
        return ctx

    def decode(ctx: object, tokens: list[int], pos0: int, embd: np.ndarray | None = None):
        batch = L.llama_batch_init(len(tokens), n_embd if embd is not None else 0, 1)
        own = (L.llama_token * len(tokens))(*tokens)
        if embd is not None:  # MTP rows carry a token and a hidden state each
            rows = np.ascontiguousarray(embd, np.float32)
            ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
            batch.token = ctypes.cast(own, ctypes.POINTER(L.llama_token))
        for i, tok in enumerate(tokens):
            if embd is None:
                batch.token[i] = tok
            batch.pos[i], batch.n_seq_id[i], batch.logits[i] = pos0 + i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        rc = L.llama_decode(ctx, batch)
        if embd is not None:
            batch.token = ctypes.cast(None, ctypes.POINTER(L.llama_token))
        L.llama_batch_free(batch)
        assert rc == 0, f"llama_decode returned {rc}"
        logits = L.llama_get_logits(ctx)
        return np.ctypeslib.as_array(logits, shape=(len(tokens), n_vocab)).copy()

    trunk = context(False)
    X.llama_set_embeddings_nextn(trunk, True, False)
    agreement = []
    for prompt in PROMPTS:
        buf = (L.llama_token * 64)()
        n = L.llama_tokenize(vocab, prompt.encode(), len(prompt), buf, 64, True, False)
        seq = list(buf[:n])
        logits = decode(trunk, seq, 0)
        for _ in range(32):
            seq.append(int(logits[-1].argmax()))
            logits = decode(trunk, seq[-1:], len(seq) - 1)
        L.llama_memory_clear(L.llama_get_memory(trunk), True)
        target_rows = decode(trunk, seq, 0).argmax(axis=1)
        hidden = np.array(
            [
                np.ctypeslib.as_array(X.llama_get_embeddings_nextn_ith(trunk, i), shape=(n_embd,))
                for i in range(len(seq))
            ]
        )
        assert np.isfinite(hidden).all()
        head = context(True, trunk)
        X.llama_set_embeddings_nextn(head, True, True)
        # row p pairs token p with the trunk's hidden state at p - 1 and predicts token p + 1
        head_rows = decode(head, seq[1:], 1, hidden[:-1]).argmax(axis=1)
        agreement.append(float(np.mean(head_rows == target_rows[1:])))
        L.llama_free(head)
        L.llama_memory_clear(L.llama_get_memory(trunk), True)
    L.llama_free(trunk)
    return {"nextn": L.llama_model_n_layer_nextn(model), "agreement": float(np.mean(agreement))}


@pytest.mark.slow
@needs_llama_cpp
@pytest.mark.parametrize("heads", [1, 2])
def test_tiny_mtp_loads_with_mtp_and_its_head_predicts_the_target(
    heads: int, tmp_path: Path
) -> None:
    path = write_tiny_mtp(tmp_path / "mtp.gguf", heads=heads)
    code = (
        "import json, sys\n"
        "from tests.test_fixtures_synthetic import mtp_probe\n"
        "print('RESULT ' + json.dumps(mtp_probe(sys.argv[1])))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    print(f"MTP head/target agreement with {heads} head(s):", result["agreement"])
    assert result["nextn"] == heads
    # structured weights: the head mostly agrees with the trunk (random ones give about 0)
    assert result["agreement"] > 0.6, result
