"""One outbound request policy for everything a step, a notice, an escalation or an import fetches.

A profile's author chooses URLs, so a request is checked rather than trusted: the scheme
(https, and http only where the operator allows it), the host against the deployment's and the
action's allow-lists, and every address the host resolves to: no loopback, private,
link-local, shared, multicast or reserved address, unless the operator opened that host. The
check happens where the connection is made, in the transport's network backend, so the
connection goes to the very address that was checked (a DNS answer that changes in between
cannot redirect it), every redirect hop is checked like the first request, and numeric
spellings of an address (``2130706433``, ``0x7f.1``) are judged by what they resolve to.
Refusals are permanent step failures with their own codes, never retried.
"""

import functools
import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import httpcore
import httpx

from service.platform import tracing
from service.platform.errors import (
    EgressAddressRefused,
    EgressHostNotAllowed,
    EgressRedirectRefused,
    EgressSchemeRefused,
    NotifyUrlInvalid,
)
from service.platform.settings import Settings

Resolver = Callable[[str, int], list[str]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_MAX_REDIRECTS: Final = 5
EMBEDDING_IPV4: Final = tuple(
    ipaddress.IPv6Network(prefix)
    for prefix in (
        "64:ff9b::/96",  # NAT64, well-known prefix (RFC 6052)
        "64:ff9b:1::/48",  # NAT64, local use (RFC 8215)
        "::ffff:0:0:0/96",  # SIIT IPv4-translated (RFC 2765)
        "::/96",  # IPv4-compatible, deprecated but still routed by some stacks
    )
)


def resolve_host(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for ``host``, in its order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64, translated, compatible):
    a packet to it may end up there, so it is judged as that address."""
    embedded = address.ipv4_mapped or address.sixtofour
    if embedded is None and any(address in prefix for prefix in EMBEDDING_IPV4):
        embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return embedded


def public_address(raw: str) -> bool:
    """Global unicast only; an IPv6 address that embeds an IPv4 one is judged as that one."""
    address: IPAddress = ipaddress.ip_address(raw.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address):
        address = _embedded_ipv4(address) or address
    return address.is_global and not address.is_multicast and not address.is_reserved


def host_key(host: str) -> str:
    """A host as DNS and TLS see it (IDNA, lower case, no brackets), whichever form the
    operator or the URL uses, so allow-lists compare like with like."""
    bare = host.strip().strip("[]")
    try:
        return httpx.URL(scheme="https", host=bare).raw_host.decode("ascii").lower()
    except httpx.InvalidURL:
        return bare.lower()


def _literal_address(host: str) -> str | None:
    """The address a host spells, in any form the system resolver would accept without DNS:
    dotted, IPv6, or the numeric IPv4 forms ``inet_aton`` takes (``2130706433``, ``127.1``)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


def _networks(entries: Iterable[str]) -> tuple[frozenset[str], tuple[Network, ...]]:
    names, networks = set(), []
    for entry in filter(None, (raw.strip() for raw in entries)):
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(host_key(entry))
    return frozenset(names), tuple(networks)


@dataclass(frozen=True)
class EgressPolicy:
    allow_http: bool = False
    allowed_hosts: frozenset[str] | None = None
    """``None``: any host whose addresses are public."""
    internal_hosts: frozenset[str] = frozenset()
    internal_networks: tuple[Network, ...] = ()
    """Hosts and networks the operator opened, which may resolve to non-public addresses."""
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    timeout_s: float = 30.0
    """Per network operation; callers that stream also keep an overall deadline."""
    max_bytes: int = 10_000_000
    """The most of a response body a caller reads; a step may ask for less, never more."""

    @classmethod
    def from_settings(cls, settings: Settings, action: str | None = None) -> "EgressPolicy":
        """The deployment's policy, narrowed by the allow-list of ``action`` if it has one."""
        allowed: frozenset[str] | None = None
        if settings.egress_allowed_hosts:
            allowed = frozenset(map(host_key, settings.egress_allowed_hosts))
        for_action = settings.egress_action_allowed_hosts.get(action or "")
        if for_action is not None:
            narrowed = frozenset(map(host_key, for_action))
            allowed = narrowed if allowed is None else narrowed & allowed
        names, networks = _networks(settings.egress_internal_hosts)
        return cls(
            allow_http=settings.egress_allow_http,
            allowed_hosts=allowed,
            internal_hosts=names,
            internal_networks=networks,
            max_redirects=settings.egress_max_redirects,
            timeout_s=settings.http_timeout_s,
            max_bytes=settings.http_max_response_bytes,
        )

    def check_url(self, url: httpx.URL) -> None:
        """What can be judged from the URL alone: also used where a URL is saved."""
        schemes = ("https", "http") if self.allow_http else ("https",)
        if url.scheme not in schemes:
            raise EgressSchemeRefused(
                f"{url.scheme or 'no scheme'!r} is refused; allowed: {', '.join(schemes)}",
                {"url": str(url), "allowed": list(schemes)},
            )
        if url.userinfo:
            raise EgressSchemeRefused("URLs with credentials are refused", {"host": url.host})
        host = host_key(url.raw_host.decode("ascii"))
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            raise EgressHostNotAllowed(
                f"host {host!r} is not on the allow-list",
                {"host": host, "allowed": sorted(self.allowed_hosts)},
            )
        literal = _literal_address(host)
        if literal is not None and not self._address_ok(host, literal):
            raise EgressAddressRefused(
                f"{host!r} is not a public address", {"host": host, "addresses": [literal]}
            )

    def checked_addresses(self, host: str, port: int, resolver: Resolver) -> list[str]:
        """The addresses to connect to, in the resolver's order; every one must pass, since
        the system could otherwise pick a refused one on a later connection."""
        try:
            addresses = resolver(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
        if not addresses:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: no addresses")
        refused = [a for a in addresses if not self._address_ok(host, a)]
        if refused:
            raise EgressAddressRefused(
                f"host {host!r} resolves to a non-public address",
                {"host": host, "addresses": refused},
            )
        return addresses

    def _address_ok(self, host: str, address: str) -> bool:
        if public_address(address):
            return True
        if host_key(host) in self.internal_hosts:
            return True
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        return any(ip in network for network in self.internal_networks)


class _GuardedBackend(httpcore.NetworkBackend):
    """Resolves and checks the host where httpcore connects, then connects to a checked
    address; TLS still verifies and names the host, since httpcore passes it as server name."""

    def __init__(self, policy: EgressPolicy, resolver: Resolver) -> None:
        self._policy = policy
        self._resolver = resolver
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        *earlier, last = self._policy.checked_addresses(host.strip("[]"), port, self._resolver)
        for address in earlier:
            try:
                return self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError:
                continue
        return self._inner.connect_tcp(last, port, timeout, local_address, socket_options)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise EgressAddressRefused("unix sockets are refused", {"path": path})

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@functools.cache
def _system_ssl_context() -> ssl.SSLContext:
    """Loading the CA bundle takes tens of milliseconds and callers make a client per request,
    so the verifying context is made once; a context may serve many connections and threads."""
    return httpx.create_ssl_context(trust_env=False)


class GuardedTransport(httpx.HTTPTransport):
    """httpx's own transport (its response streaming and error mapping) over a connection
    pool whose every connection goes through the guarded backend. httpx offers no argument for
    a network backend, so the pool it built is replaced by one that has it."""

    def __init__(
        self,
        policy: EgressPolicy,
        resolver: Resolver = resolve_host,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        context = ssl_context or _system_ssl_context()
        super().__init__(verify=context, trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=context, network_backend=_GuardedBackend(policy, resolver)
        )


class GuardedClient(httpx.Client):
    """Checks the URL before anything is sent, and names what a redirect hop was refused for.

    A hop's scheme and host are checked by a request hook (httpx runs it for every hop) and its
    addresses by the backend; since the first URL passed here, a scheme or host refusal from
    inside is a redirect's, and is reported as ``egress_redirect_refused`` with the reason.
    """

    def __init__(self, policy: EgressPolicy, **options: Any) -> None:
        super().__init__(**options)
        self._policy = policy

    def send(self, request: httpx.Request, **options: Any) -> httpx.Response:
        self._policy.check_url(request.url)
        try:
            with tracing.span(
                f"HTTP {request.method}",
                **{"server.address": request.url.host, "url.scheme": request.url.scheme},
            ) as span:
                tracing.inject(request.headers)
                response = super().send(request, **options)
                if span is not None:
                    span.set_attribute("http.response.status_code", response.status_code)
                return response
        except (EgressSchemeRefused, EgressHostNotAllowed) as exc:
            raise EgressRedirectRefused(
                f"a redirect from {request.url} was refused: {exc.message}",
                {"url": str(request.url), "refused": exc.code, **exc.details},
            ) from exc
        except httpx.TooManyRedirects as exc:
            raise EgressRedirectRefused(
                f"{request.url} redirected more than {self._policy.max_redirects} times",
                {"url": str(request.url), "max_redirects": self._policy.max_redirects},
            ) from exc


def guarded_client(
    policy: EgressPolicy,
    *,
    timeout: float | httpx.Timeout | None = None,
    follow_redirects: bool = True,
    resolver: Resolver = resolve_host,
    ssl_context: ssl.SSLContext | None = None,
) -> httpx.Client:
    """An ``httpx.Client`` that lets out only what ``policy`` allows, hop by hop, for any
    caller (a step, a notice, an import, an LLM client). Proxies from the environment are
    ignored: they would connect on the request's behalf, unchecked. ``ssl_context`` is for a
    private CA; the default verifies against the system's."""

    def check(request: httpx.Request) -> None:
        policy.check_url(request.url)

    return GuardedClient(
        policy,
        transport=GuardedTransport(policy, resolver, ssl_context),
        timeout=policy.timeout_s if timeout is None else timeout,
        follow_redirects=follow_redirects,
        max_redirects=policy.max_redirects,
        trust_env=False,
        event_hooks={"request": [check]},
    )


def check_notify_url(settings: Settings, url: str | None) -> None:
    """Refuse, when it is saved, a notice URL the egress policy would refuse when it is sent
    (as far as the URL alone tells: its address is checked again at every delivery)."""
    if url is None:
        return
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise NotifyUrlInvalid(f"notify_url is not usable: {exc}", {"notify_url": url}) from exc
    EgressPolicy.from_settings(settings, "notice").check_url(parsed)
