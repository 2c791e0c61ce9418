"""The runner protocol's typed messages (``engine.protocol``): what each side refuses, and an
error that keeps its class across the pipe. Pure: no runner, no llama.cpp."""

from __future__ import annotations

import io
import json
from dataclasses import fields

import pytest

from modelhub.engine import protocol as p
from modelhub.engine.options import GenerateOptions
from modelhub.engine.runner import Runner
from modelhub.errors import (
    DamagedModelError,
    DraftError,
    ErrorKind,
    InsufficientMemoryError,
    ModelfileError,
    ModelhubError,
    NotFoundError,
    RequestCancelledError,
    RunnerCrashedError,
    RunnerProtocolError,
    ServerBusyError,
    error_name,
    rebuilt_error,
)


def test_runner_options_are_the_engines_options() -> None:
    """Every option the pipe carries is a ``GenerateOptions`` field and every field but the
    test-only acceptance rule and the grammar (sent beside them) can be carried."""
    engine = {f.name for f in fields(GenerateOptions)} - {"acceptance_rule", "grammar"}
    assert set(p.RunnerOptions.model_fields) == engine


def test_an_unknown_option_or_field_is_refused_loudly() -> None:
    line = json.dumps({"op": "generate", "id": "r1", "options": {"temprature": 0.2}})
    with pytest.raises(RunnerProtocolError, match=r"generate\.options\.temprature: Extra"):
        p.decode_request(line)
    with pytest.raises(RunnerProtocolError, match=r"embed\.text: Extra"):
        p.decode_request({"op": "embed", "id": "r2", "texts": ["a"], "text": "a"})
    with pytest.raises(RunnerProtocolError, match="op"):
        p.decode_request({"op": "dance", "id": "r3"})
    with pytest.raises(RunnerProtocolError, match=r"generate\.options\.top_k"):
        p.decode_request({"op": "generate", "options": {"top_k": "many"}})
    with pytest.raises(RunnerProtocolError, match=r"token\.colour: Extra"):
        p.decode_event({"event": "token", "id": "r1", "text": "x", "colour": "red"})
    with pytest.raises(RunnerProtocolError, match="Invalid JSON"):
        p.decode_event("not json")
    assert p.request_id('{"op": "generate", "id": "r9", "junk": 1}') == "r9"
    assert RunnerProtocolError("x").kind is ErrorKind.INTERNAL  # a bug, not the user's request


def test_requests_and_events_round_trip_as_sent() -> None:
    generate = p.Generate(
        id="r1", prompt="hi", options=p.RunnerOptions(temperature=0, stop=["\n"], seed=3)
    )
    line = generate.encode()
    assert json.loads(line) == {
        "op": "generate",
        "id": "r1",
        "prompt": "hi",
        "options": {"temperature": 0.0, "stop": ["\n"], "seed": 3},
    }
    decoded = p.decode_request(line)
    assert decoded == generate
    assert isinstance(decoded, p.Generate)
    assert decoded.options.given() == {"temperature": 0.0, "stop": ["\n"], "seed": 3}
    assert p.Shutdown().encode() == '{"op":"shutdown"}'
    token = p.decode_event('{"event":"token","id":"r1","text":"a","drafted":true}')
    assert token.wire() == {"event": "token", "id": "r1", "text": "a", "drafted": True}
    assert isinstance(p.decode_event('{"event":"alive"}'), p.Alive)


@pytest.mark.parametrize(
    "error",
    [
        DraftError("pairing"),
        NotFoundError("gone"),
        RunnerCrashedError("died"),
        InsufficientMemoryError("big"),
        ServerBusyError("busy"),
        RequestCancelledError("request canceled"),
        ModelfileError("bad", line=3),
        DamagedModelError("damaged", ["a", "b"]),
        ModelhubError("odd", ErrorKind.NO_SPACE),
        RunnerProtocolError("runner protocol: x"),
    ],
)
def test_an_error_keeps_its_class_across_the_pipe(error: ModelhubError) -> None:
    line = p.ErrorEvent.of(error, id="r1").encode()
    event = p.decode_event(line)
    assert isinstance(event, p.ErrorEvent)
    back = event.exception()
    assert type(back) is type(error)
    assert (back.message, back.kind, back.status) == (error.message, error.kind, error.status)
    with pytest.raises(type(error)):
        p.raise_if_error(event)
    load = p.decode_event(p.LoadError.of(error).encode())
    assert isinstance(load, p.LoadError)
    assert type(load.exception("loading x failed: ")) is type(error)


def test_an_unknown_or_mismatched_class_falls_back_to_the_kind() -> None:
    assert type(rebuilt_error("NoSuchError", ErrorKind.NOT_FOUND, "m")) is NotFoundError
    assert type(rebuilt_error(None, ErrorKind.BUSY, "m")) is ServerBusyError
    assert type(rebuilt_error("NotFoundError", ErrorKind.INVALID, "m")).__name__ == "InputError"
    assert type(rebuilt_error("ValueError", ErrorKind.INTERNAL, "m")) is ModelhubError

    class Foreign(ModelhubError):
        pass

    assert error_name(Foreign("x")) == "ModelhubError"  # only the hierarchy's own classes


