"""Hugging Face GGUF repositories: ``hf.co/<org>/<repo>[:<quant>]``.

The repo's file list (with the sha256 and size Hugging Face records for LFS files) is read
from ``$HF_ENDPOINT/api/models/<repo>?blobs=true``; the quant tag picks a GGUF by name, with
a default order when no tag is given. Files are fetched from ``/<repo>/resolve/<commit>/``
so that every part of one pull comes from the same commit. ``HF_TOKEN`` is sent to the
endpoint's origin only, never to the CDN it redirects to.

A drafter the repo ships beside the weights (a "sidecar", recognised by the names repos give
them: see :func:`draft_rank`) is pulled too, unless the caller says not to, and attached as the
model's draft. A projector (``mmproj-*.gguf``, as llama.cpp's ``-hf`` and Ollama's HF pulls
find it) beside the chosen weights is pulled too and becomes the model's projector layer (see
:func:`choose_projector`); an importance matrix is neither weights, draft nor projector.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from modelhub.errors import InputError, ModelhubError, NotFoundError, SourceUnavailableError
from modelhub.pull.base import DownloadPolicy
from modelhub.pull.fetch import HttpBlobSource
from modelhub.pull.http import HttpClient, describe_error
from modelhub.pull.single import FileToFetch, SingleFilePlan, partial_key
from modelhub.pull.transfers import HttpJob, Job
from modelhub.store import ModelName, Store, parse_digest, parse_name

HF_HOSTS = ("hf.co", "huggingface.co")
DEFAULT_ENDPOINT = "https://huggingface.co"
LISTING_LIMIT = 16 << 20
# Picked in this order when the reference names no quant.
DEFAULT_QUANTS = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "Q5_K_M", "Q6_K", "Q8_0", "F16", "BF16")
_REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:I?Q\d[A-Z0-9_]*?|F16|BF16|F32))(?=[.-]|\.gguf$)", re.I)
# Sidecar drafters by name, in the order one is chosen when a repo has several kinds (llama.cpp
# prefers MTP, then DFlash, then EAGLE-3; a Gemma 4 assistant is an MTP drafter; a plain draft
# model comes last). Matched on the path in the repo, ignoring case.
_DRAFT_NAMES = (
    re.compile(r"(^|/)mtp[-_./]", re.IGNORECASE),  # mtp-*.gguf, MTP/*.gguf (not *-MTP-*: heads)
    re.compile(r"assistant", re.IGNORECASE),  # gemma-4-*-assistant-*.gguf
    re.compile(r"dflash", re.IGNORECASE),  # dflash-*.gguf, *-DFlash-*.gguf
    re.compile(r"eagle-?3", re.IGNORECASE),  # eagle3-*.gguf, *-EAGLE3-*.gguf
    re.compile(r"(?<![a-z0-9])draft", re.IGNORECASE),  # *-draft-*.gguf, draft-*.gguf
)
_NOT_A_MODEL = re.compile(r"mmproj|imatrix", re.IGNORECASE)
_PROJECTOR = re.compile(r"mmproj", re.IGNORECASE)
# a projector's precision when the repo has none of the weights' quant: the converters' default
# (F16) first, then the other unquantised ones
PROJECTOR_QUANTS = ("F16", "BF16", "F32", "Q8_0")


@dataclass(frozen=True)
class HFRef:
    repo: str  # org/name
    quant: str | None
    name: ModelName  # where the model is stored: hf.co/<org>/<repo>:<quant or latest>


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int | None
    sha256: str | None  # "sha256:<hex>" for LFS files


def parse_hf_ref(ref: str) -> HFRef | None:
    """Parse ``[https://]hf.co/<org>/<repo>[:<quant>]``; None when it is not a HF reference."""
    text = ref.strip()
    for scheme in ("https://", "http://"):
        if text.lower().startswith(scheme):
            text = text[len(scheme) :]
    host, _, rest = text.partition("/")
    if host.lower() not in HF_HOSTS:
        return None
    repo, quant = rest, None
    if ":" in rest:
        repo, _, quant = rest.rpartition(":")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(part) for part in parts):
        raise InputError(
            f"invalid Hugging Face reference {ref!r}: expected hf.co/<org>/<repo>[:<quant>]"
        )
    try:
        name = parse_name(f"hf.co/{repo}:{quant or 'latest'}")
    except ModelhubError as exc:
        raise InputError(f"cannot store {ref!r} under a model name: {exc}") from exc
    return HFRef(repo, quant or None, name)


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token_credentials() -> dict[str, str]:
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    return {"Authorization": f"Bearer {token.strip()}"} if token and token.strip() else {}


