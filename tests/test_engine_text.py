"""Streaming text: UTF-8 split across tokens, stop strings across tokens and chunks."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from modelhub.engine.textstream import TextStream


def _feed(stream: TextStream, pieces: list[bytes]) -> list[str]:
    return [stream.push(p) for p in pieces]


def test_multibyte_character_split_over_tokens_is_held_back() -> None:
    s = TextStream()
    euro = "€".encode()  # 3 bytes
    out = _feed(s, [b"a", euro[:1], euro[1:2], euro[2:], b"b"])
    assert out == ["a", "", "", "€", "b"]
    assert s.finish() == ""
    assert s.text == "a€b"


def test_incomplete_sequence_at_the_end_becomes_a_replacement_character() -> None:
    s = TextStream()
    assert s.push("é".encode()[:1]) == ""
    assert s.finish() == "\ufffd"


def test_stop_string_spanning_tokens_is_never_emitted() -> None:
    s = TextStream(["###"])
    out = _feed(s, [b"Hello #", b"#", b"# more"])
    assert out == ["Hello ", "", ""]
    assert s.stopped and s.stop_hit == "###"
    assert s.text == "Hello "
    assert s.push(b"after") == "" and s.finish() == ""


def test_partial_stop_is_released_when_it_does_not_complete() -> None:
    s = TextStream(["</end>"])
    assert s.push(b"a </e") == "a "
    assert s.push(b"nding") == "</ending"
    assert s.push(b" </") == " "
    assert s.finish() == "</"
    assert not s.stopped
    assert s.text == "a </ending </"


def test_earliest_of_several_stops_wins() -> None:
    s = TextStream(["world", "lo w"])
    assert s.push(b"hello world") == "hel"
    assert s.stop_hit == "lo w"


def test_stop_inside_one_token() -> None:
    s = TextStream(["\n\n"])
    assert s.push(b"line\n\nnext") == "line"
    assert s.stopped


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab#€\n")), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
)
def test_any_split_gives_the_text_before_the_first_stop(text: str, cuts: list[int]) -> None:
    raw = text.encode()
    points = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    pieces = [raw[a:b] for a, b in itertools.pairwise(points)]
    stop = "#€"
    s = TextStream([stop])
    streamed = "".join(_feed(s, pieces)) + s.finish()
    expected = text.split(stop)[0]
    assert streamed == expected == s.text


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab#€\n")), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
    pushed=st.integers(min_value=0, max_value=12),
)
def test_stops_at_names_the_piece_that_would_complete_a_stop(
    text: str, cuts: list[int], pushed: int
) -> None:
    """``stops_at`` (how far guesses are worth checking) agrees with pushing the pieces one by
    one, and leaves the stream as it was."""
    raw = text.encode()
    points = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    pieces = [raw[a:b] for a, b in itertools.pairwise(points)]
    before, after = pieces[:pushed], pieces[pushed:]
    stops = ["#€", "\n\n"]
    asked, untouched, reference = TextStream(stops), TextStream(stops), TextStream(stops)
    for stream in (asked, untouched, reference):
        _feed(stream, before)
    predicted = asked.stops_at(after)
    completed = None
    for i, piece in enumerate(after):
        if reference.stopped:
            break
        reference.push(piece)
        if reference.stopped:
            completed = i
    assert predicted == completed
    assert [*_feed(asked, after), asked.finish()] == [*_feed(untouched, after), untouched.finish()]
