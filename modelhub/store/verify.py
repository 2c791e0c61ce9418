"""Checks of the store invariant: every manifest readable and its blobs present with the declared
sizes, nothing unexpected in ``blobs/`` or ``manifests/``, and (slowly) every blob's content
hashing to its name. Each check returns descriptions of the problems it found.
"""

from __future__ import annotations

import os
from pathlib import Path

from modelhub.errors import ModelhubError
from modelhub.store.digests import blob_path_in, digest_from_filename, sha256_file
from modelhub.store.gc import DEBRIS, MANIFEST_TEMP
from modelhub.store.manifest_tree import ManifestTree
from modelhub.store.manifests import Layer, Manifest


def layer_issues(blobs_dir: Path, manifest: Manifest) -> list[tuple[Layer, str]]:
    """The layers (config first) of ``manifest`` whose blob is missing or whose size is not
    the declared one, each with what is wrong. Cheap: one ``stat`` per layer."""
    issues = []
    for layer in [manifest.config, *manifest.layers]:
        try:
            info = blob_path_in(blobs_dir, layer.digest).stat()
        except FileNotFoundError:
            issues.append((layer, f'blob "{layer.digest}" is missing from the store'))
            continue
        if info.st_size != layer.size:
            issues.append(
                (
                    layer,
                    f'blob "{layer.digest}" has {info.st_size} bytes, '
                    f"the manifest declares {layer.size}",
                )
            )
    return issues


def blob_issues(blobs_dir: Path, manifest: Manifest) -> list[str]:
    """Blobs of ``manifest`` that are missing or whose size is not the declared one."""
    return [issue for _layer, issue in layer_issues(blobs_dir, manifest)]


def manifest_problems(tree: ManifestTree, blobs_dir: Path) -> list[str]:
    """Unreadable manifests, their missing or mis-sized blobs, and stray files in the tree."""
    problems: list[str] = []
    for name, path in tree.files():
        where = path.relative_to(tree.root).as_posix()
        if name is None:
            if not MANIFEST_TEMP.fullmatch(path.name):  # a crashed writer's: debris
                problems.append(f"unexpected file in manifests/: {where}")
            continue
        try:
            manifest = tree.load(name).manifest
        except (ModelhubError, OSError) as exc:
            problems.append(f"manifest {where} is unreadable: {exc}")
            continue
        problems.extend(f"manifest {where}: {issue}" for issue in blob_issues(blobs_dir, manifest))
    return problems


def blobs_dir_problems(blobs_dir: Path) -> tuple[list[str], list[str]]:
    """Stray or irregular files in ``blobs/``, and the names of the blob files found."""
    problems: list[str] = []
    blob_names = []
    for entry in os.scandir(blobs_dir):
        if digest_from_filename(entry.name) is not None:
            if not entry.is_file(follow_symlinks=False):
                problems.append(f"blobs/{entry.name} is not a regular file")
            blob_names.append(entry.name)
        elif not DEBRIS.fullmatch(entry.name):
            problems.append(f"unexpected file in blobs/: {entry.name}")
    return problems, blob_names


def rehash_problems(blobs_dir: Path, blob_names: list[str]) -> list[str]:
    """Blobs among ``blob_names`` whose content does not hash to their name."""
    problems: list[str] = []
    for blob_name in sorted(blob_names):
        digest = digest_from_filename(blob_name)
        if digest is None:
            continue
        try:
            actual, _ = sha256_file(blob_path_in(blobs_dir, digest))
        except FileNotFoundError:
            continue  # pruned since the scan
        if actual != digest:
            problems.append(f"blob {digest} is corrupt: its content hashes to {actual}")
    return problems
