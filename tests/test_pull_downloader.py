"""The downloader under faults: drops, corruption, 5xx, ignored ranges, stalls, kills, races."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from devtools.pullservers import (
    MEDIA_MODEL,
    Fault,
    FileServer,
    Recorder,
    RegistryServer,
    fast_policy,
    sha256,
)
from modelhub.errors import (
    DigestMismatchError,
    ModelhubError,
    NoSpaceError,
    RequestCancelledError,
    SourceUnavailableError,
)
from modelhub.library.pulled import installer
from modelhub.pull import prune_partials, pull_model
from modelhub.pull.partials import partial_downloads
from modelhub.store import Store, parse_name

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parent.parent
SIZE = 3 << 20  # 12 parts of 256 KiB with the test policy


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "models")


@pytest.fixture
def registry() -> RegistryServer:
    with RegistryServer() as server:
        yield server


def model(registry: RegistryServer, fault: Fault | None = None, size: int = SIZE) -> bytes:
    weights = os.urandom(size)
    registry.add_model("library/m", "latest", [(MEDIA_MODEL, weights)])
    if fault is not None:
        registry.faults[sha256(weights)] = fault
    return weights


def pull(store: Store, registry: RegistryServer, **kw: object) -> None:
    kw.setdefault("policy", fast_policy())
    kw.setdefault("progress", Recorder())
    kw.setdefault("install", installer(store))
    pull_model(store, f"{registry.host}/library/m", insecure=True, **kw)  # type: ignore[arg-type]


def leftovers(store: Store) -> list[str]:
    return sorted(
        p.name
        for p in store.blobs_dir.iterdir()
        if "partial" in p.name or p.name.startswith(".tmp-")
    )


def ranges(registry: RegistryServer, digest: str) -> list[str]:
    return [
        h.headers.get("range", "")
        for h in registry.hits(digest[7:])
        if h.status in (200, 206) and h.headers.get("range") != "bytes=0-0"
    ]


def test_parallel_parts_hash_in_order_and_land_verified(store, registry):
    weights = model(registry)
    recorder = Recorder()
    pull(store, registry, progress=recorder)
    assert store.blob_path(sha256(weights)).read_bytes() == weights
    assert len(ranges(registry, sha256(weights))) == SIZE // (256 << 10)
    completed = [
        i.get("completed", 0) for i in recorder.items if i.get("digest") == sha256(weights)
    ]
    assert completed == sorted(completed) and completed[-1] == SIZE  # progress never goes back
    assert leftovers(store) == []
    assert store.verify(rehash=True) == []


def test_dropped_connections_are_resumed_with_ranges(store, registry):
    weights = model(registry, Fault(drop_after=100_000, drop_times=3), size=600_000)
    pull(store, registry, policy=fast_policy(part_min=1 << 20))  # one part: resume is visible
    asked = ranges(registry, sha256(weights))
    assert asked[0] == "" and asked[1] == "bytes=100000-599999"  # continues where it broke
    assert store.blob_path(sha256(weights)).read_bytes() == weights
    assert registry.bytes_sent(sha256(weights)[7:]) < 2 * len(weights)


def test_server_errors_are_retried_then_succeed(store, registry):
    weights = model(registry, Fault(statuses=[503, 500]))
    pull(store, registry)
    assert store.blob_path(sha256(weights)).read_bytes() == weights


def test_persistent_server_errors_fail_with_a_clear_message(store, registry):
    model(registry, Fault(statuses=[503] * 100))
    with pytest.raises(SourceUnavailableError, match=r"failed after 3 attempts.*503"):
        pull(store, registry)
    assert store.list_models() == []
    assert leftovers(store) == []  # nothing was received: no debris


def test_corrupted_bytes_never_get_a_manifest(store, registry):
    weights = model(registry, Fault(corrupt_at=SIZE // 2))
    with pytest.raises(DigestMismatchError, match="file must be downloaded again: want sha256:"):
        pull(store, registry)
    assert not store.has_blob(sha256(weights))
    assert store.list_models() == []
    assert leftovers(store) == []
    assert store.verify(rehash=True) == []


def test_a_server_ignoring_range_restarts_as_one_stream(store, registry):
    weights = model(registry, Fault(ignore_range=True))
    pull(store, registry)
    assert store.blob_path(sha256(weights)).read_bytes() == weights
    assert store.verify(rehash=True) == []


def test_a_wrong_content_range_is_discarded_and_retried(store, registry):
    weights = model(registry, Fault(wrong_range_times=2))
    pull(store, registry)
    assert store.blob_path(sha256(weights)).read_bytes() == weights


def test_empty_body_for_a_non_empty_blob_is_an_error_naming_the_size(store, registry):
    model(registry, Fault(empty_body=True, ignore_range=True), size=5000)
    with pytest.raises(ModelhubError, match=r"0 bytes, 5000 were expected|0 of 5000 bytes"):
        pull(store, registry)


def test_stalled_transfers_are_retried_and_then_reported(store, registry):
    """STO-14: headers then silence; the stall timeout retries, then the pull fails."""
    model(registry, Fault(stall_after=0, stall_seconds=30, stall_times=100), size=100_000)
    policy = fast_policy(stall_timeout=0.3, attempts=3)
    started = time.monotonic()
    with pytest.raises(SourceUnavailableError, match="stalled"):
        pull(store, registry, policy=policy)
    assert time.monotonic() - started < 10
    assert len(ranges(registry, "")) >= 3  # reconnected for each attempt


def test_slow_link_progress_is_honest_and_cancel_stops_quickly(store, registry):
    weights = model(registry, Fault(rate=400_000), size=2_000_000)
    cancel = threading.Event()
    recorder = Recorder()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pull(store, registry, cancel=cancel, progress=recorder)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while not any(i.get("completed") for i in recorder.items) and time.monotonic() < deadline:
        time.sleep(0.05)
    cancel.set()
    stopped = time.monotonic()
    thread.join(10)
    assert time.monotonic() - stopped < 1
    assert errors and isinstance(errors[0], RequestCancelledError)
    time.sleep(0.5)  # the shared transfer notices that nobody waits any more (STO-06)...
    sent = registry.bytes_sent(sha256(weights)[7:])
    time.sleep(0.5)
    assert registry.bytes_sent(sha256(weights)[7:]) == sent  # ...and closes its connections
    completed = [
        i.get("completed", 0) for i in recorder.items if i.get("digest") == sha256(weights)
    ]
    assert 0 < max(completed) < len(weights)
    # The partial is kept for a later pull, which resumes it.
    assert [p.digest for p in partial_downloads(store)] == [sha256(weights)]
    sent_before = registry.bytes_sent(sha256(weights)[7:])
    registry.faults.clear()
    time.sleep(0.2)  # the cancelled transfer releases its lock
    pull(store, registry)
    assert store.blob_path(sha256(weights)).read_bytes() == weights
    assert registry.bytes_sent(sha256(weights)[7:]) - sent_before < len(weights)


def test_concurrent_pulls_in_one_process_share_one_download(store, registry):
    weights = model(registry, Fault(rate=4_000_000), size=1_500_000)
    results: list[object] = []

    def run() -> None:
        try:
            pull(store, registry)
            results.append("ok")
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == ["ok"] * 6
    assert registry.bytes_sent(sha256(weights)[7:]) <= len(weights) + 10
    assert store.verify(rehash=True) == []


def test_two_models_sharing_a_layer_download_it_once(store, registry):
    shared = os.urandom(1_500_000)
    registry.add_model("library/a", "latest", [(MEDIA_MODEL, shared), ("t", b"template a")])
    registry.add_model("library/b", "latest", [(MEDIA_MODEL, shared), ("t", b"template b")])
    registry.faults[sha256(shared)] = Fault(rate=4_000_000)
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            pull_model(
                store,
                f"{registry.host}/library/{name}",
                insecure=True,
                progress=Recorder(),
                install=installer(store),
                policy=fast_policy(),
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert registry.bytes_sent(sha256(shared)[7:]) <= len(shared) + 10
    assert len(store.list_models()) == 2


def test_one_waiter_cancelling_does_not_stop_the_other(store, registry):
    weights = model(registry, Fault(rate=1_000_000), size=1_000_000)
    cancel_first = threading.Event()
    outcome: dict[str, object] = {}

    def run(key: str, cancel: threading.Event | None) -> None:
        try:
            pull(store, registry, cancel=cancel)
            outcome[key] = "ok"
        except BaseException as exc:
            outcome[key] = exc

    first = threading.Thread(target=run, args=("first", cancel_first))
    second = threading.Thread(target=run, args=("second", None))
    first.start()
    second.start()
    time.sleep(0.2)
    cancel_first.set()
    first.join(10)
    second.join(30)
    assert isinstance(outcome["first"], RequestCancelledError)
    assert outcome["second"] == "ok"
    assert store.blob_path(sha256(weights)).read_bytes() == weights
    assert registry.bytes_sent(sha256(weights)[7:]) <= len(weights) + 10  # one download


PULL_SCRIPT = textwrap.dedent("""
    import sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from devtools.pullservers import fast_policy
    from modelhub.pull import pull_model
    from modelhub.library.pulled import installer
    from modelhub.store import Store
    print("started", flush=True)
    store = Store({models!r})
    pull_model(store, {ref!r}, insecure=True, progress=lambda item: None,
               install=installer(store), policy=fast_policy(parallel=2))
    print("done", flush=True)
