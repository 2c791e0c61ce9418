"""Unit tests of `run`, the chat REPL, `ps`/`stop`, `bench`, `pull`/`prune` (CLI side).

Pure parts: the --verbose statistics, word wrapping while streaming, draft colouring, REPL
input assembly and commands, `/set parameter` typing, the ps and bench tables, the pull
display. Wire parts use a small real loopback HTTP server (no daemon): a stream closed by
Ctrl-C must close the connection, since that is what makes the daemon stop generating.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console

from devtools.pullservers import serve_handler
from modelhub.cli import answer, bench, pull, repl, run, runtime
from modelhub.client import Client
from modelhub.errors import InputError, ModelhubError

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 1, 10, 12, 0, 0, tzinfo=UTC)


# -- --verbose statistics ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (850, "850ns"),
        (1_500, "1.5µs"),
        (130_079_000, "130.079ms"),
        (1_000_000, "1ms"),
        (1_234_567_891, "1.234567891s"),
        (1_000_000_000, "1s"),
        (60_000_000_000, "1m0s"),
        (123_500_000_000, "2m3.5s"),
        (3_600_000_000_000, "1h0m0s"),
        (3_723_000_000_000, "1h2m3s"),
        (-1_500_000_000, "-1.5s"),
    ],
)
def test_go_duration(ns: int, text: str) -> None:
    assert run.format_go_duration(ns) == text


FINAL = {
    "done": True,
    "total_duration": 2_500_000_000,
    "load_duration": 12_000_000,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 50_000_000,
    "eval_count": 100,
    "eval_duration": 2_000_000_000,
    "draft_count": 120,
    "draft_accepted_count": 90,
}


def test_stats_lines_follow_ollama_and_add_the_acceptance_rate() -> None:
    assert run.stats_lines(FINAL) == [
        "total duration:       2.5s",
        "load duration:        12ms",
        "prompt eval count:    26 token(s)",
        "prompt eval duration: 50ms",
        "prompt eval rate:     520.00 tokens/s",
        "eval count:           100 token(s)",
        "eval duration:        2s",
        "eval rate:            50.00 tokens/s",
        "draft tokens:         120 token(s)",
        "draft accepted:       90 token(s) (75.0% acceptance)",
    ]


def test_stats_lines_leave_out_zero_values_and_draft_lines_without_drafts() -> None:
    final = {**FINAL, "load_duration": 0, "draft_count": 0, "draft_accepted_count": 0}
    lines = run.stats_lines(final)
    assert not any(line.startswith(("load duration", "draft")) for line in lines)
    assert len(lines) == 7
    assert run.stats_lines({"done": True}) == []


def test_acceptance_rate() -> None:
    assert run.acceptance_rate(FINAL) == 0.75
    assert run.acceptance_rate({"draft_count": 0, "draft_accepted_count": 0}) is None
    assert run.acceptance_rate({}) is None


def test_print_stats_off_a_terminal_is_plain() -> None:
    err = io.StringIO()
    run.print_stats(FINAL, err)
    assert "\x1b" not in err.getvalue()
    assert err.getvalue().splitlines()[-1].endswith("(75.0% acceptance)")


# -- word wrapping and colouring ---------------------------------------------------------------


def _wrap(text: str, width: int, pieces: int = 1) -> str:
    wrapper = run.WordWrapper(width)
    step = max(1, len(text) // pieces)
    out = []
    for start in range(0, len(text), step):
        out += wrapper.feed(text[start : start + step])
    out += wrapper.flush()
    return "".join(t for t, _ in out)


def test_wrap_breaks_at_spaces() -> None:
    assert _wrap("the quick brown fox jumps", 10) == "the quick\nbrown fox\njumps"
    assert _wrap("a b c", 80) == "a b c"
    assert _wrap("line one\nline two", 9) == "line one\nline two"


def test_wrap_cuts_a_word_longer_than_the_line() -> None:
    assert _wrap("abcdefghijkl xy", 5) == "abcde\nfghij\nkl xy"


def test_wrap_counts_wide_characters_as_two_cells() -> None:
    text = _wrap("天气很好今天", 6)
    assert [cell_len(line) for line in text.split("\n")] == [6, 6]


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.text(alphabet="abcdéü世", min_size=1, max_size=8), max_size=40),
    seps=st.lists(st.sampled_from([" ", "\n", "  "]), max_size=40),
    width=st.integers(min_value=10, max_value=40),
    pieces=st.integers(min_value=1, max_value=7),
)
def test_wrap_keeps_words_and_respects_the_width(
    words: list[str], seps: list[str], width: int, pieces: int
) -> None:
    text = "".join(w + (seps[i] if i < len(seps) else " ") for i, w in enumerate(words))
    wrapped = _wrap(text, width, pieces)
    assert "".join(wrapped.split()) == "".join(text.split())  # nothing lost or reordered
    if "世" not in text:  # wide characters may break anywhere; other words stay whole
        assert wrapped.split() == text.split()
    for line in wrapped.split("\n"):
        assert cell_len(line.rstrip(" ")) <= width
    assert wrapped == _wrap(text, width, 1)  # how the stream is cut does not matter


def test_writer_colours_drafted_tokens_and_keeps_the_text() -> None:
    out = io.StringIO()
    writer = run.AnswerWriter(out, colour=True)
    writer.write("Hello", False)
    writer.write(" world", True)
    writer.finish()
    assert out.getvalue() == f"Hello{run.DRAFT_COLOUR} world{run.RESET}\n"
    assert writer.text == "Hello world"


def test_writer_without_colour_is_plain_and_ends_the_line_once() -> None:
    out = io.StringIO()
    writer = run.AnswerWriter(out, colour=False)
    writer.write("one\n", True)
    writer.finish()
    assert out.getvalue() == "one\n"


def test_colour_and_wrap_only_on_a_terminal() -> None:
    pipe = io.StringIO()
    assert run.wrap_width(pipe, True) is None
    assert run.use_colour(pipe, True) is False


def test_stream_answer_generate_and_chat() -> None:
    chunks = [
        {"response": "The ", "done": False},
        {"response": "sky", "done": False, "drafted": True},
        {"response": "", "done": True, "eval_count": 2},
    ]
    out = io.StringIO()
    final = run.stream_answer(iter(chunks), run.AnswerWriter(out, colour=True), chat=False)
    assert final is not None and final["eval_count"] == 2
    assert out.getvalue() == f"The {run.DRAFT_COLOUR}sky{run.RESET}\n"
    messages = [
        {"message": {"role": "assistant", "content": "Hi"}, "done": False},
        {"message": {"role": "assistant", "content": "!"}, "done": True},
    ]
    writer = run.AnswerWriter(io.StringIO())
    assert run.stream_answer(iter(messages), writer, chat=True) == messages[1]
    assert writer.text == "Hi!"


def test_reasoning_is_shown_apart_from_the_answer_or_hidden() -> None:
    chunks = [
        {"message": {"role": "assistant", "content": "", "thinking": "Three plus"}, "done": False},
        {"message": {"role": "assistant", "content": "", "thinking": " five."}, "done": False},
        {"message": {"role": "assistant", "content": "8"}, "done": False},
        {"message": {"role": "assistant", "content": ""}, "done": True},
    ]
    out = io.StringIO()
    writer = run.AnswerWriter(out)
    run.stream_answer(iter(chunks), writer, chat=True)
    assert out.getvalue() == "Thinking...\nThree plus five.\n...done thinking.\n\n8\n"
    assert (writer.text, writer.thinking) == ("8", "Three plus five.")
    hidden = io.StringIO()
    run.stream_answer(iter(chunks), run.AnswerWriter(hidden, show_thinking=False), chat=True)
    assert hidden.getvalue() == "8\n"
    grey = io.StringIO()
    run.stream_answer(iter(chunks[:2]), run.AnswerWriter(grey, grey=True), chat=True)
    assert grey.getvalue() == (
        f"Thinking...\n{answer.THINKING_COLOUR}Three plus{run.RESET}"
        f"{answer.THINKING_COLOUR} five.{run.RESET}\n...done thinking.\n\n"
    )


def test_think_flag_values() -> None:
    assert [run.think_value(v) for v in (None, "true", "false", "high")] == [
        None,
        True,
        False,
        "high",
    ]
    assert run.generate_body("m", "p", fmt=None, keep_alive=None, think="low")["think"] == "low"


@pytest.mark.parametrize(
    ("text", "value"),
    [("5m", "5m"), ("1h30m", "1h30m"), ("-1m", "-1m"), ("0", 0.0), ("300", 300.0), ("-1", -1.0)],
)
def test_keep_alive_value(text: str, value: str | float) -> None:
    assert run.keep_alive_value(text) == value


@pytest.mark.parametrize("text", ["5 minutes", "m5", "", "1x"])
def test_keep_alive_value_refuses_garbage(text: str) -> None:
    with pytest.raises(InputError, match="invalid --keepalive"):
        run.keep_alive_value(text)


def test_generate_body() -> None:
    body = run.generate_body("smol", "hi", fmt="json", keep_alive="5m")
    assert body == {
        "model": "smol",
        "prompt": "hi",
        "stream": True,
        "format": "json",
        "keep_alive": "5m",
    }
    assert run.generate_body("smol", "", fmt=None, keep_alive=None) == {
        "model": "smol",
        "prompt": "",
        "stream": True,
    }


# -- REPL input ----------------------------------------------------------------------------------


def _feed(lines: list[str]) -> list[repl.Submission | None]:
    assembler = repl.MultilineAssembler()
    return [assembler.feed(line) for line in lines]


def test_plain_lines_are_submitted_as_typed() -> None:
    assert _feed(["  hello there "]) == [repl.Submission("line", "hello there")]
    assert _feed(["/set verbose"]) == [repl.Submission("line", "/set verbose")]


def test_triple_quotes_collect_lines_until_the_closing_quotes() -> None:
    assembler = repl.MultilineAssembler()
    assert assembler.prompt == repl.PROMPT
    assert assembler.feed('"""first line') is None
    assert assembler.collecting and assembler.prompt == repl.CONTINUATION
    assert assembler.feed("  indented second") is None
    assert assembler.feed('third"""') == repl.Submission(
        "message", "first line\n  indented second\nthird"
    )
    assert not assembler.collecting and assembler.prompt == repl.PROMPT


