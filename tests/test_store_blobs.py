"""Digests (SEC-01/02) and the verified blob writer (SEC-03, STO-01, STO-05)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from modelhub.errors import (
    DigestMismatchError,
    InputError,
    InvalidDigestError,
    NotFoundError,
    StoreError,
)
from modelhub.store import Store, blob_filename, parse_digest, sha256_file
from modelhub.store.blobs import TEMP_PREFIX

REPO = Path(__file__).resolve().parent.parent
HEX = "0123456789abcdef" * 4
GOOD = "sha256:" + HEX


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_files(store: Store) -> list[str]:
    return sorted(p.name for p in store.blobs_dir.iterdir())


# ----- digests ---------------------------------------------------------------------------------

BAD_DIGESTS = [
    "",
    "sha256:",
    "sha256:" + HEX[:63],
    "sha256:" + HEX + "0",
    "sha256:" + HEX + "/x",
    "sha256:" + HEX + "\n",
    "sha256:" + HEX[:63] + "\x00",
    "sha256:../../x",
    "../x",
    "../../etc/ld.so.preload",
    "sha512:" + "0" * 128,
    "SHA256:" + HEX,
    "sha256:" + HEX.upper(),
    "sha256-" + HEX,
    " sha256:" + HEX,
    "sha256:" + HEX[:63] + "g",
    HEX,
]


def test_strict_accepts_only_canonical() -> None:
    assert parse_digest(GOOD) == GOOD


@pytest.mark.parametrize("text", BAD_DIGESTS)
def test_strict_rejects(text: str) -> None:
    with pytest.raises(InvalidDigestError, match="invalid digest format"):
        parse_digest(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD, GOOD),
        ("sha256-" + HEX, GOOD),
        ("sha256:" + HEX.upper(), GOOD),
        ("sha256-" + HEX.upper(), GOOD),
    ],
)
def test_lenient_normalises(text: str, expected: str) -> None:
    assert parse_digest(text, lenient=True) == expected


@pytest.mark.parametrize(
    "text", ["SHA256:" + HEX, "sha256_" + HEX, "sha256:" + HEX[:63], "sha256-../x", "../x"]
)
def test_lenient_still_rejects(text: str) -> None:
    with pytest.raises(InvalidDigestError):
        parse_digest(text, lenient=True)


def test_non_string_rejected() -> None:
    with pytest.raises(InvalidDigestError):
        parse_digest(None)  # type: ignore[arg-type]


def test_blob_filename() -> None:
    assert blob_filename(GOOD) == "sha256-" + HEX
    with pytest.raises(InvalidDigestError):
        blob_filename("sha256-" + HEX)


def test_error_message_is_bounded_and_escaped() -> None:
    with pytest.raises(InvalidDigestError) as info:
        parse_digest("x" * 10_000 + "\x1b")
    assert len(str(info.value)) < 300 and "\x1b" not in str(info.value)


def test_sha256_file(tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)  # spans several 1 MiB chunks
    path = tmp_path / "f"
    path.write_bytes(data)
    assert sha256_file(path) == (sha(data), len(data))


@pytest.fixture(scope="module")
def module_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    # Module scope: hypothesis runs many examples per test call, one store serves them all.
    return Store(tmp_path_factory.mktemp("hyp-store"))


@settings(max_examples=500, deadline=None)
@given(text=st.one_of(st.text(max_size=90), st.text(alphabet="sha256:-./0123456789abcdefABCDEF\\")))
@example(GOOD)
@example("sha256-" + HEX.upper())
@example("sha256:" + HEX[:60] + "/../")
def test_any_string_is_invalid_or_a_path_inside_blobs(module_store: Store, text: str) -> None:
    store = module_store
    for lenient in (False, True):
        try:
            digest = parse_digest(text, lenient=lenient)
        except InvalidDigestError:
            continue
        path = store.blob_path(digest)
        assert path.resolve().parent == store.blobs_dir.resolve()
    try:
        path = store.blob_path(text)
    except InvalidDigestError:
        return
    assert path.resolve().parent == store.blobs_dir.resolve()
    assert path.name == "sha256-" + text.removeprefix("sha256:")


# ----- blob writer -----------------------------------------------------------------------------


def test_commit_publishes_verified_blob(tmp_path: Path) -> None:
    store = Store(tmp_path)
    data = b"hello world" * 1000
    with store.blob_writer() as writer:
        writer.write(data[:5000])
        writer.write(data[5000:])
        digest, size = writer.commit(sha(data))
    assert (digest, size) == (sha(data), len(data))
    assert store.blob_path(digest).read_bytes() == data
    assert blob_files(store) == [blob_filename(digest)]
    assert store.blob_path(digest).stat().st_mode & 0o777 == 0o600 & ~_umask()  # private


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_commit_without_expected(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert store.put_bytes(b"abc") == (sha(b"abc"), 3)
    assert store.put_bytes(b"") == (sha(b""), 0)
    assert store.has_blob(sha(b"")) and store.read_blob_bytes(sha(b"abc")) == b"abc"


def test_mismatch_leaves_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    data = os.urandom(1 << 20)
    claimed = sha(b"something else")
    writer = store.blob_writer()
    writer.write(data)
    with pytest.raises(DigestMismatchError) as info:
        writer.commit(claimed)
    assert str(info.value) == f'digest mismatch, expected "{claimed}", got "{sha(data)}"'
    assert info.value.status == 400
    assert blob_files(store) == []  # neither digest's name, no temp file
    assert not store.has_blob(claimed) and not store.has_blob(sha(data))


def test_invalid_expected_digest_aborts(tmp_path: Path) -> None:
    store = Store(tmp_path)
    writer = store.blob_writer()
    writer.write(b"x")
    with pytest.raises(InvalidDigestError):
        writer.commit("sha256:../../x")
    assert blob_files(store) == []


def test_existing_blob_is_kept_and_touched(tmp_path: Path) -> None:
    store = Store(tmp_path)
    digest, _ = store.put_bytes(b"same")
    path = store.blob_path(digest)
    inode = path.stat().st_ino
    os.utime(path, (1, 1))
    assert store.put_bytes(b"same") == (digest, 4)
    assert path.stat().st_ino == inode  # not rewritten
    assert path.stat().st_mtime > time.time() - 60  # mtime refreshed: protected from prune
    assert blob_files(store) == [path.name]


def test_exception_in_context_aborts(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(RuntimeError), store.blob_writer() as writer:
        writer.write(b"partial data")
        assert writer.temp_path.exists() and writer.temp_path.name.startswith(TEMP_PREFIX)
        raise RuntimeError("client went away")
    assert blob_files(store) == []


def test_leaving_context_without_commit_aborts(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with store.blob_writer() as writer:
        writer.write(b"never committed")
    assert blob_files(store) == []
    with pytest.raises(StoreError, match="after commit or abort"):
        writer.write(b"more")


def test_max_size(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with store.blob_writer(max_size=10) as writer:
        writer.write(b"12345")
        writer.write(b"67890")
        assert writer.commit() == (sha(b"1234567890"), 10)
    with pytest.raises(InputError, match="limit of 10 bytes"), store.blob_writer(10) as writer:
        writer.write(b"12345")
        writer.write(b"678901")
    assert blob_files(store) == [blob_filename(sha(b"1234567890"))]


def test_temp_name_never_parses_as_digest(tmp_path: Path) -> None:
    store = Store(tmp_path)
    writer = store.blob_writer()
    with pytest.raises(InvalidDigestError):
        parse_digest(writer.temp_path.name, lenient=True)
    writer.abort()
    writer.abort()  # idempotent
    assert blob_files(store) == []


def test_import_file(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    source = tmp_path / "weights.gguf"
    data = os.urandom(2 * (1 << 20) + 5)
    source.write_bytes(data)
    assert store.import_file(source) == (sha(data), len(data))
    assert store.blob_path(sha(data)).read_bytes() == data


def test_import_refuses_non_regular_files(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, tmp_path / "missing"):
        with pytest.raises(InputError, match=str(path.name)):
            store.import_file(path)
    assert blob_files(store) == []


def test_read_blob_bytes_bounded(tmp_path: Path) -> None:
    store = Store(tmp_path)
    digest, _ = store.put_bytes(b"x" * 100)
    assert store.read_blob_bytes(digest, max_size=100) == b"x" * 100
    with pytest.raises(StoreError, match="larger than 99 bytes"):
        store.read_blob_bytes(digest, max_size=99)
    with pytest.raises(NotFoundError, match="not found"):
        store.read_blob_bytes(GOOD)


def test_concurrent_writers_threads(tmp_path: Path) -> None:
    store = Store(tmp_path)
    data = os.urandom(2 << 20)
    results: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def upload() -> None:
        try:
            start.wait()
            with store.blob_writer() as writer:
                for offset in range(0, len(data), 65536):
                    writer.write(data[offset : offset + 65536])
                results.append(writer.commit(sha(data)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=upload) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert results == [(sha(data), len(data))] * 8
    assert blob_files(store) == [blob_filename(sha(data))]
    assert sha256_file(store.blob_path(sha(data))) == (sha(data), len(data))


WRITER_SCRIPT = """
import sys
from pathlib import Path
from modelhub.store import Store
root, seed, rounds = Path(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3])
store = Store(root)
data = seed * (1 << 20)
for _ in range(rounds):
    with store.blob_writer() as writer:
        for i in range(0, len(data), 1 << 16):
            writer.write(data[i : i + (1 << 16)])
        print(writer.commit()[0], flush=True)
