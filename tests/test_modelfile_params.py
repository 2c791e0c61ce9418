"""PARAMETER typing (Modelfile text and API JSON), ranges and deprecation warnings."""

from __future__ import annotations

import math
from typing import Any

import pytest

from modelhub.errors import InputError, ModelfileError
from modelhub.modelfile import (
    DEPRECATED_PARAMETERS,
    PARAMETER_TYPES,
    check_parameter,
    coerce_option,
    parameters_from_commands,
    parse_modelfile,
    parse_parameter,
)


def params(source: str) -> tuple[dict[str, Any], list[str]]:
    return parameters_from_commands(parse_modelfile(source))


def test_parameter_types_cover_ollama_and_draft_knobs() -> None:
    ints = {
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "num_thread",
        "num_parallel",
        "draft_num_predict",
        "num_keep",
        "seed",
        "num_predict",
        "top_k",
        "repeat_last_n",
        "draft_min",
    }
    floats = {
        "temperature",
        "top_p",
        "min_p",
        "typical_p",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "draft_p_min",
    }
    expected: dict[str, type] = {name: int for name in ints} | {name: float for name in floats}
    expected |= {"use_mmap": bool, "draft_adaptive": bool, "stop": list, "rpc_servers": list}
    assert expected == PARAMETER_TYPES
    assert not DEPRECATED_PARAMETERS & PARAMETER_TYPES.keys()
    assert {"mirostat", "penalize_newline", "use_mlock"} <= DEPRECATED_PARAMETERS


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("num_ctx", "4096", 4096),
        ("seed", "-1", -1),
        ("seed", "+7", 7),
        ("seed", "9223372036854775807", 2**63 - 1),
        ("temperature", "1", 1.0),
        ("temperature", "0.5", 0.5),
        ("min_p", "1e-3", 0.001),
        ("top_p", ".25", 0.25),
        ("top_p", "0x1p-2", 0.25),
        ("use_mmap", "true", True),
        ("use_mmap", "T", True),
        ("use_mmap", "1", True),
        ("use_mmap", "FALSE", False),
        ("use_mmap", "f", False),
        ("stop", "<|im_end|>", "<|im_end|>"),
        ("draft_p_min", "0.75", 0.75),
        ("draft_adaptive", "false", False),
    ],
)
def test_parse_parameter_types(name: str, text: str, value: object) -> None:
    parsed = parse_parameter(name, text)
    assert parsed == value
    assert type(parsed) is type(value)


def test_parse_parameter_accepts_go_float_specials() -> None:
    assert math.isinf(parse_parameter("temperature", "inf"))  # type: ignore[arg-type]
    assert math.isnan(parse_parameter("temperature", "NaN"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("num_ctx", "1.0", "invalid int value [1.0]"),
        ("num_ctx", "1_000", "invalid int value [1_000]"),
        ("num_ctx", "4k", "invalid int value [4k]"),
        ("num_ctx", "", "invalid int value []"),
        ("seed", "9223372036854775808", "invalid int value [9223372036854775808]"),
        ("num_ctx", "٤", "invalid int value [٤]"),
        ("temperature", "warm", "invalid float value [warm]"),
        ("temperature", "1e39", "invalid float value [1e39]"),
        ("temperature", "1e999", "invalid float value [1e999]"),
        ("temperature", "1_0", "invalid float value [1_0]"),
        ("temperature", "0,5", "invalid float value [0,5]"),
        ("use_mmap", "yes", "invalid bool value [yes]"),
        ("use_mmap", "tRUE", "invalid bool value [tRUE]"),
        ("draft_adaptive", "off", "invalid bool value [off]"),
        ("Temperature", "0.1", "unknown parameter 'Temperature'"),
        ("numa", "true", "unknown parameter 'numa'"),
        ("", "temperature 0.5", "unknown parameter ''"),
        ("mirostat", "1", "parameter mirostat is deprecated and no longer has any effect"),
    ],
)
def test_parse_parameter_errors(name: str, text: str, message: str) -> None:
    with pytest.raises(ModelfileError) as caught:
        parse_parameter(name, text)
    assert caught.value.message == message
    assert caught.value.line is None