def list_repo(client: HttpClient, repo: str) -> tuple[str, list[RepoFile]]:
    """The repo's commit and files, from the Hub API."""
    url = f"{endpoint()}/api/models/{repo}?blobs=true"
    try:
        response, body = client.get_bounded(
            url, LISTING_LIMIT, "repository listing", credentials=token_credentials()
        )
    except httpx.HTTPError as exc:
        raise SourceUnavailableError(
            f"hf.co/{repo}: cannot list the repository: {describe_error(exc)}"
        ) from exc
    if response.status_code in (401, 403, 404):
        hint = "" if token_credentials() else " (a private or gated repo needs HF_TOKEN)"
        raise NotFoundError(f"hf.co/{repo}: repository not found or not accessible{hint}")
    if response.status_code >= 400:
        raise SourceUnavailableError(
            f"hf.co/{repo}: listing failed with HTTP {response.status_code}"
        )
    try:
        doc: Any = json.loads(body)
    except ValueError as exc:
        raise SourceUnavailableError(f"hf.co/{repo}: the listing is not JSON") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("siblings"), list):
        raise SourceUnavailableError(f"hf.co/{repo}: unexpected listing format")
    revision = doc.get("sha") if isinstance(doc.get("sha"), str) else "main"
    return str(revision), [f for f in map(_repo_file, doc["siblings"]) if f is not None]


def _repo_file(doc: Any) -> RepoFile | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("rfilename"), str):
        return None
    lfs: dict[str, Any] = doc["lfs"] if isinstance(doc.get("lfs"), dict) else {}
    size = lfs.get("size", doc.get("size"))
    sha = lfs.get("sha256") or lfs.get("oid")
    digest = None
    if isinstance(sha, str):
        try:
            digest = parse_digest("sha256:" + sha.lower())
        except ModelhubError:
            digest = None
    return RepoFile(doc["rfilename"], size if type(size) is int and size >= 0 else None, digest)


def quant_of(path: str) -> str | None:
    match = _QUANT.search(os.path.basename(_SPLIT.sub(".gguf", path)))
    return match.group(1).upper() if match else None


def draft_rank(path: str) -> int | None:
    """Which kind of sidecar drafter a repo file is by its name (lower ranks are preferred), or
    None for anything else."""
    if not path.lower().endswith(".gguf") or _NOT_A_MODEL.search(path):
        return None
    return next((rank for rank, name in enumerate(_DRAFT_NAMES) if name.search(path)), None)


def choose_draft(drafts: list[RepoFile], quant: str | None) -> RepoFile | None:
    """The sidecar to attach to weights of ``quant``: of the preferred kind, the file of that
    quant, else one that names no quant, else the first in :data:`DEFAULT_QUANTS` order."""
    ranks = {d.path: rank for d in drafts if (rank := draft_rank(d.path)) is not None}
    usable = [d for d in drafts if d.path in ranks and not _SPLIT.search(d.path)]
    if not usable:
        return None
    best = min(ranks[d.path] for d in usable)
    candidates = [d for d in usable if ranks[d.path] == best]

    def preference(file: RepoFile) -> tuple[int, str]:
        own = quant_of(file.path)
        if own == quant:
            return 0, file.path
        if own is None:
            return 1, file.path
        order = DEFAULT_QUANTS.index(own) if own in DEFAULT_QUANTS else len(DEFAULT_QUANTS)
        return 2 + order, file.path

    return min(candidates, key=preference)


