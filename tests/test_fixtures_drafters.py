"""The synthetic drafter fixtures load in llama.cpp and run the way common/speculative.cpp
drives them: each paired scenario pairs a drafter with its target, drafts, verifies with the
target and rolls back, for a few rounds, through llama-cpp-python's low-level API.

llama.cpp aborts the process (GGML_ABORT) on some bad inputs, so the paired scenarios run in
a subprocess (``python -m tests.test_fixtures_drafters <scenario> <dir>``) and report JSON.
A few functions the drafters need are exported by libllama but not bound by
llama-cpp-python 0.3.36 (``llama_set_embeddings_layer_inp``, ``llama_get_embeddings_layer_inp``,
``llama_model_target_layer_ids(_n)``): ``_ext_fn`` binds them here by their C++ symbol.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from tests.fixtures import synthetic, synthetic_drafters

ROOT = Path(__file__).resolve().parent.parent
PROMPT = (1, 300, 301)  # <s> and two word pieces
ROUNDS = 8

# ---------------------------------------------------------------- bindings


def _ext_fn(names: Sequence[str], argtypes: list[Any], restype: Any) -> Any:
    lib = llama_cpp.llama_cpp._lib
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = argtypes, restype
            return fn
    raise AttributeError(f"libllama exports none of {', '.join(names)}")


_CTX, _MODEL = llama_cpp.llama_context_p_ctypes, llama_cpp.llama_model_p_ctypes
_FLOATS = ctypes.POINTER(ctypes.c_float)


def set_embeddings_layer_inp(ctx: Any, lid: int, value: bool) -> None:
    fn = _ext_fn(
        ["llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"],
        [_CTX, ctypes.c_uint32, ctypes.c_bool],
        None,
    )
    fn(ctx, lid, value)


def get_embeddings_layer_inp(ctx: Any, lid: int) -> Any:
    fn = _ext_fn(
        ["llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj"],
        [_CTX, ctypes.c_uint32],
        _FLOATS,
    )
    return fn(ctx, lid)


def target_layer_ids(model: Any) -> list[int]:
    ids = _ext_fn(
        ["llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model"],
        [_MODEL],
        ctypes.POINTER(ctypes.c_int32),
    )
    count = _ext_fn(
        ["llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model"],
        [_MODEL],
        ctypes.c_uint32,
    )
    ptr, n = ids(model), int(count(model))
    return [int(ptr[i]) for i in range(n)]


# ---------------------------------------------------------------- low-level helpers


def load(path: Path) -> Any:
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.vocab_only = False
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"{path.name} did not load"
    return model


def meta(model: Any, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else ""


def context(model: Any, *, ctx_type: int = 0, other: Any = None) -> Any:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 256
    params.n_batch = params.n_ubatch = 64
    params.n_threads = params.n_threads_batch = 2
    params.ctx_type = ctx_type
    if other is not None:
        params.ctx_other = other
    ctx = llama_cpp.llama_init_from_model(model, params)
    assert ctx, "context creation failed"
    return ctx


class Batch:
    """A ``llama_batch_ext`` for one sequence; keeps the arrays it points into alive."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.handle = llama_cpp.llama_batch_ext_init(ctx)
        self._keep: list[Any] = []
        self.n = 0

    def _embd(self, row: np.ndarray) -> Any:
        row = np.ascontiguousarray(row, dtype=np.float32)
        self._keep.append(row)
        return llama_cpp.llama_embd(row.ctypes.data_as(_FLOATS), 1, row.shape[0])

    def _finish(self, idx: int, pos: int, output: bool) -> None:
        assert idx >= 0, f"batch add failed ({idx})"
        p = (llama_cpp.llama_pos * 1)(pos)
        self._keep.append(p)
        assert llama_cpp.llama_batch_ext_set_pos(self.handle, idx, p)
        if output:
            llama_cpp.llama_batch_ext_set_output_logits(self.handle, idx, True)
        self.n += 1

    def add(self, token: int, pos: int, output: bool, embd: np.ndarray | None = None) -> None:
        """A token entry; with ``embd``, the token's paired input row (an MTP / EAGLE-3 h)."""
        idx = llama_cpp.llama_batch_ext_add_token(self.handle, 0, token)
        if embd is not None and idx >= 0:
            assert llama_cpp.llama_batch_ext_set_embd_token(self.handle, idx, self._embd(embd))
        self._finish(idx, pos, output)

    def add_embd(self, embd: np.ndarray, pos: int, output: bool) -> None:
        """An embedding-only entry (EAGLE-3 encoder input, DFlash KV injection)."""
        idx = llama_cpp.llama_batch_ext_add_embd(self.handle, 0, self._embd(embd))
        self._finish(idx, pos, output)

    def run(self, kind: int = llama_cpp.LLAMA_PROCESS_TYPE_DECODE) -> None:
        rc = llama_cpp.llama_process(self.ctx, kind, self.handle)
        llama_cpp.llama_batch_ext_free(self.handle)
        self.handle = None
        assert rc == 0, f"llama_process returned {rc}"


