"""Content-addressed model store: names, digests, blobs, manifests and the store itself."""

from modelhub.errors import ManifestFormatError
from modelhub.store.blobs import BlobWriter
from modelhub.store.digests import (
    blob_filename,
    blob_path_in,
    digest_from_filename,
    parse_digest,
    sha256_file,
)
from modelhub.store.manifests import (
    MEDIA_ADAPTER,
    MEDIA_CONFIG,
    MEDIA_DRAFT,
    MEDIA_LICENSE,
    MEDIA_MANIFEST,
    MEDIA_MESSAGES,
    MEDIA_MODEL,
    MEDIA_PARAMS,
    MEDIA_PROJECTOR,
    MEDIA_PROMPT,
    MEDIA_SYSTEM,
    MEDIA_TEMPLATE,
    Layer,
    Manifest,
)
from modelhub.store.names import (
    DEFAULT_HOST,
    DEFAULT_NAMESPACE,
    DEFAULT_TAG,
    ModelName,
    parse_name,
)
from modelhub.store.store import Store, StoredModel

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_NAMESPACE",
    "DEFAULT_TAG",
    "MEDIA_ADAPTER",
    "MEDIA_CONFIG",
    "MEDIA_DRAFT",
    "MEDIA_LICENSE",
    "MEDIA_MANIFEST",
    "MEDIA_MESSAGES",
    "MEDIA_MODEL",
    "MEDIA_PARAMS",
    "MEDIA_PROJECTOR",
    "MEDIA_PROMPT",
    "MEDIA_SYSTEM",
    "MEDIA_TEMPLATE",
    "BlobWriter",
    "Layer",
    "Manifest",
    "ManifestFormatError",
    "ModelName",
    "Store",
    "StoredModel",
    "blob_filename",
    "blob_path_in",
    "digest_from_filename",
    "parse_digest",
    "parse_name",
    "sha256_file",
]