def test_bare_triple_quotes_open_and_close() -> None:
    assert _feed(['"""', "a", "", "b", '"""']) == [
        None,
        None,
        None,
        None,
        repl.Submission("message", "a\n\nb"),
    ]


def test_triple_quotes_on_one_line_are_one_message() -> None:
    assert _feed(['"""just this"""']) == [repl.Submission("message", "just this")]


def test_multiline_system_message() -> None:
    assert _feed(['/set system """You are', 'terse."""']) == [
        None,
        repl.Submission("system", "You are\nterse."),
    ]
    assert _feed(['/set system """one line"""']) == [repl.Submission("system", "one line")]


def test_reset_forgets_a_multiline_message() -> None:
    assembler = repl.MultilineAssembler()
    assembler.feed('"""draft')
    assembler.reset()
    assert assembler.feed("fresh") == repl.Submission("line", "fresh")


# -- REPL commands -------------------------------------------------------------------------------


def test_split_command() -> None:
    assert repl.split_command("/SET parameter top_k  5") == ("/set", ["parameter", "top_k", "5"])
    assert repl.split_command("   ") == ("", [])


def test_set_parameter_types_values_like_a_modelfile() -> None:
    options: dict[str, Any] = {}
    assert repl.set_parameter(options, ["top_k", "5"]) == "Set parameter 'top_k' to '5'"
    assert repl.set_parameter(options, ["temperature", "0.25"])
    assert repl.set_parameter(options, ["use_mmap", "false"])
    assert repl.set_parameter(options, ["draft_num_predict", "0"])
    message = repl.set_parameter(options, ["stop", "<|end|>", "User:"])
    assert message == "Set parameter 'stop' to '<|end|>, User:'"
    assert options == {
        "top_k": 5,
        "temperature": 0.25,
        "use_mmap": False,
        "draft_num_predict": 0,
        "stop": ["<|end|>", "User:"],
    }
    assert isinstance(options["top_k"], int) and isinstance(options["temperature"], float)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["top_k", "five"], "invalid int value [five]"),
        (["temperature", "hot"], "invalid float value [hot]"),
        (["nonsense", "1"], "unknown parameter 'nonsense'"),
        (["mirostat", "1"], "deprecated"),
        (["top_p", "1.5"], "top_p must be"),
        (["draft_num_predict", "1000"], "draft_num_predict must be"),
        (["top_k"], "missing value"),
        (["top_k", "1", "2"], "takes one value"),
    ],
)
def test_set_parameter_errors(args: list[str], error: str) -> None:
    options: dict[str, Any] = {}
    with pytest.raises(repl.ReplError, match="Couldn't set parameter") as caught:
        repl.set_parameter(options, args)
    assert error in str(caught.value)
    assert options == {}