def rows(ptr: Any, n: int, width: int) -> np.ndarray:
    assert ptr, "no rows"
    return np.ctypeslib.as_array(ptr, shape=(n, width)).copy()


def argmax_ith(ctx: Any, i: int, n_vocab: int) -> int:
    return int(np.argmax(rows(llama_cpp.llama_get_logits_ith(ctx, i), 1, n_vocab)[0]))


def seq_rm(ctx: Any, p0: int) -> None:
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, p0, -1)


def decode_target(ctx: Any, tokens: Sequence[int], start: int, n_vocab: int) -> list[int]:
    """Decode ``tokens`` at ``start..`` with every row's logits; the greedy next tokens."""
    batch = Batch(ctx)
    for i, t in enumerate(tokens):
        batch.add(t, start + i, True)
    batch.run()
    return [argmax_ith(ctx, i, n_vocab) for i in range(len(tokens))]


def speculate(
    tgt_ctx: Any,
    n_vocab: int,
    draft: Callable[[int, int], list[int]],
    process: Callable[[list[int], int], None],
    accept: Callable[[int], None],
    after_draft: Callable[[int], None] = lambda n_past: None,
    rollback: Callable[[int], None] = lambda n_past: None,
) -> dict[str, Any]:
    """The loop of examples/speculative-simple: prefill all but the last prompt token, then
    per round draft from (id_last, n_past), verify [id_last, drafts...] with the target, feed
    the verified batch to the drafter (``process``), accept the agreeing prefix, roll back."""
    prefix = list(PROMPT[:-1])
    decode_target(tgt_ctx, prefix, 0, n_vocab)
    process(prefix, 0)
    id_last, n_past = PROMPT[-1], len(prefix)
    drafted = accepted = first_ok = 0
    out: list[int] = []
    for _ in range(ROUNDS):
        drafts = draft(id_last, n_past)
        after_draft(n_past)
        batch = [id_last, *drafts]
        preds = decode_target(tgt_ctx, batch, n_past, n_vocab)
        process(batch, n_past)
        n_acc = 0
        while n_acc < len(drafts) and drafts[n_acc] == preds[n_acc]:
            n_acc += 1
        accept(n_acc)
        drafted += len(drafts)
        accepted += n_acc
        first_ok += int(bool(drafts) and drafts[0] == preds[0])
        out += [*drafts[:n_acc], preds[n_acc]]
        n_past += n_acc + 1
        id_last = preds[n_acc]
        seq_rm(tgt_ctx, n_past)
        rollback(n_past)
    return {"drafted": drafted, "accepted": accepted, "first_ok": first_ok, "tokens": out}


