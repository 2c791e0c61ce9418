"""The Ollama registry transport (OCI distribution v2): manifests, blobs, bearer tokens.

Registry URLs are https unless the pull is insecure. A blob request is not followed across
hosts: its redirect ``Location`` (or, for a registry that serves bodies itself, the blob URL)
becomes the direct URL that the ranged parts fetch, without the registry's credentials
unless it is on the registry's own origin (SEC-12). A 401 is answered once with an anonymous
bearer token from the challenge's realm, which must be on the registry's host.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from urllib.parse import urlencode, urlsplit

import httpx

from modelhub.errors import NotFoundError, SourceUnavailableError, UnauthorizedError
from modelhub.pull.base import TransientError
from modelhub.pull.fetch import Resolved
from modelhub.pull.http import (
    REDIRECT_CODES,
    HttpClient,
    describe_error,
    error_body,
    error_message,
    origin,
    read_limited,
)
from modelhub.store import MEDIA_MANIFEST, Manifest, ModelName
from modelhub.store.manifests import MAX_MANIFEST_BYTES

TOKEN_LIMIT = 64 << 10
MANIFEST_NOT_FOUND = "pull model manifest: file does not exist"  # the CLIs key on this text
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryClient:
    """Speaks the subset of the distribution API a pull needs, for one repository."""

    def __init__(self, client: HttpClient, name: ModelName, *, insecure: bool = False) -> None:
        self.client = client
        self.name = name
        self.base = f"{'http' if insecure else 'https'}://{name.host}"
        self.repository = f"{name.namespace}/{name.model}"
        self._token: str | None = None

    @property
    def manifest_url(self) -> str:
        return f"{self.base}/v2/{self.repository}/manifests/{self.name.tag}"

    def blob_url(self, digest: str) -> str:
        return f"{self.base}/v2/{self.repository}/blobs/{digest}"

    def credentials(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    # ----- manifest ------------------------------------------------------------------------

    def fetch_manifest(self) -> tuple[Manifest, bytes]:
        """The manifest and its verbatim bytes; every digest in it is validated (SEC-01)."""
        url = self.manifest_url
        try:
            for attempt in range(2):
                headers = {"Accept": MEDIA_MANIFEST}
                with self.client.open(url, headers=headers, credentials=self.credentials()) as r:
                    if r.status_code == 401 and attempt == 0:
                        challenge = r.headers.get("www-authenticate", "")
                    elif r.status_code == 404:
                        raise NotFoundError(MANIFEST_NOT_FOUND)
                    elif r.status_code == 401:
                        raise UnauthorizedError("unauthorized: access denied")
                    elif r.status_code >= 400:
                        message = error_message(r.status_code, error_body(r))
                        raise SourceUnavailableError(f"pull model manifest: {message}")
                    else:
                        raw = read_limited(r, MAX_MANIFEST_BYTES, "manifest")
                        return Manifest.from_json(raw), raw
                self._authenticate(url, challenge)
        except httpx.TransportError as exc:
            raise SourceUnavailableError(
                f"pull model manifest: {self.name.host}: {describe_error(exc)}"
            ) from exc
        raise UnauthorizedError("unauthorized: access denied")

    # ----- blobs ---------------------------------------------------------------------------

    def resolve_blob(self, digest: str) -> Resolved:
        """The direct URL of a blob (and the credentials it may carry)."""
        url = self.blob_url(digest)
        start_kind = self.client.check_start(url)
        try:
            for attempt in range(2):
                # One byte: a registry that serves bodies itself should not send the whole blob.
                headers = {"Range": "bytes=0-0"}
                with self.client.open(
                    url, headers=headers, credentials=self.credentials(), follow=False
                ) as r:
                    location = r.headers.get("location")
                    if r.status_code == 401 and attempt == 0:
                        challenge = r.headers.get("www-authenticate", "")
                    elif r.status_code in REDIRECT_CODES and location:
                        target = self.client.check_redirect(url, location, start_kind)
                        same = origin(target) == origin(url)
                        return target, self.credentials() if same else {}
                    elif r.status_code in (200, 206):
                        return url, self.credentials()  # the registry serves the body itself
                    elif r.status_code >= 500 or r.status_code == 429:
                        raise TransientError(error_message(r.status_code, error_body(r)))
                    elif r.status_code == 401:
                        raise UnauthorizedError("unauthorized: access denied")
                    else:
                        message = error_message(r.status_code, error_body(r))
                        raise SourceUnavailableError(f"pull blob {digest}: {message}")
                self._authenticate(url, challenge)
        except httpx.TransportError as exc:
            raise TransientError(describe_error(exc)) from exc
        raise UnauthorizedError("unauthorized: access denied")

    # ----- auth ----------------------------------------------------------------------------

    def _authenticate(self, url: str, challenge: str) -> None:
        """Get an anonymous bearer token as the 401 challenge says (realm on our host only)."""
        scheme, _, rest = challenge.partition(" ")
        if scheme.lower() != "bearer":
            raise UnauthorizedError(
                "unauthorized: the registry asks for credentials; access denied"
            )
        params = dict(_CHALLENGE_PARAM.findall(rest))
        realm = params.get("realm", "")
        realm_parts, registry_parts = urlsplit(realm), urlsplit(url)
        if realm_parts.scheme not in ("http", "https") or (
            realm_parts.hostname,
            realm_parts.port,
        ) != (registry_parts.hostname, registry_parts.port):
            raise UnauthorizedError(
                f"registry authentication refused: the token realm host "
                f"{realm_parts.netloc or '(none)'} does not match the registry host "
                f"{registry_parts.netloc}"
            )
        query = {k: params[k] for k in ("service", "scope") if k in params}
        query.update(ts=str(int(time.time())), nonce=secrets.token_urlsafe(16))
        separator = "&" if realm_parts.query else "?"
        response, body = self.client.get_bounded(
            realm + separator + urlencode(query), TOKEN_LIMIT, "token response"
        )
        if response.status_code >= 400:
            raise UnauthorizedError(
                f"registry authentication failed: {error_message(response.status_code, body)}"
            )
        try:
            doc = json.loads(body)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise UnauthorizedError("registry authentication failed: no token in the response")
        self._token = token
