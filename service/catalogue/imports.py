"""Fetching a profile to import, from an allow-listed https URL or a file in the import directory.

An import makes this server fetch what a client names, so it goes through the egress policy
every step's request goes through (``service.platform.egress``: every address the host resolves to
public unless the operator opened it, the connection pinned to the checked address, every
redirect hop checked), with a stricter allow-list of its own and https only. On top of that
only YAML, JSON or text is read, within a size cap while streaming and a time limit.
Refusals keep the import codes and HTTP statuses clients already know.
"""

import os
import ssl
import time
from dataclasses import replace
from pathlib import Path, PurePath
from typing import Final

import httpx

from service.platform.egress import EgressPolicy, Resolver, guarded_client, host_key, resolve_host
from service.platform.errors import (
    EgressAddressRefused,
    EgressHostNotAllowed,
    EgressRedirectRefused,
    EgressSchemeRefused,
)
from service.platform.errors.imports import (
    ImportAddressRefused,
    ImportContentTypeRefused,
    ImportFetchFailed,
    ImportHostNotAllowed,
    ImportNotFound,
    ImportPathRefused,
    ImportRedirectRefused,
    ImportSchemeRefused,
    ImportsDisabled,
    ImportTimeout,
    ImportTooLarge,
)
from service.platform.settings import Settings

ALLOWED_CONTENT_TYPES: Final = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "application/json", "text/plain"}
)
CHUNK_BYTES: Final = 16 * 1024


def import_policy(settings: Settings) -> EgressPolicy:
    """The deployment's egress policy with the import allow-list (within the deployment's, when
    it has one), https only whatever ``FLOWBEAT_EGRESS_ALLOW_HTTP`` says, and the import limits.
    The operator's internal hosts stay open, as for every other outbound request."""
    egress = EgressPolicy.from_settings(settings)
    allowed = frozenset(map(host_key, settings.import_allowed_hosts))
    if egress.allowed_hosts is not None:
        allowed &= egress.allowed_hosts
    return replace(
        egress,
        allow_http=False,
        allowed_hosts=allowed,
        max_redirects=settings.import_max_redirects,
        timeout_s=settings.import_timeout_s,
        max_bytes=settings.import_max_bytes,
    )


def _parse(raw: str) -> httpx.URL:
    try:
        return httpx.URL(raw)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ImportSchemeRefused(f"not a URL: {raw!r}", {"url": raw}) from exc


def _check_url(url: httpx.URL, policy: EgressPolicy) -> None:
    try:
        policy.check_url(url)
    except EgressSchemeRefused as exc:
        raise ImportSchemeRefused(
            f"only https URLs without credentials can be imported: {exc.message}", exc.details
        ) from exc
    except EgressHostNotAllowed as exc:
        raise ImportHostNotAllowed(
            f"host {url.host!r} is not on the import allow-list", exc.details
        ) from exc
    except EgressAddressRefused as exc:
        raise ImportAddressRefused(exc.message, exc.details) from exc


def _media_type(response: httpx.Response) -> str:
    raw: str = response.headers.get("content-type", "")
    return raw.split(";", 1)[0].strip().lower()


def _read_capped(response: httpx.Response, policy: EgressPolicy, deadline: float) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
        raise ImportTooLarge(
            f"the document is {declared} bytes, the limit is {policy.max_bytes}",
            {"limit": policy.max_bytes},
        )
    body = bytearray()
    for chunk in response.iter_bytes(CHUNK_BYTES):
        body += chunk
        if len(body) > policy.max_bytes:
            raise ImportTooLarge(
                f"the document exceeds {policy.max_bytes} bytes", {"limit": policy.max_bytes}
            )
        if time.monotonic() > deadline:
            raise ImportTimeout(f"the fetch took longer than {policy.timeout_s}s", {})
    return bytes(body)


def _decode(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportContentTypeRefused("the document is not UTF-8 text", {}) from exc


def _document(response: httpx.Response, policy: EgressPolicy, deadline: float) -> bytes:
    if response.status_code != 200:
        raise ImportFetchFailed(
            f"{response.url.host} answered {response.status_code}",
            {"status": response.status_code, "url": str(response.url)},
        )
    media_type = _media_type(response)
    if media_type not in ALLOWED_CONTENT_TYPES:
        raise ImportContentTypeRefused(
            f"content type {media_type or 'none'!r} is not YAML, JSON or text",
            {"content_type": media_type, "allowed": sorted(ALLOWED_CONTENT_TYPES)},
        )
    return _read_capped(response, policy, deadline)


def fetch_url(
    raw_url: str,
    policy: EgressPolicy,
    *,
    resolver: Resolver = resolve_host,
    ssl_context: ssl.SSLContext | None = None,
) -> str:
    """The text of the document at ``raw_url``; ``policy`` comes from ``import_policy``."""
    if not policy.allowed_hosts:
        raise ImportsDisabled("imports from URLs are disabled (no allowed hosts)", {})
    url = _parse(raw_url)
    _check_url(url, policy)
    deadline = time.monotonic() + policy.timeout_s
    accept = {"Accept": ", ".join(sorted(ALLOWED_CONTENT_TYPES))}
    try:
        with (
            guarded_client(policy, resolver=resolver, ssl_context=ssl_context) as client,
            client.stream("GET", url, headers=accept) as response,
        ):
            return _decode(_document(response, policy, deadline))
    except EgressRedirectRefused as exc:
        raise ImportRedirectRefused(exc.message, exc.details) from exc
    except EgressAddressRefused as exc:
        raise ImportAddressRefused(exc.message, exc.details) from exc
    except httpx.TimeoutException as exc:
        raise ImportTimeout(
            f"the fetch took longer than {policy.timeout_s}s", {"url": str(url)}
        ) from exc
    except httpx.HTTPError as exc:
        raise ImportFetchFailed(f"fetching {url.host} failed: {exc}", {"url": str(url)}) from exc


def read_import_file(raw_path: str, import_dir: Path | None, max_bytes: int) -> str:
    """The text of a regular file inside ``import_dir``. The path is refused when it climbs
    (``..``), and after symlinks are resolved it must still lie inside the directory."""
    if import_dir is None:
        raise ImportsDisabled("imports from files are disabled (no import directory)", {})
    if not raw_path or "\x00" in raw_path or ".." in PurePath(raw_path).parts:
        raise ImportPathRefused(f"path {raw_path!r} is refused", {"path": raw_path})
    root = import_dir.resolve()
    target = (root / raw_path).resolve()
    if not target.is_relative_to(root):
        raise ImportPathRefused(
            f"path {raw_path!r} lies outside the import directory", {"path": raw_path}
        )
    if not target.exists():
        raise ImportNotFound(f"no file {raw_path!r} in the import directory", {"path": raw_path})
    if not target.is_file():
        raise ImportPathRefused(f"{raw_path!r} is not a regular file", {"path": raw_path})
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ImportPathRefused(f"{raw_path!r} cannot be opened", {"path": raw_path}) from exc
    with os.fdopen(fd, "rb") as handle:
        body = handle.read(max_bytes + 1)
    if len(body) > max_bytes:
        raise ImportTooLarge(
            f"{raw_path!r} exceeds {max_bytes} bytes", {"path": raw_path, "limit": max_bytes}
        )
    return _decode(body)