def greedy(model_path: Path, n: int) -> list[int]:
    """The target's plain greedy continuation of PROMPT (n tokens)."""
    model = load(model_path)
    ctx = context(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    preds = decode_target(ctx, list(PROMPT), 0, n_vocab)
    out = [preds[-1]]
    while len(out) < n:
        out.append(decode_target(ctx, [out[-1]], len(PROMPT) + len(out) - 1, n_vocab)[0])
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return out


# ---------------------------------------------------------------- scenarios (in a subprocess)


def scenario_gemma4_assistant(d: Path) -> dict[str, Any]:
    """Gemma 4 assistant: an MTP context on the assistant with ctx_other = the target context
    (it attends over the target's KV cache and writes none), fed (token, target h) rows; every
    draft step stays at position n_past, pairing the drafted token with the assistant's own
    h_nextn. Rollback is the target's seq_rm only."""
    tgt, dft = load(d / "gemma4.gguf"), load(d / "gemma4-assistant.gguf")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(tgt))
    n_embd = llama_cpp.llama_model_n_embd_out(dft)
    assert n_embd == llama_cpp.llama_model_n_embd(tgt)
    from llama_cpp import llama_cpp_ext as ext

    tgt_ctx = context(tgt)
    ext.llama_set_embeddings_nextn(tgt_ctx, True, False)  # every row's h, unmasked
    dft_ctx = context(dft, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP, other=tgt_ctx)
    ext.llama_set_embeddings_nextn(dft_ctx, True, True)
    assert ext.llama_get_ctx_other(dft_ctx) == ctypes.cast(tgt_ctx, ctypes.c_void_p).value
    state: dict[str, Any] = {}

    def process(tokens: list[int], start: int) -> None:
        # shared KV: no catch-up decode, only the target's h rows are kept
        state["verify_h"] = rows(ext.llama_get_embeddings_nextn(tgt_ctx), len(tokens), n_embd)
        state["h"] = state["verify_h"][-1]

    def accept(n_acc: int) -> None:
        state["h"] = state["verify_h"][min(n_acc, len(state["verify_h"]) - 1)]

    def draft(id_last: int, pos0: int) -> list[int]:
        token, h, out = id_last, state["h"], []
        for _ in range(3):
            batch = Batch(dft_ctx)
            batch.add(token, pos0, True, embd=h)  # same position for every step
            batch.run()
            token = argmax_ith(dft_ctx, 0, n_vocab)
            h = rows(ext.llama_get_embeddings_nextn_ith(dft_ctx, 0), 1, n_embd)[0]
            out.append(token)
        return out

    result = speculate(tgt_ctx, n_vocab, draft, process, accept)
    return {**result, "arch": meta(dft, "general.architecture"), "n_layer_nextn": 2}