""")


def spawn_pull(store: Store, registry: RegistryServer) -> subprocess.Popen[str]:
    script = PULL_SCRIPT.format(
        root=str(ROOT),
        tests=str(ROOT / "tests"),
        models=str(store.root),
        ref=f"{registry.host}/library/m",
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def test_a_killed_puller_is_resumed_by_the_next_pull(store, registry):
    weights = model(registry, Fault(rate=3_000_000), size=SIZE)
    child = spawn_pull(store, registry)
    digest = sha256(weights)
    deadline = time.monotonic() + 30
    while registry.bytes_sent(digest[7:]) < SIZE // 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    child.kill()  # SIGKILL: no cleanup at all
    child.wait()
    time.sleep(0.3)  # let the server notice the dead connections
    partials = partial_downloads(store)
    assert [(p.digest, p.live) for p in partials] == [(digest, False)]
    assert 0 < partials[0].completed < SIZE
    sent_before = registry.bytes_sent(digest[7:])
    registry.faults.clear()
    pull(store, registry)
    assert store.blob_path(digest).read_bytes() == weights
    resumed = registry.bytes_sent(digest[7:]) - sent_before
    assert resumed <= SIZE - partials[0].completed + 64 * 1024
    # No partial remains; a state file the kill interrupted mid-write may (prune's debris).
    assert [name for name in leftovers(store) if not name.startswith(".tmp-")] == []
    assert store.get(parse_name(f"{registry.host}/library/m"))


def test_two_processes_share_one_download(store, registry):
    weights = model(registry, Fault(rate=6_000_000), size=SIZE)
    children = [spawn_pull(store, registry) for _ in range(2)]
    outputs = [child.communicate(timeout=60)[0] for child in children]
    assert all(child.returncode == 0 for child in children), outputs
    assert registry.bytes_sent(sha256(weights)[7:]) <= SIZE + 10
    assert store.verify(rehash=True) == []


def test_a_resumed_partial_with_bad_bytes_is_downloaded_again(store, registry):
    weights = model(registry, Fault(drop_after=SIZE // 2, drop_times=1), size=SIZE)
    policy = fast_policy(attempts=1, part_min=16 << 20)  # one part, give up at the drop
    with pytest.raises(SourceUnavailableError):
        pull(store, registry, policy=policy)
    (partial,) = partial_downloads(store)
    data = store.blob_path(partial.digest).with_name(
        store.blob_path(partial.digest).name + "-partial"
    )
    with open(data, "r+b") as handle:  # bit rot in the bytes already downloaded
        handle.seek(1000)
        handle.write(b"\xff\xfe")
    pull(store, registry)
    assert store.blob_path(sha256(weights)).read_bytes() == weights


def test_disk_full_is_reported_at_once_and_the_next_pull_succeeds(store, registry, monkeypatch):
    """STO-07: ENOSPC stops every part without retries; the store stays consistent."""
    weights = model(registry)
    real_pwrite = os.pwrite
    calls = {"n": 0}

    def full_disk(fd: int, data: object, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "pwrite", full_disk)
    started = time.monotonic()
    with pytest.raises(NoSpaceError, match="no space left on device"):
        pull(store, registry)
    assert time.monotonic() - started < 2
    assert store.list_models() == []
    assert store.verify() == []
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    pull(store, registry)
    assert store.blob_path(sha256(weights)).read_bytes() == weights


def test_not_enough_space_is_refused_before_any_blob_request(store, registry, monkeypatch):
    import shutil
    from collections import namedtuple

    model(registry)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 1000))
    with pytest.raises(NoSpaceError, match="not enough disk space"):
        pull(store, registry)
    assert registry.hits("/blobs/") == []


def test_prune_partials_removes_abandoned_ones_and_never_a_live_one(store, registry):
    weights = model(registry, Fault(drop_after=SIZE // 3), size=SIZE)
    with pytest.raises(SourceUnavailableError):
        pull(store, registry, policy=fast_policy(attempts=1, part_min=16 << 20))
    (stale,) = partial_downloads(store)
    assert not stale.live
    # A live download in a child process, throttled so that it is still running.
    other = os.urandom(SIZE)
    registry.add_model("library/live", "latest", [(MEDIA_MODEL, other)])
    registry.faults[sha256(other)] = Fault(rate=1_000_000)
    script = PULL_SCRIPT.format(
        root=str(ROOT),
        tests=str(ROOT / "tests"),
        models=str(store.root),
        ref=f"{registry.host}/library/live",
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while registry.bytes_sent(sha256(other)[7:]) < 200_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert prune_partials(store, older_than=3600) == []  # both are recent
        removed = prune_partials(store, older_than=0)
        assert removed and all(sha256(weights)[7:] in name for name in removed)
        assert [p.digest for p in partial_downloads(store)] == [sha256(other)]
        assert partial_downloads(store)[0].live
    finally:
        child.kill()
        child.wait()


def test_store_prune_and_pull_agree_on_partial_names(store, registry):
    """The store's own prune treats our partial files as debris after its grace period."""
    model(registry, Fault(drop_after=SIZE // 3), size=SIZE)
    with pytest.raises(SourceUnavailableError):
        pull(store, registry, policy=fast_policy(attempts=1, part_min=16 << 20))
    names = leftovers(store)
    assert names and store.verify() == []  # partials are not "unexpected files"
    assert store.prune(grace_seconds=3600) == []
    assert sorted(store.prune(grace_seconds=0)) == names


def test_resume_state_files_are_ollama_shaped(store, registry):
    weights = model(registry, Fault(drop_after=500_000, drop_times=5), size=SIZE)
    with pytest.raises(SourceUnavailableError):
        pull(store, registry, policy=fast_policy(attempts=1, part_min=1 << 20, part_max=1 << 20))
    states = sorted(store.blobs_dir.glob(f"sha256-{sha256(weights)[7:]}-partial-*"))
    docs = [json.loads(p.read_text()) for p in states]
    assert [d["N"] for d in docs] == [0, 1, 2]
    assert all(set(d) == {"N", "Offset", "Size", "Completed"} for d in docs)
    assert [d["Offset"] for d in docs] == [0, 1 << 20, 2 << 20]


def test_cdn_redirect_is_followed_for_every_part(store):
    with FileServer() as cdn, RegistryServer(cdn=cdn) as registry:
        weights = model(registry)
        pull(store, registry)
        assert len([h for h in cdn.hits("/cdn/") if h.status == 206]) >= SIZE // (256 << 10)
    assert store.blob_path(sha256(weights)).read_bytes() == weights