def test_parameters_accumulate_stop_and_keep_last_value() -> None:
    parameters, warnings = params(
        "FROM x\n"
        "PARAMETER stop <|im_end|>\n"
        'PARAMETER stop "User: "\n'
        "PARAMETER temperature 0.2\n"
        "PARAMETER temperature 0.9\n"
        "PARAMETER num_ctx 8192\n"
        "PARAMETER use_mmap false\n"
        "PARAMETER draft_num_predict 6\n"
        "PARAMETER draft_min 2\n"
        "PARAMETER draft_p_min 0.6\n"
        "PARAMETER draft_adaptive false\n"
        "SYSTEM not a parameter\n"
    )
    assert parameters == {
        "stop": ["<|im_end|>", "User: "],
        "temperature": 0.9,
        "num_ctx": 8192,
        "use_mmap": False,
        "draft_num_predict": 6,
        "draft_min": 2,
        "draft_p_min": 0.6,
        "draft_adaptive": False,
    }
    assert warnings == []


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("FROM x\nPARAMETER  temperature 0.5", "(line 2): unknown parameter ''"),  # §4.10 #4
        ("FROM x\nPARAMETER Temperature 0.1", "(line 2): unknown parameter 'Temperature'"),  # 7
        ("FROM x\nPARAMETER num_ctx 1.0", "(line 2): invalid int value [1.0]"),  # 9
        ("FROM x\n\nPARAMETER numa true", "(line 3): unknown parameter 'numa'"),  # 14
        ("FROM x\r\nPARAMETER use_mmap yes", "(line 3): invalid bool value [yes]"),
    ],
)
def test_parameters_errors_carry_the_line(source: str, message: str) -> None:
    with pytest.raises(ModelfileError) as caught:
        params(source)
    assert caught.value.message == message


def test_deprecated_parameters_warn_once_and_are_dropped() -> None:  # §4.10 #13
    parameters, warnings = params(
        "FROM x\nPARAMETER penalize_newline true\nPARAMETER mirostat 2\n"
        "PARAMETER mirostat 1\nPARAMETER seed 3"
    )
    assert parameters == {"seed": 3}
    assert warnings == [
        "parameter penalize_newline is deprecated",
        "parameter mirostat is deprecated",
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "PARAMETER draft_num_predict 100",
            "draft_num_predict must be between 0 and 64 (0 turns speculative decoding off), "
            "got 100",
        ),
        ("PARAMETER draft_num_predict -1", "draft_num_predict must be between 0 and 64"),
        ("PARAMETER draft_min -2", "draft_min must be at least 0"),
        ("PARAMETER draft_p_min 1.5", "draft_p_min must be between 0 and 1 (a probability)"),
        ("PARAMETER draft_p_min -0.1", "draft_p_min must be between 0 and 1"),
        ("PARAMETER num_ctx -4096", "num_ctx must be at least 0"),
        ("PARAMETER num_batch 0", "num_batch must be at least 1"),
        ("PARAMETER top_p 2", "top_p must be between 0 and 1"),
        ("PARAMETER temperature -1", "temperature must be at least 0"),
        ("PARAMETER temperature inf", "temperature must be a finite number, got inf"),
        ("PARAMETER repeat_penalty nan", "repeat_penalty must be a finite number, got nan"),
        ("PARAMETER repeat_penalty 0", "repeat_penalty must be between 1e-06 and 1000000"),
        ("PARAMETER frequency_penalty -1e7", "frequency_penalty must be between -1000000 and"),
        ("PARAMETER temperature 1e-40", "temperature must be a float32: 0, or between 1.18e-38"),
        ('PARAMETER stop ""', "stop must not be empty"),
        (f"PARAMETER stop {'x' * 257}", "stop strings must be at most 256 characters each"),
    ],
)
def test_parameters_ranges(line: str, message: str) -> None:
    with pytest.raises(ModelfileError) as caught:
        params(f"FROM x\n{line}")
    assert caught.value.line == 2
    assert caught.value.message.startswith(f"(line 2): {message}")