def scenario_eagle3(d: Path) -> dict[str, Any]:
    """EAGLE-3: the target context extracts its layer inputs (llama_set_embeddings_layer_inp);
    per verified batch the draft context encodes the concatenated features (llama_process
    ENCODE, g rows from llama_get_embeddings_nextn) and decodes (token[k+1], g[k]) at pos[k],
    deferring the last position; drafting re-decodes that boundary with id_last and chains
    the pre-norm state (llama_get_embeddings_nextn_ith) at consecutive positions."""
    tgt, dft = load(d / "llama.gguf"), load(d / "eagle3.gguf")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(tgt))
    n_embd = llama_cpp.llama_model_n_embd(dft)
    n_tgt = llama_cpp.llama_model_n_embd(tgt)
    ids = target_layer_ids(dft)
    assert llama_cpp.llama_model_has_encoder(dft)
    from llama_cpp import llama_cpp_ext as ext

    tgt_ctx = context(tgt)
    for lid in sorted(set(ids)):
        set_embeddings_layer_inp(tgt_ctx, lid, True)
    dft_ctx = context(dft, other=tgt_ctx)  # borrows the target's lm_head
    ext.llama_set_embeddings_nextn(dft_ctx, True, True)
    state: dict[str, Any] = {"pos": -1}

    def process(tokens: list[int], start: int) -> None:
        n = len(tokens)
        feats = np.concatenate(
            [rows(get_embeddings_layer_inp(tgt_ctx, lid), n, n_tgt) for lid in ids], axis=1
        )
        enc = Batch(dft_ctx)
        base = llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(dft_ctx), 0) + 1
        for i in range(n):
            enc.add_embd(feats[i], base + i, True)  # positions unused by the encoder
        enc.run(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE)
        g = rows(ext.llama_get_embeddings_nextn(dft_ctx), n, n_embd)
        dec = Batch(dft_ctx)
        dft_max = llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(dft_ctx), 0)
        if state["pos"] >= 0 and state["pos"] + 1 == start and state["pos"] > dft_max:
            dec.add(tokens[0], state["pos"], False, embd=state["g"])  # the deferred boundary
        for k in range(n - 1):
            dec.add(tokens[k + 1], start + k, False, embd=g[k])
        if dec.n:
            dec.run()
        state.update(verify=g, first=start, pos=start + n - 1, g=g[-1])

    def accept(n_acc: int) -> None:
        i = min(n_acc, len(state["verify"]) - 1)
        state.update(pos=state["first"] + i, g=state["verify"][i])

    def draft(id_last: int, pos0: int) -> list[int]:
        seq_rm(dft_ctx, state["pos"])
        token, g, out = id_last, state["g"], []
        for i in range(3):
            batch = Batch(dft_ctx)
            batch.add(token, state["pos"] + i, True, embd=g)
            batch.run()
            token = argmax_ith(dft_ctx, 0, n_vocab)
            g = rows(ext.llama_get_embeddings_nextn_ith(dft_ctx, 0), 1, n_embd)[0]
            out.append(token)
        return out

    result = speculate(
        tgt_ctx,
        n_vocab,
        draft,
        process,
        accept,
        after_draft=lambda n_past: seq_rm(dft_ctx, n_past),
        rollback=lambda n_past: seq_rm(dft_ctx, n_past),
    )
    return {**result, "arch": meta(dft, "general.architecture"), "target_layers": ids}


def scenario_dflash(d: Path) -> dict[str, Any]:
    """DFlash: the target context extracts its layer inputs; per verified batch the draft
    context decodes embedding-only rows (the concatenated features) at the target positions,
    which fuses them and writes the draft KV cache; drafting decodes [id_last, mask * (B-1)]
    at n_past.. non-causally in one call and reads every mask row's logits; the block's KV
    rows are removed before verification, rejected positions after it."""
    tgt, dft = load(d / "llama.gguf"), load(d / "dflash.gguf")
    vocab = llama_cpp.llama_model_get_vocab(dft)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(tgt))
    n_tgt = llama_cpp.llama_model_n_embd(tgt)
    ids = target_layer_ids(dft)
    block = int(meta(dft, "dflash.block_size") or 16)
    mask = llama_cpp.llama_vocab_mask(vocab)
    from llama_cpp import llama_cpp_ext as ext

    tgt_ctx = context(tgt)
    for lid in ids:
        set_embeddings_layer_inp(tgt_ctx, lid, True)
    dft_ctx = context(dft, other=tgt_ctx)
    ext.llama_set_embeddings_nextn(dft_ctx, True, True)
    llama_cpp.llama_set_causal_attn(dft_ctx, False)

    def process(tokens: list[int], start: int) -> None:
        n = len(tokens)
        feats = np.concatenate(
            [rows(get_embeddings_layer_inp(tgt_ctx, lid), n, n_tgt) for lid in ids], axis=1
        )
        inject = Batch(dft_ctx)
        for i in range(n):
            inject.add_embd(feats[i], start + i, False)
        inject.run()

    def draft(id_last: int, pos0: int) -> list[int]:
        batch = Batch(dft_ctx)
        for i in range(block):
            batch.add(id_last if i == 0 else mask, pos0 + i, True)
        batch.run()
        return [argmax_ith(dft_ctx, i, n_vocab) for i in range(1, block)]

    result = speculate(
        tgt_ctx,
        n_vocab,
        draft,
        process,
        accept=lambda n_acc: None,
        after_draft=lambda n_past: seq_rm(dft_ctx, n_past),
        rollback=lambda n_past: seq_rm(dft_ctx, n_past),
    )
    return {
        **result,
        "arch": meta(dft, "general.architecture"),
        "target_layers": ids,
        "block_size": block,
        "mask": mask,
    }