def choose_files(
    files: list[RepoFile], quant: str | None, repo: str
) -> tuple[RepoFile, RepoFile | None]:
    """The GGUF for ``quant`` (or the default one) and a sidecar drafter, if the repo has one."""
    ggufs = [f for f in files if f.path.lower().endswith(".gguf")]
    drafts = [f for f in ggufs if draft_rank(f.path) is not None]
    weights = [f for f in ggufs if f not in drafts and not _NOT_A_MODEL.search(f.path)]
    if not weights and drafts:  # a repo of drafters only: pulled as a model of its own
        weights, drafts = drafts, []
    if not weights:
        raise NotFoundError(f"hf.co/{repo}: the repository has no GGUF model files")
    available = sorted({q for q in map(quant_of, (w.path for w in weights)) if q})
    if quant is None and len({_SPLIT.sub(".gguf", w.path) for w in weights}) == 1:
        chosen = weights
    else:
        wanted = [quant.upper()] if quant else [q for q in DEFAULT_QUANTS if q in available]
        if not wanted:
            raise InputError(
                f"hf.co/{repo} has several GGUF files; name one with a tag, e.g. "
                f"hf.co/{repo}:{available[0] if available else 'Q4_K_M'}"
            )
        chosen = [w for w in weights if quant_of(w.path) == wanted[0]]
        if not chosen:
            shown = ", ".join(available) or "none recognised"
            raise NotFoundError(
                f"hf.co/{repo}: no GGUF file for quant {wanted[0]} (available: {shown})"
            )
    chosen.sort(key=lambda f: (f.path.count("/"), f.path))
    first = chosen[0]
    if _SPLIT.search(first.path):
        raise InputError(
            f"hf.co/{repo}: the {quant_of(first.path)} weights are split into several GGUF "
            f"files ({os.path.basename(first.path)}, ...); split GGUFs are not supported yet, "
            f"choose another quant (available: {', '.join(available)})"
        )
    return first, choose_draft(drafts, quant_of(first.path))


def choose_projector(files: list[RepoFile], weights: str) -> RepoFile | None:
    """The ``mmproj`` GGUF to attach to the weights at path ``weights``: one in the same folder
    (else anywhere), of the weights' quant, else of the first of :data:`PROJECTOR_QUANTS`,
    else one naming no quant, else the first by name; None when the repo has none."""
    projectors = [
        f
        for f in files
        if f.path.lower().endswith(".gguf")
        and _PROJECTOR.search(os.path.basename(f.path))
        and not _SPLIT.search(f.path)
    ]
    if not projectors:
        return None
    folder = os.path.dirname(weights)
    quant = quant_of(weights)

    def preference(file: RepoFile) -> tuple[int, int, str]:
        own = quant_of(file.path)
        if own is not None and own == quant:
            rank = 0
        elif own in PROJECTOR_QUANTS:
            rank = 1 + PROJECTOR_QUANTS.index(own)
        else:
            rank = 1 + len(PROJECTOR_QUANTS) + (own is not None)
        return (os.path.dirname(file.path) != folder, rank, file.path)

    return min(projectors, key=preference)


def hf_plan(
    client: HttpClient,
    ref: HFRef,
    *,
    pin: tuple[str, int] | None = None,
    name: ModelName | None = None,
    with_draft: bool = True,
) -> SingleFilePlan:
    """Resolve a HF reference to the files to fetch (checked against ``pin`` if given); the
    sidecar drafter is left out when not ``with_draft``."""
    revision, files = list_repo(client, ref.repo)
    weights, draft = choose_files(files, ref.quant, ref.repo)
    notes = []
    if draft is not None and not with_draft:
        notes.append(f"not pulling the drafter {draft.path} (no_draft)")
        draft = None
    if pin is not None and weights.sha256 not in (None, pin[0]):
        raise SourceUnavailableError(
            f"hf.co/{ref.repo}: {weights.path} has sha256 {weights.sha256}, "
            f"the catalog pins {pin[0]}"
        )
    model = _fetch(client, ref.repo, revision, weights, pin)
    projector = choose_projector(files, weights.path)
    return SingleFilePlan(
        name=name or ref.name,
        model=model,
        draft=_fetch(client, ref.repo, revision, draft, None) if draft else None,
        projector=_fetch(client, ref.repo, revision, projector, None) if projector else None,
        notes=notes,
    )


def _fetch(
    client: HttpClient, repo: str, revision: str, file: RepoFile, pin: tuple[str, int] | None
) -> FileToFetch:
    expected, size = pin if pin is not None else (file.sha256, file.size)
    if size is None:
        raise SourceUnavailableError(f"hf.co/{repo}: the listing gives no size for {file.path}")
    total = size
    key = partial_key(expected, f"hf:{repo}@{revision}/{file.path}")
    url = f"{endpoint()}/{repo}/resolve/{quote(revision)}/{quote(file.path)}"

    def make_job(store: Store, policy: DownloadPolicy) -> Job:
        source = HttpBlobSource(client, lambda: (url, token_credentials()), label=file.path)
        return HttpJob(store, source, key=key, expected=expected, total=total, policy=policy)

    return FileToFetch(file.path, key, expected, total, make_job)
