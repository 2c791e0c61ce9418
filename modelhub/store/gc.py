"""Garbage collection of the store: which blobs manifests reference, unlinking the others, and
clearing debris (temp files, download partials, legacy names, empty manifest directories).
The drafting state kept for a weights blob (``<root>/drafting/<hex>/``, e.g. its n-gram pool)
goes with the blob.

These functions take no lock; :class:`~modelhub.store.Store` holds its lock around them and
decides, failing closed, whether anything may be deleted (STO-09).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
from pathlib import Path

from modelhub.errors import ModelhubError
from modelhub.store.blobs import PARTIAL_SUFFIX, TEMP_PREFIX, fsync_dir
from modelhub.store.digests import (
    blob_path_in,
    digest_from_filename,
    digest_from_state_name,
    state_path_in,
)
from modelhub.store.manifest_tree import ManifestTree, entries, subdirs

log = logging.getLogger(__name__)

# Store debris: our temp files, download partials, and legacy colon-named duplicates.
DEBRIS = re.compile(
    re.escape(TEMP_PREFIX)
    + r"[A-Za-z0-9_-]{1,100}"
    + r"|sha256-[0-9a-f]{64}"
    + re.escape(PARTIAL_SUFFIX)
    + r"(-[0-9]{1,6})?"
    + r"|sha256:[0-9a-f]{64}"
)
LEGACY = re.compile(r"sha256:([0-9a-f]{64})")
MANIFEST_TEMP = re.compile(re.escape(TEMP_PREFIX) + r"[A-Za-z0-9_-]{1,100}")


def references(tree: ManifestTree) -> tuple[set[str], list[str]]:
    """Digests referenced by any manifest, and the manifests that could not be read."""
    referenced: set[str] = set()
    problems: list[str] = []
    for name, path in tree.files():
        if name is None:
            continue
        try:
            referenced |= tree.load(name).manifest.digests()
        except (ModelhubError, OSError) as exc:
            problems.append(f"{path.relative_to(tree.root).as_posix()}: {exc}")
    return referenced, problems


def unlink_blobs(blobs_dir: Path, digests: set[str]) -> list[str]:
    """Unlink the blobs of ``digests`` (the caller checked nothing references them)."""
    removed = []
    for digest in sorted(digests):
        with contextlib.suppress(FileNotFoundError):
            blob_path_in(blobs_dir, digest).unlink()
            removed.append(digest)
    if removed:
        fsync_dir(blobs_dir)
    return removed


DRAFTING_DIR = "drafting"  # <root>/drafting/<hex of a weights blob>/: what drafting learned


def remove_drafting_state(root: Path, digests: set[str]) -> list[str]:
    """Remove the drafting state of ``digests`` (blobs that are gone or going); returns the
    digests whose state was removed."""
    removed = []
    for digest in sorted(digests):
        if _remove_tree(state_path_in(root / DRAFTING_DIR, digest)):
            removed.append(digest)
    return removed


def remove_orphan_drafting_state(root: Path, blobs_dir: Path) -> list[str]:
    """Remove drafting state whose blob is gone (a runner saved it after its model was removed);
    folders not named by a digest are not ours and are left alone."""
    orphans = set()
    for entry in entries(root / DRAFTING_DIR):
        digest = digest_from_state_name(entry.name)
        if digest is not None and not blob_path_in(blobs_dir, digest).exists():
            orphans.add(digest)
    return remove_drafting_state(root, orphans)


def _remove_tree(path: Path) -> bool:
    """Remove a folder (or whatever is in its place; a link is not followed)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("could not remove the drafting state %s: %s", path, exc)
        return False
    return True


def remove_stale_blobs(blobs_dir: Path, referenced: set[str], cutoff: float) -> list[str]:
    """Unlink unreferenced blobs and debris last modified before ``cutoff``; returns their
    file names, sorted. Only names parsed here are ever unlinked."""
    removed: list[str] = []
    for entry in os.scandir(blobs_dir):
        digest = digest_from_filename(entry.name)
        if digest is not None:
            if digest in referenced:
                continue
            path = blob_path_in(blobs_dir, digest)
        elif DEBRIS.fullmatch(entry.name):
            path = blobs_dir / entry.name
        else:
            continue  # not ours: left alone, reported by verify()
        if is_old_regular_file(path, cutoff):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(entry.name)
    if removed:
        fsync_dir(blobs_dir)
    return sorted(removed)


def clean_manifest_tree(tree: ManifestTree, cutoff: float) -> None:
    """Drop stale manifest temp files (crashed writers) and empty directories."""
    for host in subdirs(tree.root):
        for namespace in subdirs(host):
            for model in subdirs(namespace):
                for entry in entries(model):
                    path = Path(entry.path)
                    if MANIFEST_TEMP.fullmatch(entry.name) and is_old_regular_file(path, cutoff):
                        with contextlib.suppress(FileNotFoundError):
                            path.unlink()
                tree.remove_empty_dirs(model)


def migrate_legacy_names(blobs_dir: Path) -> None:
    """Rename old ``sha256:<hex>`` blob names to ``sha256-<hex>`` (as Ollama does at start)."""
    for entry in entries(blobs_dir):
        match = LEGACY.fullmatch(entry.name)
        if match is None or not entry.is_file(follow_symlinks=False):
            continue
        target = blob_path_in(blobs_dir, "sha256:" + match.group(1))
        if not target.exists():
            with contextlib.suppress(FileNotFoundError):
                os.rename(entry.path, target)


def is_old_regular_file(path: Path, cutoff: float) -> bool:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff


WORK_DIR = "tmp"  # the store's work area: <root>/tmp/<what>-<pid>-<random>
_WORK_ENTRY = re.compile(r"^[a-z]+-(?P<pid>[0-9]+)-[0-9a-f]+$")


def clean_work_area(root: Path, cutoff: float) -> list[str]:
    """Remove what long writes (quantizing, ...) left in the work area when their process died:
    an entry whose process is gone, one not named by ``work_dir``, or one of the hidden
    ``.quantize-*`` folders older versions left at the root, older than ``cutoff``."""
    removed = []
    work = [Path(e.path) for e in entries(root / WORK_DIR)]
    legacy = [Path(e.path) for e in entries(root) if e.name.startswith(".quantize-")]
    for path in work + legacy:
        named = _WORK_ENTRY.match(path.name) if path.parent.name == WORK_DIR else None
        if named is not None and _alive(int(named.group("pid"))):
            continue
        if named is None and not _older(path, cutoff):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _older(path: Path, cutoff: float) -> bool:
    try:
        return path.lstat().st_mtime < cutoff
    except FileNotFoundError:
        return False