def test_set_parameter_without_arguments_lists_parameters() -> None:
    assert "draft_num_predict" in repl.set_parameter({}, [])


def test_apply_set_think_and_nothink() -> None:
    state = repl.ReplState(model="m")
    assert "think" not in state.chat_body()
    assert repl.apply_set(state, ["think"]) == "Set 'think' mode." and state.chat_body()["think"]
    assert repl.apply_set(state, ["think", "high"]) == "Set 'think' mode to high."
    assert state.chat_body()["think"] == "high"
    assert repl.apply_set(state, ["nothink"]) == "Set 'nothink' mode."
    assert state.chat_body()["think"] is False
    assert repl.apply_set(state, ["think", "max"]) == "Set 'think' mode to max."
    with pytest.raises(repl.ReplError, match="Invalid think level"):
        repl.apply_set(state, ["think", "ultra"])


def test_apply_set_modes_and_format() -> None:
    state = repl.ReplState(model="smol")
    assert repl.apply_set(state, ["verbose"]) == "Set 'verbose' mode." and state.verbose
    assert repl.apply_set(state, ["quiet"]) == "Set 'quiet' mode." and not state.verbose
    assert repl.apply_set(state, ["nowordwrap"]) == "Set 'nowordwrap' mode."
    assert not state.wordwrap
    assert repl.apply_set(state, ["nohistory"]) == "Set 'nohistory' mode." and not state.history
    assert repl.apply_set(state, ["format", "json"]) == "Set format to 'json' mode."
    assert state.format == "json"
    assert repl.apply_set(state, ["noformat"]) == "Disabled format." and state.format is None
    with pytest.raises(repl.ReplError, match="only 'json'"):
        repl.apply_set(state, ["format", "yaml"])
    with pytest.raises(repl.ReplError, match="Unknown command '/set bogus'"):
        repl.apply_set(state, ["bogus"])
    assert repl.apply_set(state, []) == repl.HELP_SET


