"""Garbage collection of the store: which blobs manifests reference, unlinking the others, and
clearing debris (temp files, download partials, legacy names, empty manifest directories).

These functions take no lock; :class:`~modelhub.store.Store` holds its lock around them and
decides, failing closed, whether anything may be deleted (STO-09).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

from modelhub.errors import ModelhubError
from modelhub.store.blobs import PARTIAL_SUFFIX, TEMP_PREFIX, fsync_dir
from modelhub.store.digests import blob_path_in, digest_from_filename
from modelhub.store.manifest_tree import ManifestTree, entries, subdirs

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