@pytest.mark.parametrize(
    ("name", "value", "beyond"),
    [
        ("draft_num_predict", 0, -1),
        ("draft_num_predict", 64, 65),
        ("draft_p_min", 0.0, -0.01),
        ("draft_p_min", 1.0, 1.01),
        ("num_ctx", 0, -1),
        ("num_predict", -2, -3),
        ("num_keep", -1, -2),
        ("repeat_last_n", -1, -2),
        ("num_gpu", -1, -2),
        ("seed", -(2**63), None),  # no range: only the int64 type bounds it
        ("presence_penalty", -1e6, -1000001.0),
        ("repeat_penalty", 1e-6, 9e-7),
        ("temperature", 0.0, -0.01),
    ],
)
def test_parameters_range_bounds_are_inclusive(
    name: str, value: float, beyond: float | None
) -> None:
    # The bound itself is kept, as a Modelfile PARAMETER and through the check alone...
    assert params(f"FROM x\nPARAMETER {name} {value}") == ({name: value}, [])
    check_parameter(name, value)
    # ...and the nearest value past it is refused, so the bound really is where it is listed.
    if beyond is not None:
        with pytest.raises(ModelfileError, match=f"^{name} must be .*, got {beyond}$"):
            check_parameter(name, beyond)


def test_stop_strings_are_at_most_64() -> None:
    stops = "".join(f"PARAMETER stop s{i}\n" for i in range(65))
    with pytest.raises(ModelfileError) as caught:
        params(f"FROM x\n{stops}")
    assert caught.value.line == 66
    assert "stop takes at most 64 strings, got 65" in caught.value.message
    assert len(params(f"FROM x\n{stops}".rsplit("PARAMETER", 1)[0])[0]["stop"]) == 64


def test_draft_min_above_draft_num_predict_warns() -> None:
    parameters, warnings = params("FROM x\nPARAMETER draft_num_predict 4\nPARAMETER draft_min 6")
    assert parameters == {"draft_num_predict": 4, "draft_min": 6}
    assert len(warnings) == 1 and "never runs" in warnings[0]
    assert params("FROM x\nPARAMETER draft_num_predict 0\nPARAMETER draft_min 6")[1] == []


# coerce_option: API JSON, Ollama's type rules


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("num_ctx", 4096, 4096),
        ("num_ctx", 4096.9, 4096),
        ("seed", -3.7, -3),
        ("temperature", 1, 1.0),
        ("temperature", 0.25, 0.25),
        ("use_mmap", False, False),
        ("stop", ["a", "b"], ["a", "b"]),
        ("stop", [], []),
        ("draft_num_predict", 8.0, 8),
        ("draft_p_min", 0, 0.0),
        ("num_ctx", None, None),
        ("not_an_option", {"x": 1}, {"x": 1}),
        ("mirostat", "anything", "anything"),
    ],
)
def test_coerce_option_accepts(name: str, value: object, expected: object) -> None:
    coerced = coerce_option(name, value)
    assert coerced == expected
    assert type(coerced) is type(expected)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("num_ctx", "4096", 'option "num_ctx" must be of type integer'),
        ("num_ctx", True, 'option "num_ctx" must be of type integer'),
        ("num_ctx", [1], 'option "num_ctx" must be of type integer'),
        ("temperature", "0.5", 'option "temperature" must be of type float32'),
        ("temperature", False, 'option "temperature" must be of type float32'),
        ("use_mmap", 1, 'option "use_mmap" must be of type boolean'),
        ("use_mmap", "true", 'option "use_mmap" must be of type boolean'),
        ("stop", "</s>", 'option "stop" must be of type array'),
        ("stop", ["a", 1], 'option "stop" must be of an array of strings'),
        ("temperature", float("nan"), 'option "temperature" must be a finite number'),
        ("num_ctx", float("inf"), 'option "num_ctx" must be a finite number'),
        ("seed", 2.0**70, 'option "seed" is out of range for a 64-bit integer'),
    ],
)
def test_coerce_option_rejects(name: str, value: object, message: str) -> None:
    with pytest.raises(InputError) as caught:
        coerce_option(name, value)
    assert caught.value.message.startswith(message)
    assert caught.value.status == 400


def test_coerce_option_copies_stop_list() -> None:
    original = ["a"]
    coerced = coerce_option("stop", original)
    coerced.append("b")
    assert original == ["a"]