def test_set_system_keeps_the_typed_spacing_and_replaces_a_trailing_system() -> None:
    state = repl.ReplState(model="smol")
    line = "/set system Be  brief."
    assert repl.apply_set(state, line.split()[1:], line) == "Set system message."
    assert state.messages == [{"role": "system", "content": "Be  brief."}]
    repl.apply_set(state, ["system", "Be", "kind."], "/set system Be kind.")
    assert state.messages == [{"role": "system", "content": "Be kind."}]
    state.messages.append({"role": "user", "content": "hi"})
    state.set_system("New.")
    assert [m["role"] for m in state.messages] == ["system", "user", "system"]
    with pytest.raises(repl.ReplError, match="Usage"):
        repl.apply_set(state, ["system"], "/set system")


def test_clear_keeps_the_system_message_and_chat_body() -> None:
    state = repl.ReplState(model="smol", keep_alive="10m", format="json")
    state.set_system("Be brief.")
    state.messages += [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    state.options["top_k"] = 3
    state.clear()
    assert state.messages == [{"role": "system", "content": "Be brief."}]
    assert state.chat_body() == {
        "model": "smol",
        "messages": [{"role": "system", "content": "Be brief."}],
        "stream": True,
        "options": {"top_k": 3},
        "format": "json",
        "keep_alive": "10m",
    }
    state.switch_model("other")
    assert state.model == "other" and state.messages == [] and state.system is None


def test_help_topics() -> None:
    assert repl.help_text([]) == repl.HELP
    assert repl.help_text(["set"]) == repl.HELP_SET
    assert repl.help_text(["/show"]) == repl.HELP_SHOW
    assert repl.help_text(["shortcuts"]) == repl.HELP_SHORTCUTS
    assert "Unknown help topic" in repl.help_text(["nope"])


def test_session_parameters() -> None:
    text = repl.session_parameters('stop "<|end|>"\ntop_k 40\n', {"stop": ["a", "b"], "seed": 1})
    assert text.startswith("Model defined parameters:\nstop")
    assert "User defined parameters:" in text
    assert text.splitlines()[-3:] == [
        "seed                           1",
        'stop                           "a"',
        'stop                           "b"',
    ]
    assert repl.session_parameters("", {}) == "No parameters were specified for this model."


def test_save_request_carries_the_session() -> None:
    state = repl.ReplState(model="smol")
    state.set_system("Be brief.")
    state.options["temperature"] = 0.0
    state.messages += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    info = {"details": {"parent_model": ""}, "messages": [{"role": "user", "content": "old"}]}
    assert repl.save_request("mine", state, info) == {
        "model": "mine",
        "from": "smol",
        "system": "Be brief.",
        "parameters": {"temperature": 0.0},
        "messages": [
            {"role": "user", "content": "old"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
        ],
    }
    plain = repl.save_request("x", repl.ReplState("smol"), {"details": {"parent_model": "p"}})
    assert plain == {"model": "x", "from": "smol"}


@pytest.mark.parametrize(
    ("value", "disabled"),
    [("", False), ("0", False), ("false", False), ("1", True), ("yes", True)],
)
def test_nohistory_variable(monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool) -> None:
    monkeypatch.setenv("MODELHUB_NOHISTORY", value)
    assert repl.history_disabled() is disabled


def test_local_commands_need_no_daemon() -> None:
    out, err = io.StringIO(), io.StringIO()
    # No daemon listens here; the commands below must not touch it.
    with Client("127.0.0.1:9") as client:
        session = repl.Repl(client, repl.ReplState("smol"), {}, out=out, err=err)
        assert session.submit(repl.Submission("line", "/set parameter num_ctx 4096"))
        assert session.submit(repl.Submission("line", "/set parameter num_ctx x"))
        assert session.submit(repl.Submission("system", "Line one\nline two"))
        assert session.submit(repl.Submission("line", "/clear"))
        assert session.submit(repl.Submission("line", "/frobnicate"))
        assert session.submit(repl.Submission("line", "/?"))
        assert not session.submit(repl.Submission("line", "/bye"))
        assert not session.submit(repl.Submission("line", "/exit"))
    said = out.getvalue()
    assert "Set parameter 'num_ctx' to '4096'" in said
    assert 'Couldn\'t set parameter: "invalid int value [x]"' in said
    assert "Set system message." in said and "Cleared session context" in said
    assert "Unknown command '/frobnicate'. Type /? for help" in said
    assert "Available commands:" in said
    assert session.state.messages == [{"role": "system", "content": "Line one\nline two"}]
    assert err.getvalue() == ""


# -- ps ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "vram", "text"),
    [
        (1000, 0, "100% CPU"),
        (1000, 1000, "100% GPU"),
        (1000, 520, "48%/52% CPU/GPU"),
        (0, 10, "Unknown"),
        (100, 200, "Unknown"),
        (None, None, "100% CPU"),
    ],
)
def test_processor_text(size: Any, vram: Any, text: str) -> None:
    assert runtime.processor_text(size, vram) == text


def test_until_text() -> None:
    assert runtime.until_text((NOW + timedelta(minutes=4, seconds=30)).isoformat(), NOW) == (
        "4 minutes from now"
    )
    assert runtime.until_text((NOW + timedelta(days=365 * 292)).isoformat(), NOW) == "Forever"
    assert runtime.until_text((NOW - timedelta(seconds=1)).isoformat(), NOW) == "Stopping..."
    assert runtime.until_text("", NOW) == "-"


def test_draft_text() -> None:
    assert runtime.draft_text({"kind": "draft_model", "draft_num_predict": 4}) == "draft_model ≤4"
    assert runtime.draft_text({"kind": "ngram", "draft_num_predict": 8}) == "ngram ≤8"
    fixed = {"kind": "ngram", "draft_num_predict": 8, "adaptive": False}
    assert runtime.draft_text(fixed) == "ngram =8"
    assert runtime.draft_text({"kind": "mtp", "draft_num_predict": None}) == "mtp"
    assert runtime.draft_text(None) == "-"
    assert runtime.draft_text({}) == "-"


def test_ps_table() -> None:
    models = [
        {
            "name": "smol-spec:latest",
            "digest": "sha256:" + "ab12" * 16,
            "size": 394_000_000,
            "size_vram": 0,
            "context_length": 4096,
            "expires_at": (NOW + timedelta(minutes=5)).isoformat(),
            "draft": {"kind": "draft_model", "draft_num_predict": 4},
        },
        {
            "name": "smol:latest",
            "digest": "cd34" * 16,
            "size": 0,
            "context_length": 2048,
            "expires_at": (NOW + timedelta(days=365 * 292)).isoformat(),
        },
    ]
    assert runtime.ps_table(models, NOW).splitlines() == [
        "NAME                ID              SIZE      PROCESSOR    CONTEXT    UNTIL"
        "                 DRAFT",
        "smol-spec:latest    ab12ab12ab12    394 MB    100% CPU     4096       5 minutes from now"
        "    draft_model ≤4",
        "smol:latest         cd34cd34cd34    -         100% CPU     2048       Forever"
        "               -",
    ]
    assert runtime.ps_table([], NOW) == (
        "NAME    ID    SIZE    PROCESSOR    CONTEXT    UNTIL    DRAFT\n"
    )


# -- bench ---------------------------------------------------------------------------------------


def test_bench_configs() -> None:
    own = bench.configs_for({"kind": "draft_model", "draft_num_predict": 4}, [])
    assert own == [bench.Config("off", 0), bench.Config("≤4", None)]
    given_bounds = bench.configs_for({"kind": "ngram"}, [2, 8, 2])
    assert [c.label for c in given_bounds] == ["off", "≤2", "≤8"]
    assert [c.draft_num_predict for c in given_bounds] == [0, 2, 8]
    with pytest.raises(InputError, match="model 'smol' does not draft"):
        bench.configs_for(None, [], "model 'smol'")
    with pytest.raises(InputError, match="between 1 and 64"):
        bench.configs_for({"kind": "ngram"}, [0])
    with pytest.raises(InputError, match=r"exceeds the draft_num_predict of model 'm' \(4\)"):
        bench.configs_for({"kind": "mtp", "draft_num_predict": 4}, [2, 8], "model 'm'")


def test_bench_of_an_auto_model_runs_each_drafter_then_auto() -> None:
    drafting = {"mode": "auto", "drafters": [{"name": "mtp"}, {"name": "ngram"}]}
    configs = bench.configs_for(None, [], drafting=drafting)
    assert [(c.label, c.drafter) for c in configs] == [
        ("off", None),
        ("mtp", "mtp"),
        ("ngram", "ngram"),
        ("auto", "auto"),
    ]
    assert bench.generate_request("m", "p", configs[1], 8)["options"]["draft"] == "mtp"
    bounded = bench.configs_for(None, [4], drafting=drafting)  # a bound: auto at that bound
    assert [(c.label, c.draft_num_predict) for c in bounded] == [("off", 0), ("≤4", 4)]

    def run(config: str, drafter: str | None) -> bench.Run:
        return bench.Run(0, config, 8, 1, 4 if drafter else 0, 2 if drafter else 0, "x", drafter)

    runs = [run("auto", "mtp"), run("auto", "mtp"), run("auto", None), run("mtp", "mtp")]
    assert bench.auto_choice(runs) == "auto drafted with mtp in 2 of 3 run(s)"
    assert "plain decoding" in bench.auto_choice([run("auto", None)])


def test_bench_fixed_runs_each_length_adaptive_and_fixed() -> None:
    own = bench.configs_for({"kind": "ngram", "draft_num_predict": 16}, [], fixed=True)
    assert own == [
        bench.Config("off", 0),
        bench.Config("≤16", None, True),
        bench.Config("=16", None, False),
    ]
    given = bench.configs_for({"kind": "mtp"}, [2, 4], fixed=True)
    assert [(c.label, c.draft_num_predict, c.adaptive) for c in given] == [
        ("off", 0, None),
        ("≤2", 2, True),
        ("=2", 2, False),
        ("≤4", 4, True),
        ("=4", 4, False),
    ]
    fixed_model = {"kind": "ngram", "draft_num_predict": 8, "draft_adaptive": False}
    assert [c.label for c in bench.configs_for(fixed_model, [])] == ["off", "=8"]
    request = bench.generate_request("m", "p", given[2], 64)
    assert request["options"] == {
        "temperature": 0,
        "num_predict": 64,
        "draft_num_predict": 2,
        "draft_adaptive": False,
    }


def test_bench_requests_are_greedy() -> None:
    off = bench.generate_request("m", "p", bench.Config("off", 0), 64)
    assert off["options"] == {"temperature": 0, "num_predict": 64, "draft_num_predict": 0}
    assert off["stream"] is False
    own = bench.generate_request("m", "p", bench.Config("x", None), 64)
    assert "draft_num_predict" not in own["options"]


def _run(
    prompt: int, config: str, tokens: int, seconds: float, drafted: int, accepted: int, text: str
) -> bench.Run:
    return bench.Run(prompt, config, tokens, int(seconds * 1e9), drafted, accepted, text)


def test_bench_summary_speedup_acceptance_identity() -> None:
    configs = [bench.Config("off", 0), bench.Config("≤4", 4)]
    runs = [
        _run(0, "off", 100, 2.0, 0, 0, "A"),
        _run(1, "off", 100, 1.0, 0, 0, "B"),
        _run(0, "≤4", 100, 1.0, 80, 60, "A"),
        _run(1, "≤4", 100, 1.0, 40, 10, "B changed"),
    ]
    rows = bench.summarise(runs, ["p0", "p1"], configs)
    assert [(r.prompt, r.config) for r in rows] == [
        ("p0", "off"),
        ("p0", "≤4"),
        ("p1", "off"),
        ("p1", "≤4"),
        ("all", "off"),
        ("all", "≤4"),
    ]
    p0_off, p0_on, _, p1_on, all_off, all_on = rows
    assert p0_off.tokens_per_second == 50 and p0_off.identical is None
    assert p0_off.acceptance is None and p0_off.speedup == 1.0
    assert p0_on.speedup == 2.0 and p0_on.acceptance == 0.75 and p0_on.identical is True
    assert p1_on.speedup == 1.0 and p1_on.identical is False
    assert all_on.acceptance == 70 / 120 and all_on.identical is False
    assert all_on.speedup == pytest.approx((200 / 2) / (200 / 3))
    assert all_off.tokens == 200


def test_bench_baseline_that_disagrees_with_itself_is_flagged() -> None:
    configs = [bench.Config("off", 0), bench.Config("≤4", 4)]
    runs = [
        _run(0, "off", 10, 1.0, 0, 0, "A"),
        _run(0, "off", 10, 1.0, 0, 0, "A'"),
        _run(0, "≤4", 10, 1.0, 5, 5, "A"),
    ]
    rows = bench.summarise(runs, ["p0"], configs)
    assert len(rows) == 2  # one prompt: no "all" rows
    assert rows[0].identical is False


def test_bench_table_and_json() -> None:
    configs = [bench.Config("off", 0), bench.Config("≤4", None)]
    runs = [_run(0, "off", 10, 1.0, 0, 0, "x"), _run(0, "≤4", 10, 0.5, 8, 6, "x")]
    rows = bench.summarise(runs, [bench.DEFAULT_PROMPTS[0]], configs)
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(bench.bench_table(rows, "title"))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    for expected in ("tok/s", "accept", "speed-up", "identical", "75.0%", "2.00x", "yes", "20.00"):
        assert expected in text
    data = json.loads(
        json.dumps(bench.bench_json("m", ["p"], configs, rows, runs, num_predict=10, repeat=1))
    )
    assert data["rows"][1]["speedup"] == 2.0 and data["runs"][1]["draft_accepted_count"] == 6
    assert data["configs"] == [
        {"label": "off", "draft_num_predict": 0, "adaptive": None, "drafter": None},
        {"label": "≤4", "draft_num_predict": None, "adaptive": None, "drafter": None},
    ]


def test_prompt_label() -> None:
    assert bench.prompt_label("a\n  b") == "a b"
    assert len(bench.prompt_label("x" * 100)) == 24


def test_default_prompts_include_a_rewrite() -> None:
    assert len(bench.DEFAULT_PROMPTS) >= 3
    assert any("Rewrite" in p for p in bench.DEFAULT_PROMPTS)


# -- pull / prune --------------------------------------------------------------------------------


def test_pull_display_off_a_terminal_writes_final_lines() -> None:
    console = Console(file=io.StringIO(), force_terminal=False, width=100)
    digest = "sha256:" + "8eeb52dfb3bb" + "0" * 52
    stream = [
        {"status": "pulling manifest"},
        {"status": "using source ollama registry"},
        {"status": "pulling 8eeb52dfb3bb", "digest": digest, "total": 2000},
        {"status": "pulling 8eeb52dfb3bb", "digest": digest, "total": 2000, "completed": 1000},
        {"status": "pulling 8eeb52dfb3bb", "digest": digest, "total": 2000, "completed": 0},
        {"status": "pulling 8eeb52dfb3bb", "digest": digest, "total": 2000, "completed": 2000},
        {"status": "pulling 8eeb52dfb3bb", "digest": digest, "total": 2000, "completed": 2000},
        {"status": "verifying sha256 digest"},
        {"status": "verifying sha256 digest"},
        {"status": "writing manifest"},
        {"status": "success"},
    ]
    with pull.PullDisplay(console) as display:
        for item in stream:
            display.item(item)
    assert console.file.getvalue().splitlines() == [  # type: ignore[attr-defined]
        "pulling manifest",
        "using source ollama registry",
        "pulling 8eeb52dfb3bb: 100% 2 KB",
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]


def test_layer_label() -> None:
    digest = "sha256:" + "a" * 64
    assert pull.layer_label("pulling aaaaaaaaaaaa", digest) == "pulling aaaaaaaaaaaa"
    assert pull.layer_label("downloading", digest) == "pulling aaaaaaaaaaaa"


def test_prune_report() -> None:
    answer = {"removed": ["sha256-" + "a" * 64, {"path": "partial/x"}], "freed": 98_000_000}
    assert pull.prune_report(answer) == [
        "removed sha256-" + "a" * 64,
        "removed partial/x",
        "freed 98 MB",
    ]
    assert pull.prune_report({"removed": [], "freed": 0}) == ["nothing to prune"]


# -- the wire: a loopback server standing in for the daemon ---------------------------------------


class _Slow(BaseHTTPRequestHandler):
    """Streams NDJSON chunks every 50 ms until the client goes away; records the outcome."""

    hung_up = threading.Event()
    requests: list[dict[str, Any]] = []  # noqa: RUF012

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        type(self).requests.append(json.loads(self.rfile.read(length) or b"{}"))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        try:
            for _ in range(400):
                line = {"model": "m", "response": "tok ", "done": False}
                self.wfile.write(json.dumps(line).encode() + b"\n")
                self.wfile.flush()
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            type(self).hung_up.set()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    _Slow.hung_up.clear()
    _Slow.requests.clear()
    with serve_handler(_Slow) as address:
        yield address


def test_closing_a_stream_hangs_up_on_the_server(slow_server: str) -> None:
    with Client(slow_server) as client:
        events = client.stream("POST", "/api/generate", {"model": "m", "prompt": "p"})
        assert next(events)["response"] == "tok "
        run.close_stream(events)
        assert _Slow.hung_up.wait(5), "the server kept streaming to a closed stream"


class _Failing(BaseHTTPRequestHandler):
    """Two tokens, then an error line, as the daemon ends a stream that failed mid-way."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        for line in ({"response": "half", "done": False}, {"error": "runner crashed"}):
            self.wfile.write(json.dumps(line).encode() + b"\n")

    def log_message(self, *args: Any) -> None:
        pass


def test_one_shot_error_mid_stream_ends_the_line_then_raises() -> None:
    out, err = io.StringIO(), io.StringIO()
    with serve_handler(_Failing) as address, Client(address) as client:
        body = run.generate_body("m", "p", fmt=None, keep_alive=None)
        with pytest.raises(ModelhubError, match="runner crashed"):
            run.one_shot(
                client, body, verbose=True, wordwrap=False, show_draft=False, out=out, err=err
            )
    assert out.getvalue() == "half\n"
    assert err.getvalue() == ""


def test_one_shot_ctrl_c_exits_130_and_hangs_up(slow_server: str) -> None:
    """The real `modelhub run` in a subprocess, interrupted with SIGINT mid-answer."""
    env = {
        **os.environ,
        "MODELHUB_HOST": slow_server,
        "MODELHUB_NO_AUTOSTART": "1",
        "PYTHONPATH": str(ROOT),
    }
    code = (
        "import sys\n"
        "from modelhub.cli.run import one_shot\n"
        "from modelhub.client import Client\n"
        "one_shot(Client(), {'model': 'm', 'prompt': 'p', 'stream': True}, verbose=False,"
        " wordwrap=True, show_draft=False, out=sys.stdout, err=sys.stderr)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Ctrl-C as a terminal delivers it, even when the suite runs in the background (a
        # shell's ``&`` makes its children ignore SIGINT, and Python keeps that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    assert proc.stdout.read(4) == b"tok "  # the answer is streaming
    proc.send_signal(signal.SIGINT)
    assert proc.wait(10) == 130
    assert _Slow.hung_up.wait(5)
    assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()


def test_cli_rejects_a_bad_keepalive_without_a_traceback() -> None:
    env = {**os.environ, "MODELHUB_HOST": "127.0.0.1:9", "MODELHUB_NO_AUTOSTART": "1"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "modelhub", "run", "smol", "hi", "--keepalive", "5 minutes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("Error: invalid --keepalive '5 minutes'")


@pytest.mark.parametrize("args", [["ps"], ["stop", "smol"], ["pull", "smol"], ["prune"]])
def test_commands_without_a_daemon_say_so(args: list[str]) -> None:
    env = {**os.environ, "MODELHUB_HOST": "127.0.0.1:9", "MODELHUB_NO_AUTOSTART": "1"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "modelhub", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 69  # the daemon cannot be reached (docs/cli.md, "Errors")
    assert done.stderr.startswith("Error: could not connect to modelhub at http://127.0.0.1:9")
    assert "Traceback" not in done.stderr
