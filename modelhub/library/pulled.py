"""Models pulled as bare GGUF files become models here: the create service over their blobs."""

from __future__ import annotations

from modelhub.errors import GGUFError, InputError
from modelhub.gguf.info import is_gguf
from modelhub.gguf.projector import is_projector
from modelhub.library.create import CreateRequest, Creator
from modelhub.library.views import ModelViews
from modelhub.pull.base import Progress, ProgressEvent
from modelhub.pull.single import FetchedModel, Installer
from modelhub.store import Store

# Statuses of the create service that also belong in a pull's stream (besides its warnings).
_FORWARDED = frozenset({"writing manifest"})


def installer(store: Store) -> Installer:
    """What ``pull_model`` calls to write the manifest of a single-file pull into ``store``."""

    def install(fetched: FetchedModel, progress: Progress) -> None:
        def forward(event: ProgressEvent) -> None:
            if event.warning is not None or event.status in _FORWARDED:
                progress(event)

        views = ModelViews(store)
        for fname, digest in fetched.projectors.items():
            _check_projector_file(store, views, fname, digest)
        request = CreateRequest(
            model=fetched.name,
            files={**fetched.files, **fetched.projectors},
            draft_files=dict(fetched.drafts),
            draft_sidecar=bool(fetched.drafts),
            template=fetched.template,
            parameters=dict(fetched.parameters),
        )
        Creator(store, views, forward).run(request)

    return install


def _check_projector_file(store: Store, views: ModelViews, fname: str, digest: str) -> None:
    """A file a pull took for a projector by its name must be one (create would take any
    other GGUF for weights)."""
    path = store.blob_path(digest)
    try:
        ok = is_gguf(path) and is_projector(views.gguf_info(digest))
    except GGUFError:
        ok = False
    if not ok:
        raise InputError(f"{fname}: not a projector GGUF (architecture clip)")
