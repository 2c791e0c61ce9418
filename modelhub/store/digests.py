"""Digests and the digest -> path mappings (SEC-01, SEC-02).

A digest reaches a file name only through :func:`blob_path_in` (a blob) and
:func:`state_path_in` (the drafting state kept for a weights blob), which accept nothing but
``sha256:`` followed by 64 lowercase hex characters and check that the result stays inside
their directory. No other module may join a digest onto a path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from modelhub.errors import InvalidDigestError

CHUNK_SIZE = 1 << 20  # 1 MiB: large enough for throughput, small enough for steady memory

_STRICT = re.compile(r"sha256:[0-9a-f]{64}")
_LENIENT = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
_BLOB_NAME = re.compile(r"sha256-([0-9a-f]{64})")
_HEX = re.compile(r"[0-9a-f]{64}")


def _shown(text: object) -> str:
    """A digest candidate as it appears in an error message: quoted, escaped, shortened."""
    if not isinstance(text, str):
        return f"<{type(text).__name__}>"
    shown = text if len(text) <= 100 else text[:97] + "..."
    return json.dumps(shown, ensure_ascii=True)


def parse_digest(text: str, *, lenient: bool = False) -> str:
    """Return ``text`` as a canonical ``sha256:<64 lowercase hex>`` digest or raise InvalidDigest.

    Strict mode (manifests, uploads) returns the input unchanged when it is already canonical.
    Lenient mode (``HEAD /api/blobs``, legacy file names) also takes ``sha256-`` and
    upper-case hex and normalises them.
    """
    if isinstance(text, str):
        if _STRICT.fullmatch(text):
            return text
        if lenient:
            match = _LENIENT.fullmatch(text)
            if match:
                return "sha256:" + match.group(1).lower()
    raise InvalidDigestError(
        f"invalid digest format: {_shown(text)} "
        '(expected "sha256:" followed by 64 lowercase hexadecimal characters)'
    )


def blob_filename(digest: str) -> str:
    """The file name a (strict) digest is stored under: ``sha256-<hex>``."""
    return "sha256-" + parse_digest(digest)[len("sha256:") :]


def digest_from_filename(name: str) -> str | None:
    """The digest a final blob file name stands for, or None when the name is anything else."""
    match = _BLOB_NAME.fullmatch(name)
    return "sha256:" + match.group(1) if match else None


def blob_path_in(blobs_dir: Path, digest: str) -> Path:
    """The path of ``digest``'s blob inside ``blobs_dir``; the only digest -> path function."""
    path = blobs_dir / blob_filename(digest)
    # The grammar already rules out separators and dots; this guards against a regression.
    # The file itself is not resolved: a blob that is a symlink is the user's choice.
    if path.parent != blobs_dir:
        raise InvalidDigestError(
            f"invalid digest format: {_shown(digest)} (escapes the blob store)"
        )
    return path


def state_path_in(state_dir: Path, digest: str) -> Path:
    """The folder named by ``digest``'s hex inside ``state_dir`` (``<state_dir>/<64 hex>``)."""
    path = state_dir / parse_digest(digest)[len("sha256:") :]
    if path.parent != state_dir:  # as in blob_path_in: a guard against a regression
        raise InvalidDigestError(f"invalid digest format: {_shown(digest)} (escapes the store)")
    return path


def digest_from_state_name(name: str) -> str | None:
    """The digest a state folder name (64 lowercase hex) stands for, or None."""
    return "sha256:" + name if _HEX.fullmatch(name) else None


def sha256_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    """Hash a file in 1 MiB chunks; returns (``sha256:<hex>``, size in bytes)."""
    hasher = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_SIZE):
            hasher.update(chunk)
            size += len(chunk)
    return "sha256:" + hasher.hexdigest(), size
