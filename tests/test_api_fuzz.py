"""A fuzz pass over every endpoint from the daemon's own OpenAPI document (schemathesis):
schema-valid and schema-invalid requests alike never get a 5xx, and leave no runner behind
(the suite's teardown check). The one 5xx allowed is a pull's 502: a source that cannot be
reached is the upstream's failure, and there is no network here.

Bounded: a fixed number of examples per operation, against one daemon with a tiny model; valid
requests name that model (or one that does not exist), so generation routes reach a runner. The
runner stays loaded between examples (a 10-minute keep-alive; requests that change a load
setting still load anew): loading it for every example cost about 2.5 of this file's 4 minutes,
and loads and unloads under abuse are the soak's subject (``tests/test_soak.py``)."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.generation.modes import GenerationMode

from devtools.daemons import Daemon, start_daemon
from modelhub.config import Settings
from modelhub.server.app import create_app
from tests.fixtures.synthetic import write_tiny_llama

pytestmark = pytest.mark.slow  # tens of seconds
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))

with warnings.catch_warnings():  # FastAPI warns about the HEAD+GET routes sharing an id
    warnings.simplefilter("ignore")
    _SPEC = create_app(Settings.from_env({"MODELHUB_MODELS": tempfile.mkdtemp()})).openapi()
for route, methods in _SPEC["paths"].items():
    for operation in methods.values():
        body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
        properties = body.get("schema", {}).get("properties", {})
        if "model" in properties:  # delete may not take the model the others need
            names = ["nothere"] if route == "/api/delete" else ["tiny", "tiny:latest", "nothere"]
            properties["model"] = {"type": "string", "enum": names}
schema = schemathesis.openapi.from_dict(_SPEC)
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=EXAMPLES
)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The fuzzed daemon; once the pass is over, a check that it was not all refusals at the
    door (in the teardown: the pass is one test, and parallel workers may run any other test
    of this file on a daemon of their own)."""
    base = tmp_path_factory.mktemp("fuzz")
    d = start_daemon(base / "models", base / "daemon.log", {"MODELHUB_KEEP_ALIVE": "10m"})
    model = write_tiny_llama(base / "tiny.gguf")
    mf = Path(base / "Modelfile")
    mf.write_text(f"FROM {model}\nPARAMETER num_predict 8\n")
    d.create("tiny", mf)
    yield d
    try:
        if RUN_THE_MODEL & set(FUZZED):
            _reached_runners_and_got_answers(d)
    finally:
        d.stop()


FUZZED: list[str] = []  # the operations fuzzed in this process
# Valid cases of these load the model and answer; parallel workers share the operations out,
# so the check runs where one of them was fuzzed.
RUN_THE_MODEL = {"/api/generate", "/api/chat"}


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_request_gets_a_server_error(case: schemathesis.Case, fuzzed: Daemon) -> None:
    FUZZED.append(case.operation.path)
    response = case.call(base_url=fuzzed.url, timeout=60)
    upstream = case.operation.path == "/api/pull" and response.status_code == 502
    assert response.status_code < 500 or upstream, (
        f"{case.as_curl_command()}\n{response.text[:500]}"
    )


def _reached_runners_and_got_answers(fuzzed: Daemon) -> None:
    metrics = httpx.get(fuzzed.url + "/metrics", timeout=30).text
    loads = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("modelhub_model_loads ")
    )
    assert loads >= 1, metrics
    requests = [
        line for line in metrics.splitlines() if line.startswith("modelhub_requests_total{")
    ]
    assert any('status="200"' in line for line in requests), requests
    assert any('status="400"' in line for line in requests), requests
