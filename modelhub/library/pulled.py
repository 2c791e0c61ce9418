"""Models pulled as bare GGUF files become models here: the create service over their blobs."""

from __future__ import annotations

from typing import Any

from modelhub.library.create import CreateRequest, Creator
from modelhub.library.views import ModelViews
from modelhub.pull.base import Progress
from modelhub.pull.single import FetchedModel, Installer
from modelhub.store import Store

# Statuses of the create service that also belong in a pull's stream.
_FORWARDED = ("writing manifest", "warning")


def installer(store: Store) -> Installer:
    """What ``pull_model`` calls to write the manifest of a single-file pull into ``store``."""

    def install(fetched: FetchedModel, progress: Progress) -> None:
        def forward(item: dict[str, Any]) -> None:
            if str(item.get("status", "")).startswith(_FORWARDED):
                progress(item)

        request = CreateRequest(
            model=fetched.name,
            files=dict(fetched.files),
            draft_files=dict(fetched.drafts),
            draft_sidecar=bool(fetched.drafts),
            template=fetched.template,
            parameters=dict(fetched.parameters),
        )
        Creator(store, ModelViews(store), forward).run(request)

    return install