"""


def test_concurrent_writers_two_processes(tmp_path: Path) -> None:
    seed = b"0123456789abcdef"
    data = seed * (1 << 20)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER_SCRIPT, str(tmp_path), seed.decode(), "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        assert out.decode().split() == [sha(data)] * 5
    store = Store(tmp_path)
    assert blob_files(store) == [blob_filename(sha(data))]
    assert sha256_file(store.blob_path(sha(data))) == (sha(data), len(data))


def test_commit_fsyncs_before_rename_and_syncs_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Record the real system calls (they still run) to check the durability order.
    store = Store(tmp_path)
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}") if Path("/proc/self/fd").exists() else "?"
        events.append(f"fsync {Path(target).name}")
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append(f"replace {Path(src).name} {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with store.blob_writer() as writer:
        writer.write(b"durable")
        temp = writer.temp_path.name
        digest, _ = writer.commit()
    name = blob_filename(digest)
    if Path("/proc/self/fd").exists():
        assert events == [f"fsync {temp}", f"replace {temp} {name}", "fsync blobs"]
    else:
        assert [e.split()[0] for e in events] == ["fsync", "replace", "fsync"]


KILLED_WRITER = """
import sys, time
from pathlib import Path
from modelhub.store import Store
writer = Store(Path(sys.argv[1])).blob_writer()
writer.write(b"first half of a blob ")
writer._file.flush()
print(writer.temp_path.name, flush=True)
time.sleep(60)  # killed here, before commit
"""


def test_killed_writer_leaves_only_a_temp_that_prune_removes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    temp_name = proc.stdout.readline().decode().strip()
    proc.kill()
    proc.wait(timeout=30)
    store = Store(tmp_path)  # the "restart"
    assert blob_files(store) == [temp_name] and temp_name.startswith(TEMP_PREFIX)
    assert store.verify() == [] and store.prune() == []  # young: could be a live writer
    old = time.time() - 7200
    os.utime(store.blobs_dir / temp_name, (old, old))
    assert store.prune() == [temp_name]
    assert blob_files(store) == []


def _digest_path_builders(source: str) -> list[int]:
    """Lines that turn a digest into a blob file name by hand (SEC-02's recurring bug)."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and first.value == "sha256-":
                lines.append(node.lineno)  # f"sha256-{hex}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if isinstance(node.left, ast.Constant) and node.left.value == "sha256-":
                lines.append(node.lineno)  # "sha256-" + hex
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if node.func.attr == "replace" and args[:2] == [":", "-"]:
                lines.append(node.lineno)  # digest.replace(":", "-")
    return lines


def test_detector_finds_hand_made_blob_paths() -> None:
    bad = 'a = f"sha256-{h}"\nb = "sha256-" + h\nc = d.replace(":", "-")\nok = "sha256:" + h\n'
    assert _digest_path_builders(bad) == [1, 2, 3]


def test_no_second_digest_to_path_helper() -> None:
    # Only digests.py may map a digest to a file name; everything else calls blob_path_in /
    # Store.blob_path, which validate first.
    offenders = []
    for path in sorted((REPO / "modelhub").rglob("*.py")):
        if path == REPO / "modelhub" / "store" / "digests.py":
            continue
        for line in _digest_path_builders(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(REPO)}:{line}")
    assert offenders == []
