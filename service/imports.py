"""Fetching a profile to import, from an allow-listed https URL or a file in the import directory.

An import makes this server fetch what a client names, so every step is checked against a
policy rather than trusted: the scheme, the host (an operator's allow-list), every address the
host resolves to (no private, loopback, link-local or reserved networks), every redirect hop,
the content type, the size while streaming, and the time taken. The connection goes to the
address that was checked, with the host name sent as Host header and TLS server name, so a DNS
answer that changes between the check and the connect (rebinding) cannot redirect the fetch.
"""

import ipaddress
import os
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Final

import httpx

from service.errors import (
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
from service.settings import Settings

ALLOWED_CONTENT_TYPES: Final = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "application/json", "text/plain"}
)
REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
CHUNK_BYTES: Final = 16 * 1024

Resolver = Callable[[str, int], list[str]]


def resolve_host(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for ``host``."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class UrlPolicy:
    """What a URL import may fetch. ``allow_loopback`` exists for tests that serve a profile
    from a local TLS server; it is a parameter, never a setting, and off by default."""

    allowed_hosts: frozenset[str]
    max_bytes: int = 100_000
    timeout_s: float = 10.0
    max_redirects: int = 5
    allow_loopback: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> "UrlPolicy":
        return cls(
            allowed_hosts=frozenset(host.lower() for host in settings.import_allowed_hosts),
            max_bytes=settings.import_max_bytes,
            timeout_s=settings.import_timeout_s,
            max_redirects=settings.import_max_redirects,
        )

    def address_ok(self, raw: str) -> bool:
        address = ipaddress.ip_address(raw.split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if self.allow_loopback and address.is_loopback:
            return True
        return address.is_global and not address.is_multicast


def _parse(raw: str) -> httpx.URL:
    try:
        return httpx.URL(raw)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ImportSchemeRefused(f"not a URL: {raw!r}", {"url": raw}) from exc


def _ascii_host(url: httpx.URL) -> str:
    """The host as DNS and TLS see it (IDNA), whichever form the allow-list uses."""
    return url.raw_host.decode("ascii").lower()


def _check_url(url: httpx.URL, policy: UrlPolicy) -> None:
    if url.scheme != "https":
        raise ImportSchemeRefused(
            f"only https URLs can be imported, not {url.scheme or 'no scheme'!r}",
            {"url": str(url), "scheme": url.scheme},
        )
    if url.userinfo:
        raise ImportSchemeRefused("URLs with credentials are refused", {"host": url.host})
    if {url.host.lower(), _ascii_host(url)}.isdisjoint(policy.allowed_hosts):
        raise ImportHostNotAllowed(
            f"host {url.host!r} is not on the import allow-list",
            {"host": url.host, "allowed": sorted(policy.allowed_hosts)},
        )


def _checked_address(url: httpx.URL, policy: UrlPolicy, resolver: Resolver) -> str:
    """One address to connect to; refused if any address of the host is not public, since
    the system could otherwise pick a private one on a later connection."""
    port = url.port or 443
    try:
        addresses = resolver(_ascii_host(url), port)
    except OSError as exc:
        raise ImportFetchFailed(f"cannot resolve {url.host!r}", {"host": url.host}) from exc
    if not addresses:
        raise ImportFetchFailed(f"cannot resolve {url.host!r}", {"host": url.host})
    refused = [address for address in addresses if not policy.address_ok(address)]
    if refused:
        raise ImportAddressRefused(
            f"host {url.host!r} resolves to a non-public address",
            {"host": url.host, "addresses": refused},
        )
    return addresses[0]


def _media_type(response: httpx.Response) -> str:
    raw: str = response.headers.get("content-type", "")
    return raw.split(";", 1)[0].strip().lower()


def _read_capped(response: httpx.Response, policy: UrlPolicy, deadline: float) -> bytes:
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


def _redirect_target(url: httpx.URL, response: httpx.Response, policy: UrlPolicy) -> httpx.URL:
    location = response.headers.get("location")
    if not location:
        raise ImportFetchFailed("a redirect without a Location", {"status": response.status_code})
    target = url.join(location)
    try:
        _check_url(target, policy)
    except (ImportSchemeRefused, ImportHostNotAllowed) as exc:
        raise ImportRedirectRefused(
            f"redirect to {target.host or location!r} refused: {exc.message}",
            {"location": str(target)},
        ) from exc
    return target


def _get(
    client: httpx.Client, url: httpx.URL, address: str, policy: UrlPolicy, deadline: float
) -> tuple[httpx.URL | None, bytes]:
    """One hop: the next URL for a redirect, else the body of the document."""
    host_header = url.netloc.decode("ascii")
    request = client.build_request(
        "GET",
        url.copy_with(host=address),
        headers={"Host": host_header, "Accept": ", ".join(sorted(ALLOWED_CONTENT_TYPES))},
        extensions={"sni_hostname": _ascii_host(url)},
    )
    response = client.send(request, stream=True)
    try:
        if response.status_code in REDIRECT_STATUSES:
            return _redirect_target(url, response, policy), b""
        if response.status_code != 200:
            raise ImportFetchFailed(
                f"{url.host} answered {response.status_code}",
                {"status": response.status_code, "url": str(url)},
            )
        media_type = _media_type(response)
        if media_type not in ALLOWED_CONTENT_TYPES:
            raise ImportContentTypeRefused(
                f"content type {media_type or 'none'!r} is not YAML, JSON or text",
                {"content_type": media_type, "allowed": sorted(ALLOWED_CONTENT_TYPES)},
            )
        return None, _read_capped(response, policy, deadline)
    finally:
        response.close()


def fetch_url(
    raw_url: str,
    policy: UrlPolicy,
    *,
    resolver: Resolver = resolve_host,
    verify: ssl.SSLContext | bool = True,
) -> str:
    """The text of the document at ``raw_url``, following allowed redirects by hand."""
    if not policy.allowed_hosts:
        raise ImportsDisabled("imports from URLs are disabled (no allowed hosts)", {})
    url = _parse(raw_url)
    _check_url(url, policy)
    deadline = time.monotonic() + policy.timeout_s
    timeout = httpx.Timeout(policy.timeout_s)
    with httpx.Client(
        verify=verify, timeout=timeout, follow_redirects=False, trust_env=False
    ) as client:
        for _ in range(policy.max_redirects + 1):
            address = _checked_address(url, policy, resolver)
            try:
                next_url, body = _get(client, url, address, policy, deadline)
            except httpx.TimeoutException as exc:
                raise ImportTimeout(
                    f"the fetch took longer than {policy.timeout_s}s", {"url": str(url)}
                ) from exc
            except httpx.HTTPError as exc:
                raise ImportFetchFailed(
                    f"fetching {url.host} failed: {exc}", {"url": str(url)}
                ) from exc
            if next_url is None:
                return _decode(body)
            url = next_url
    raise ImportRedirectRefused(
        f"more than {policy.max_redirects} redirects", {"limit": policy.max_redirects}
    )


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
