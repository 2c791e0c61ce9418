"""Tokenizing long prompts: the same tokens as llama.cpp's one call, in linear time, and
cancellable (llama.cpp alone is quadratic in the number of special tokens: a 100k-message chat
kept a runner busy for minutes)."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from devtools.realmodels import gemma3_270m, smollm2_q4_1
from modelhub.engine.llama import _PIECE_CHARS, LlamaModel
from modelhub.errors import RequestCancelledError

pytestmark = pytest.mark.slow

TURNS = {
    "smollm2": (
        "<|im_start|>user\n{i}: what goes in a fridge?<|im_end|>\n"
        "<|im_start|>assistant\n  Milk,\teggs and <|im_end|> butter.<|im_end|>\n"
    ),
    "gemma3": (
        "<start_of_turn>user\n{i}: what goes in a fridge?<end_of_turn>\n"
        "<start_of_turn>model\n  Milk,\teggs and<end_of_turn> butter.<end_of_turn>\n"
    ),
}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def vocab(request: pytest.FixtureRequest) -> tuple[str, LlamaModel]:
    path = smollm2_q4_1() if request.param == "smollm2" else gemma3_270m()
    model = LlamaModel(path, vocab_only=True)
    yield request.param, model
    model.close()


def chat(kind: str, turns: int) -> str:
    return "".join(TURNS[kind].format(i=i) for i in range(turns))


def test_pieces_give_exactly_llama_cpps_tokens(vocab: tuple[str, LlamaModel]) -> None:
    kind, model = vocab
    for text in (chat(kind, 600), " " + chat(kind, 397) + " tail", chat(kind, 264)[:-1]):
        assert len(model._pieces_at_specials(text)) > 1  # the chunked path is the one tested
        for add_special in (True, False):
            want = model._tokenize(text, add_special, True)
            assert model.tokenize(text, add_special=add_special) == want


def test_tokenizing_time_grows_linearly(vocab: tuple[str, LlamaModel]) -> None:
    kind, model = vocab
    model.tokenize(chat(kind, 10))  # the special-token table is built once, not timed
    small_text, large_text = chat(kind, 1000), chat(kind, 8000)

    # what makes it linear: llama.cpp only ever sees pieces of bounded size
    pieces = model._pieces_at_specials(large_text)
    longest_turn = len(TURNS[kind].format(i=8000))
    assert max(map(len, pieces)) <= _PIECE_CHARS + longest_turn
    assert "".join(pieces) == large_text

    def timed(text: str) -> float:
        gc.disable()  # a collection of the whole suite's objects is not the tokenizer's time
        started = time.thread_time()  # this thread's CPU time: a busy host does not inflate it
        try:
            model.tokenize(text)
            return time.thread_time() - started
        finally:
            gc.enable()

    # eight times the text: linear is ~8x; llama.cpp's own splitting took 21x (smollm2), 36x (gemma)
    rounds = [(timed(small_text), timed(large_text)) for _ in range(3)]
    small, large = min(r[0] for r in rounds), min(r[1] for r in rounds)
    assert large < 16 * small, f"{kind}: {small:.3f} s -> {large:.3f} s for eight times the text"


def test_tokenizing_stops_when_cancelled(vocab: tuple[str, LlamaModel]) -> None:
    kind, model = vocab
    text = chat(kind, 40000)
    cancel = threading.Event()
    threading.Timer(0.1, cancel.set).start()
    started = time.perf_counter()
    with pytest.raises(RequestCancelledError):
        model.tokenize(text, cancel=cancel)
    assert time.perf_counter() - started < 1.0
