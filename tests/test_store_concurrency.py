"""Threads and processes creating, copying, reading and deleting models that share blobs.

Whatever the interleaving, the store invariant must hold at the end (STO-05, STO-10, STO-11):
every manifest parses and names blobs that exist with the declared size, no temp file is
left, and after a full prune exactly the referenced blobs remain. A reader never sees a
half-written manifest.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from modelhub.errors import NotFoundError, StoreError
from modelhub.store import MEDIA_CONFIG, MEDIA_MODEL, MEDIA_TEMPLATE, Layer, Manifest, Store
from modelhub.store import parse_name as _parse
from modelhub.store.blobs import TEMP_PREFIX

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAMES = [_parse(f"m{i}") for i in range(5)] + [_parse("Shared/CASE:v1"), _parse("shared/case:V1")]
WEIGHTS = [(b"weights %d " % i) * 20_000 for i in range(3)]  # ~200 KB each, shared by models
ROUNDS = 40


def _create(store: Store, rng: random.Random, worker: str, round_no: int) -> int:
    """Create a model; returns how many times the commit had to start over."""
    template = b"common template" if rng.random() < 0.5 else f"{worker}/{round_no}".encode()
    name = rng.choice(NAMES)
    for attempt in range(50):
        try:
            manifest = Manifest(
                Layer(MEDIA_CONFIG, *store.put_bytes(b'{"model_format":"gguf"}')),
                [
                    Layer(MEDIA_MODEL, *store.put_bytes(rng.choice(WEIGHTS))),
                    Layer(MEDIA_TEMPLATE, *store.put_bytes(template)),
                ],
            )
            store.write_manifest(name, manifest)
            return attempt
        except StoreError as exc:
            # A concurrent delete freed a blob we had just put: the commit is refused
            # cleanly and the create starts over, as a real create would.
            if "is missing" not in str(exc):
                raise
    raise AssertionError("create kept losing its blobs")


def churn(store: Store, worker: str, rounds: int = ROUNDS) -> Counter[str]:
    """One worker's random mix of operations; returns how often each one ran."""
    rng = random.Random(worker)
    done: Counter[str] = Counter()
    for round_no in range(rounds):
        op = rng.choices(["create", "delete", "copy", "read", "list", "prune"], [5, 3, 2, 2, 1, 1])[
            0
        ]
        try:
            if op == "create":
                done["create retries"] += _create(store, rng, worker, round_no)
            elif op == "delete":
                store.delete(rng.choice(NAMES))
            elif op == "copy":
                store.copy(rng.choice(NAMES), rng.choice(NAMES))
            elif op == "read":
                model = store.get(rng.choice(NAMES))
                assert model.manifest.layers and model.size > 0
            elif op == "list":
                for model in store.list_models():
                    assert model.manifest.layers
            else:
                store.prune()  # default grace: must not touch anything in flight
        except NotFoundError:
            op += " (not found)"
        done[op] += 1
    return done


WORKER = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from pathlib import Path
from test_store_concurrency import churn
from modelhub.store import Store
print(dict(churn(Store(Path(sys.argv[1])), sys.argv[2])))
"""


# Races are found by repetition: each run is a different interleaving (and seed).
@pytest.mark.parametrize("iteration", range(3))
def test_threads_and_processes_keep_the_store_consistent(tmp_path: Path, iteration: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path), f"process-{iteration}-{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for i in range(2)
    ]
    totals: Counter[str] = Counter()
    errors: list[BaseException] = []

    shared = Store(tmp_path)  # as in the daemon: one Store used by many threads

    def run(worker: str, own_store: bool) -> None:
        try:
            totals.update(churn(Store(tmp_path) if own_store else shared, worker))
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(f"thread-{iteration}-{i}", i % 2 == 0)) for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-3000:]
        assert out.strip().startswith(b"{")
    assert not errors, errors[0]
    # Every kind of operation really ran, with and without contention.
    assert totals["create"] >= 50 and totals["delete"] + totals["delete (not found)"] >= 20
    assert totals["copy"] + totals["read"] >= 10

    store = Store(tmp_path)
    assert store.verify(rehash=True) == []
    assert not [p for p in tmp_path.rglob(TEMP_PREFIX + "*")]
    # The two case spellings of "Shared/CASE:v1" always landed in one manifest.
    shared_dirs = [
        d
        for d in (store.manifests_dir / "registry.ollama.ai").iterdir()
        if d.name.lower() == "shared"
    ]
    assert len(shared_dirs) <= 1
    models = store.list_models()
    referenced = set().union(*(m.manifest.digests() for m in models)) if models else set()
    store.prune(grace_seconds=0)
    on_disk = {"sha256:" + p.name.removeprefix("sha256-") for p in store.blobs_dir.iterdir()}
    assert on_disk == referenced
    assert store.verify() == []
    for model in models:
        assert store.get(model.name).raw == model.raw
