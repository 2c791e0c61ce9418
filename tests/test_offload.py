"""Offload settings: num_gpu, main_gpu, rpc_servers and flash attention from the environment,
Modelfiles and requests to the engine; how many layers fit; what a CPU-only build reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.realmodels import smollm2_q4_1
from modelhub.config import Settings
from modelhub.engine.cpu import RepackDecision
from modelhub.engine.devices import Device, is_loopback, layers_that_fit, parse_endpoint
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from modelhub.engine.llama import LoadPlacement
from modelhub.engine.offload import Offload
from modelhub.errors import InputError, ModelfileError, ModelhubError
from modelhub.modelfile import parse_modelfile
from modelhub.modelfile.params import check_parameter, parameters_from_commands

MIB = 1 << 20


def _settings(**env: str) -> Settings:
    return Settings.from_env({"MODELHUB_MODELS": "/nonexistent", **env})


def test_environment_defaults_and_values() -> None:
    s = _settings()
    assert (s.num_gpu, s.rpc_servers, s.flash_attention) == (-1, (), True)
    s = _settings(
        MODELHUB_NUM_GPU="0",
        MODELHUB_RPC_SERVERS="10.0.0.2:50052, [::1]:50053",
        MODELHUB_FLASH_ATTENTION="off",
    )
    assert (s.num_gpu, s.rpc_servers, s.flash_attention) == (
        0,
        ("10.0.0.2:50052", "[::1]:50053"),
        False,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MODELHUB_NUM_GPU": "-2"}, "MODELHUB_NUM_GPU='-2': use -1"),
        ({"MODELHUB_NUM_GPU": "all"}, "MODELHUB_NUM_GPU='all'"),
        ({"MODELHUB_RPC_SERVERS": "10.0.0.2"}, "'10.0.0.2' is not host:port"),
        ({"MODELHUB_RPC_SERVERS": "a:1,b:99999"}, "'b:99999' is not host:port"),
        ({"MODELHUB_FLASH_ATTENTION": "maybe"}, "MODELHUB_FLASH_ATTENTION='maybe'"),
    ],
)
def test_bad_environment_values_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("[", r"\[")):
        _settings(**env)


def test_rpc_servers_parameter_accumulates_and_is_checked() -> None:
    commands = parse_modelfile(
        "FROM x.gguf\nPARAMETER rpc_servers 10.0.0.2:50052\n"
        "PARAMETER rpc_servers 10.0.0.3:50052,10.0.0.4:50052\nPARAMETER num_gpu 20\n"
    )
    params, _ = parameters_from_commands(commands)
    assert params["rpc_servers"] == ["10.0.0.2:50052", "10.0.0.3:50052,10.0.0.4:50052"]
    assert params["num_gpu"] == 20
    with pytest.raises(ModelfileError, match="rpc_servers must be host:port"):
        check_parameter("rpc_servers", "10.0.0.2")
    with pytest.raises(ModelfileError, match="num_gpu must be"):
        check_parameter("num_gpu", -3)


def test_endpoints() -> None:
    assert parse_endpoint("127.0.0.1:50052") == ("127.0.0.1", 50052)
    assert parse_endpoint("[::1]:7") == ("::1", 7)
    for bad in ("127.0.0.1", "host:", ":80", "h:0", "h:70000"):
        with pytest.raises(ModelhubError, match="expected host:port"):
            parse_endpoint(bad)
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.20")


def test_layers_that_fit() -> None:
    # 30 layers of 100 MiB and 300 MiB for the rest, on devices with this much free:
    assert layers_that_fit(30, 100 * MIB, 300 * MIB, 4000 * MIB) == 31  # all (+ output)
    assert layers_that_fit(30, 100 * MIB, 300 * MIB, 2000 * MIB) == 18  # 1800 MiB usable
    assert layers_that_fit(30, 100 * MIB, 300 * MIB, 50 * MIB) == 0
    assert layers_that_fit(30, 100 * MIB, 300 * MIB, 0) == 0


@pytest.mark.slow
def test_cpu_only_build_places_everything_on_the_cpu(tmp_path: Path) -> None:
    """Without GPU or RPC devices num_gpu -1 and 20 both load on the CPU, and what llama.cpp
    allocated is read back per buffer; flash attention can be turned off."""
    for num_gpu in (-1, 20):
        with Engine(EngineConfig(smollm2_q4_1(), n_ctx=256, num_gpu=num_gpu)) as e:
            if e.offload.devices:
                pytest.skip("this build has offload devices: the lanes with them test this")
            assert e.offload.n_gpu_layers == 0
            assert "no GPU or RPC device" in e.offload.reason
            placed = e.placement
            assert placed.device_bytes == 0
            assert placed.total_bytes > 90 * MIB  # 98 MB of weights, the KV cache, buffers
            assert all(name.startswith("CPU") for name in placed.by_buffer), placed
    with Engine(EngineConfig(smollm2_q4_1(), n_ctx=256, flash_attn=False)) as e:
        out = e.generate(e.tokenize("The sky is"), GenerateOptions(num_predict=4, temperature=0))
        assert out.eval_count == 4


def test_draft_files_go_to_local_accelerators_only() -> None:
    cuda = Device(1, "CUDA0", "NVIDIA H200", "gpu", 100 * MIB, 140 * MIB, handle=11)
    rpc = Device(2, "RPC0", "10.0.0.2:50052", "gpu", 100 * MIB, 100 * MIB, handle=22)
    repack = RepackDecision(True, "test")
    both = Offload(31, [cuda, rpc], "automatic")
    assert both.draft(repack) == LoadPlacement(True, n_gpu_layers=999, devices=(11,))
    assert [d.label for d in both.draft_devices] == ["CUDA0"]
    on_cpu = LoadPlacement(True, cpu_only=True)
    assert Offload(31, [rpc], "automatic").draft(repack) == on_cpu  # RPC workers only
    no_repack = LoadPlacement(False, cpu_only=True)
    assert Offload(0, [], "num_gpu 0").draft(RepackDecision(False, "x")) == no_repack
    assert rpc.label == "RPC0[10.0.0.2:50052]" and cuda.label == "CUDA0"


def test_the_auto_kv_cache_is_f16_where_the_layers_are_on_a_local_gpu() -> None:
    """``auto``'s Q8_0 keys buy exactness on the CPU backend only (RPC workers run it too):
    with layers on a GPU the target's cache is F16; a type asked for by name is kept."""
    cuda = Device(1, "CUDA0", "NVIDIA H200", "gpu", 100 * MIB, 140 * MIB, handle=11)
    rpc = Device(2, "RPC0", "10.0.0.2:50052", "gpu", 100 * MIB, 100 * MIB, handle=22)
    assert Offload(31, [cuda], "automatic").kv_cache_type("auto") == "f16"
    assert Offload(10, [cuda, rpc], "num_gpu 10").kv_cache_type("auto") == "f16"
    assert Offload(31, [rpc], "automatic").kv_cache_type("auto") == "auto"
    assert Offload(0, [], "num_gpu 0").kv_cache_type("auto") == "auto"
    assert Offload(31, [cuda], "automatic").kv_cache_type("q8_0") == "q8_0"