SCENARIOS = {
    "gemma4-assistant": (scenario_gemma4_assistant, "gemma4.gguf"),
    "eagle3": (scenario_eagle3, "llama.gguf"),
    "dflash": (scenario_dflash, "llama.gguf"),
}


# ---------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("drafters")
    gemma4 = synthetic_drafters.write_tiny_gemma4(d / "gemma4.gguf")
    synthetic_drafters.write_tiny_gemma4_assistant(d / "gemma4-assistant.gguf", gemma4)
    llama = synthetic.write_tiny_llama(d / "llama.gguf")
    synthetic_drafters.write_tiny_eagle3(d / "eagle3.gguf", llama)
    synthetic_drafters.write_tiny_dflash(d / "dflash.gguf", llama)
    return d


@pytest.mark.parametrize(
    ("name", "arch"),
    [
        ("gemma4", "gemma4"),
        ("gemma4-assistant", "gemma4-assistant"),
        ("eagle3", "eagle3"),
        ("dflash", "dflash"),
    ],
)
def test_fixture_loads(drafter_dir: Path, name: str, arch: str) -> None:
    path = drafter_dir / f"{name}.gguf"
    assert path.stat().st_size < 400_000
    model = load(path)
    try:
        assert meta(model, "general.architecture") == arch
    finally:
        llama_cpp.llama_model_free(model)


def test_drafter_metadata(drafter_dir: Path) -> None:
    """What a create-time pairing check reads from each drafter."""
    models = {n: load(drafter_dir / f"{n}.gguf") for n in ("gemma4-assistant", "eagle3", "dflash")}
    try:
        asst = models["gemma4-assistant"]
        assert llama_cpp.llama_model_n_layer_nextn(asst) == 2
        assert llama_cpp.llama_model_n_embd_out(asst) == synthetic.N_EMBD  # the target's width
        assert target_layer_ids(models["eagle3"]) == list(synthetic_drafters.EAGLE3_TARGET_LAYERS)
        assert meta(models["eagle3"], "eagle3.target_hidden_size") == str(synthetic.N_EMBD)
        assert target_layer_ids(models["dflash"]) == list(synthetic_drafters.DFLASH_TARGET_LAYERS)
        assert meta(models["dflash"], "dflash.block_size") == "4"
        vocab = llama_cpp.llama_model_get_vocab(models["dflash"])
        assert llama_cpp.llama_vocab_mask(vocab) == synthetic_drafters.DFLASH_MASK_ID
    finally:
        for m in models.values():
            llama_cpp.llama_model_free(m)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_drafter_pairs_with_target(drafter_dir: Path, scenario: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_fixtures_drafters", scenario, str(drafter_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["arch"] == scenario
    assert result["drafted"] > 0
    # structured weights: the first draft of a round usually matches the target
    assert result["first_ok"] >= ROUNDS // 2, result
    # verification keeps the output lossless: the target's own greedy continuation
    target = drafter_dir / SCENARIOS[scenario][1]
    assert result["tokens"] == greedy(target, len(result["tokens"]))


def main(argv: Sequence[str]) -> None:
    llama_cpp.llama_backend_init()
    fn, _ = SCENARIOS[argv[0]]
    print(json.dumps(fn(Path(argv[1]))))


if __name__ == "__main__":
    main(sys.argv[1:])