def test_the_runner_refuses_what_it_does_not_know() -> None:
    """engine.runner answers a request it cannot read whole with the protocol error, to the
    request's id (a load: a load_error), and serves on."""
    lines = [
        {"op": "load", "config": {"model_path": "m.gguf", "n_ctxx": 5}},
        {"op": "generate", "id": "r1", "prompt": "hi", "options": {"temprature": 0.2}},
        {"op": "tokenize", "id": "r2", "text": "hi", "special": True},
    ]
    out = io.StringIO()
    Runner(out).serve(io.StringIO("".join(json.dumps(m) + "\n" for m in lines)))
    events = [p.decode_event(line) for line in out.getvalue().splitlines()]
    load, generate, tokenize = events
    assert isinstance(load, p.LoadError) and "n_ctxx" in load.message
    assert isinstance(generate, p.ErrorEvent) and generate.id == "r1"
    assert "generate.options.temprature" in generate.message
    assert isinstance(tokenize, p.ErrorEvent) and tokenize.id == "r2"
    for event in events:
        assert isinstance(event, p.LoadError | p.ErrorEvent)
        assert type(event.exception()) is RunnerProtocolError


def test_the_daemon_refuses_to_build_what_the_runner_would_not_know() -> None:
    """A request is typed where the daemon makes it: an option the runner would not know
    (the one part built from a dict: a plan's options) fails there, naming it, before any
    runner is asked."""
    with pytest.raises(RunnerProtocolError, match=r"generate\.options\.temprature: Extra"):
        p.runner_options({"temperature": 0.5, "temprature": 1})
    with pytest.raises(RunnerProtocolError, match=r"generate\.options\.top_k"):
        p.runner_options({"top_k": "many"})
    assert p.runner_options({"top_k": 3}).given() == {"top_k": 3}


def test_the_load_plan_is_the_engine_config_field_for_field() -> None:
    """``LoadConfig`` (what the daemon plans and the runner receives) and ``EngineConfig``
    (what the engine takes) name the same settings, and every value crosses the pipe into the
    engine's types."""
    from pathlib import Path

    from modelhub.engine.load_config import DraftCandidate, LoadConfig
    from modelhub.engine.options import DraftSource, EngineConfig
    from modelhub.engine.runner import engine_config

    assert set(LoadConfig.model_fields) == {f.name for f in fields(EngineConfig)}
    plan = LoadConfig(
        model_path="/m.gguf",
        n_ctx=1024,
        draft_kind="auto",
        draft_candidates=(DraftCandidate(name="d", kind="draft_model", path="/d.gguf", max_k=3),),
        state_dir="/s",
        adapter_paths=("/a.gguf",),
        projector_path="/p.gguf",
        num_gpu=0,
        tensor_split=(0.5, 0.5),
        rpc_servers=("127.0.0.1:50052",),
    )
    line = p.Load(config=plan).encode()
    received = p.decode_request(line)
    assert isinstance(received, p.Load) and received.config == plan
    cfg = engine_config(received.config)
    assert cfg.model_path == Path("/m.gguf") and cfg.n_ctx == 1024
    assert cfg.draft_candidates == [DraftSource("d", "draft_model", Path("/d.gguf"), 3)]
    assert cfg.state_dir == Path("/s") and cfg.projector_path == Path("/p.gguf")
    assert cfg.adapter_paths == [Path("/a.gguf")] and cfg.tensor_split == [0.5, 0.5]
    assert cfg.rpc_servers == ["127.0.0.1:50052"] and cfg.num_gpu == 0
    # The daemon's defaults left unset in a plan are the engine's own.
    assert engine_config(LoadConfig(model_path="/m.gguf")).num_gpu == EngineConfig(Path()).num_gpu


def test_a_misspelt_load_setting_fails_where_the_plan_is_made() -> None:
    from pydantic import ValidationError

    from modelhub.runtime.loadspec import LoadSpec

    with pytest.raises(ValidationError, match="n_ctxx"):
        LoadSpec.make("m", "sha256:0", "sha256:1", {"model_path": "/m", "n_ctxx": 5}, {})


def test_the_done_result_is_the_generate_result_field_for_field() -> None:
    from modelhub.engine.options import GenerateResult

    engine = {f.name for f in fields(GenerateResult)} - {"tokens"}
    assert set(p.DoneResult.model_fields) == engine | {"context"}
    with pytest.raises(RunnerProtocolError, match="draft_acepted_count"):
        p.decode_event(
            '{"event": "done", "id": "r", "result": {"text": "", "done_reason": "stop", '
            '"prompt_eval_count": 1, "prompt_eval_duration_ns": 1, "eval_count": 0, '
            '"eval_duration_ns": 1, "draft_acepted_count": 3}}'
        )
