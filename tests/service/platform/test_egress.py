"""The egress policy: what a step, a notice, an escalation or an import may reach, judged where
it connects.

The test server listens on 127.0.0.1, which the policy refuses unless the settings open it, as
an operator opens an internal host; nothing in the policy knows it is under test.
"""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.actions import REGISTRY, load_plugins
from service.catalogue.notices import Notice, deliver
from service.platform.egress import EgressPolicy, Resolver, guarded_client, public_address
from service.platform.errors import (
    ActionError,
    EgressAddressRefused,
    EgressHostNotAllowed,
    EgressRedirectRefused,
    EgressRefused,
    EgressSchemeRefused,
)
from service.platform.settings import Settings
from tests.service.actions import make_ctx
from tests.support.replay import ReplayServer


class _Handler(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        _Handler.hits.append(f"{self.headers['Host']}{self.path}")
        location = None
        if self.path.startswith("/to/"):
            location = self.path.removeprefix("/to/")
        elif self.path == "/loop":
            location = "/loop"
        if location is not None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"internal secret"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.do_GET()

    def log_message(self, *_: object) -> None:
        return


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
def hits() -> list[str]:
    """What the test server receives during the test."""
    _Handler.hits.clear()
    return _Handler.hits


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


def _get(policy: EgressPolicy, url: str, resolver: Resolver | None = None) -> httpx.Response:
    options: dict[str, Any] = {} if resolver is None else {"resolver": resolver}
    with guarded_client(policy, timeout=2, **options) as http:
        return http.get(url)


HTTP_ONLY = EgressPolicy(allow_http=True)
LOCALHOST_OPEN = EgressPolicy(allow_http=True, internal_hosts=frozenset({"localhost"}))


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("::ffff:8.8.8.8", True),
        ("64:ff9b::808:808", True),
        ("2002:808:808::", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("240.0.0.1", False),
        ("255.255.255.255", False),
        ("::1", False),
        ("::", False),
        ("fe80::1%eth0", False),
        ("fc00::1", False),
        ("ff02::1", False),
        ("2001:db8::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("::ffff:0:7f00:1", False),
        ("::7f00:1", False),
        ("2002:7f00:1::", False),
        ("2002:a00:1::", False),
        ("64:ff9b::7f00:1", False),
        ("64:ff9b:1::a00:1", False),
    ],
)
def test_only_global_unicast_addresses_are_public(address: str, public: bool) -> None:
    """An IPv6 address that carries an IPv4 one (mapped, translated, compatible, 6to4, NAT64)
    is judged as the IPv4 address it carries."""
    assert public_address(address) is public


@pytest.mark.parametrize(
    ("policy", "url", "refusal"),
    [
        (EgressPolicy(), "http://example.org/", EgressSchemeRefused),
        (HTTP_ONLY, "ftp://example.org/", EgressSchemeRefused),
        (HTTP_ONLY, "file:///etc/passwd", EgressSchemeRefused),
        (HTTP_ONLY, "gopher://example.org/", EgressSchemeRefused),
        (HTTP_ONLY, "example.org/no-scheme", EgressSchemeRefused),
        (EgressPolicy(), "https://user:pw@example.org/", EgressSchemeRefused),
        (
            EgressPolicy(allowed_hosts=frozenset({"a.example"})),
            "https://b.example/",
            EgressHostNotAllowed,
        ),
        (
            EgressPolicy(allowed_hosts=frozenset({"a.example"})),
            "https://a.example.evil.example/",
            EgressHostNotAllowed,
        ),
        (EgressPolicy(), "https://127.0.0.1/", EgressAddressRefused),
        (EgressPolicy(), "https://[::1]/", EgressAddressRefused),
        (EgressPolicy(), "https://[::ffff:127.0.0.1]/", EgressAddressRefused),
        (EgressPolicy(), "https://10.0.0.8/", EgressAddressRefused),
        (EgressPolicy(), "https://169.254.169.254/latest/meta-data/", EgressAddressRefused),
        (EgressPolicy(), "https://2130706433/", EgressAddressRefused),
        (EgressPolicy(), "https://0x7f.1/", EgressAddressRefused),
        (EgressPolicy(), "https://127.1/", EgressAddressRefused),
    ],
)
def test_what_the_url_alone_refuses(
    policy: EgressPolicy, url: str, refusal: type[EgressRefused]
) -> None:
    with pytest.raises(refusal) as info:
        policy.check_url(httpx.URL(url))
    assert info.value.retryable is False


def test_a_public_https_url_on_the_allow_list_passes_the_url_check() -> None:
    allowed = EgressPolicy.from_settings(
        Settings(egress_allowed_hosts="example.org,Bücher.example")
    )
    allowed.check_url(httpx.URL("https://EXAMPLE.org/x"))
    allowed.check_url(httpx.URL("https://bücher.example/x"))
    allowed.check_url(httpx.URL("https://xn--bcher-kva.example/x"))


def test_an_octal_dotted_quad_is_not_even_a_url() -> None:
    """httpx refuses ``0177.0.0.1`` as an invalid IPv4 address, so it never reaches a resolver
    that would read it as 127.0.0.1."""
    with pytest.raises(httpx.InvalidURL):
        httpx.URL("http://0177.0.0.1/")


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "2130706433", "0x7f.1", "localhost", "[::1]", "[::ffff:127.0.0.1]"]
)
def test_loopback_in_any_spelling_is_refused_before_anything_is_sent(
    port: int, hits: list[str], host: str
) -> None:
    with pytest.raises(EgressAddressRefused):
        _get(HTTP_ONLY, f"http://{host}:{port}/secret")
    assert hits == []


def test_a_name_that_resolves_to_loopback_is_refused(port: int, hits: list[str]) -> None:
    def to_loopback(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    with pytest.raises(EgressAddressRefused) as info:
        _get(HTTP_ONLY, f"http://innocent.example:{port}/secret", to_loopback)
    assert info.value.details == {"host": "innocent.example", "addresses": ["127.0.0.1"]}
    assert hits == []


def test_an_internal_host_the_operator_opened_is_reached(port: int) -> None:
    assert _get(LOCALHOST_OPEN, f"http://localhost:{port}/open").text == "internal secret"
    by_network = Settings(egress_allow_http=True, egress_internal_hosts="127.0.0.0/8")
    policy = EgressPolicy.from_settings(by_network)
    assert _get(policy, f"http://127.0.0.1:{port}/open").status_code == 200


def test_a_redirect_to_loopback_from_an_opened_host_is_refused(port: int, hits: list[str]) -> None:
    with pytest.raises(EgressAddressRefused):
        _get(LOCALHOST_OPEN, f"http://localhost:{port}/to/http://127.0.0.1:{port}/secret")
    assert hits == [f"localhost:{port}/to/http://127.0.0.1:{port}/secret"]


@pytest.mark.parametrize(
    ("policy", "location", "refused"),
    [
        (LOCALHOST_OPEN, "ftp://localhost/x", "egress_scheme_refused"),
        (LOCALHOST_OPEN, "file:///etc/passwd", "egress_scheme_refused"),
        (
            EgressPolicy(
                allow_http=True,
                allowed_hosts=frozenset({"localhost"}),
                internal_hosts=frozenset({"localhost", "other.localhost"}),
            ),
            "http://other.localhost/x",
            "egress_host_not_allowed",
        ),
    ],
)
def test_a_redirect_to_a_refused_scheme_or_host_is_a_refused_redirect(
    port: int, hits: list[str], policy: EgressPolicy, location: str, refused: str
) -> None:
    with pytest.raises(EgressRedirectRefused) as info:
        _get(policy, f"http://localhost:{port}/to/{location}")
    assert info.value.details["refused"] == refused
    assert len(hits) == 1


def test_redirects_stop_at_the_cap(port: int, hits: list[str]) -> None:
    capped = EgressPolicy(allow_http=True, internal_hosts=frozenset({"localhost"}), max_redirects=2)
    with pytest.raises(EgressRedirectRefused) as info:
        _get(capped, f"http://localhost:{port}/loop")
    assert info.value.details["max_redirects"] == 2
    assert len(hits) == 3


def test_the_connection_goes_to_the_address_that_was_checked(port: int, hits: list[str]) -> None:
    """DNS rebinding: the resolver answers an address the policy accepts, then one it refuses.
    The name is resolved once per connection, by the guard, and the socket is opened to the
    address it checked; httpx never resolves the name again. Only 127.0.0.1 is opened here, so
    the accepted answer can be a live server: a public answer passes the same check."""
    answers = iter([["127.0.0.1"], ["127.0.0.2"]])
    asked: list[str] = []

    def rebinding(host: str, _port: int) -> list[str]:
        asked.append(host)
        return next(answers)

    opened = EgressPolicy(allow_http=True, internal_networks=(ip_network("127.0.0.1/32"),))
    with (
        guarded_client(opened, timeout=2, resolver=rebinding) as http,
        http.stream("GET", f"http://rebind.example:{port}/first") as response,
    ):
        peer = response.extensions["network_stream"].get_extra_info("server_addr")
        assert response.read() == b"internal secret"
    assert peer == ("127.0.0.1", port)
    assert asked == ["rebind.example"]
    assert hits == [f"rebind.example:{port}/first"]

    with pytest.raises(EgressAddressRefused) as info:
        _get(opened, f"http://rebind.example:{port}/second", rebinding)
    assert info.value.details["addresses"] == ["127.0.0.2"]
    assert asked == ["rebind.example", "rebind.example"] and len(hits) == 1


def test_a_name_with_any_non_public_address_is_refused(port: int, hits: list[str]) -> None:
    def mixed(host: str, port: int) -> list[str]:
        return ["8.8.8.8", "10.0.0.7"]

    with pytest.raises(EgressAddressRefused) as info:
        _get(HTTP_ONLY, f"http://mixed.example:{port}/", mixed)
    assert info.value.details["addresses"] == ["10.0.0.7"]
    assert hits == []


def test_proxies_from_the_environment_are_ignored(
    port: int, hits: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy would connect on the request's behalf, to an address nobody checked."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
    _get(LOCALHOST_OPEN, f"http://localhost:{port}/direct")
    assert hits == [f"localhost:{port}/direct"]


@pytest.mark.parametrize(
    ("settings", "action", "allowed"),
    [
        ({}, "http.request", None),
        ({"egress_allowed_hosts": "a.example,B.example"}, "x", {"a.example", "b.example"}),
        ({"egress_action_allowed_hosts": {"x": ["c.example"]}}, "x", {"c.example"}),
        ({"egress_action_allowed_hosts": {"x": ["c.example"]}}, "y", None),
        (
            {
                "egress_allowed_hosts": "a.example",
                "egress_action_allowed_hosts": {"x": ["c.example"]},
            },
            "x",
            set(),
        ),
    ],
)
def test_an_action_allow_list_narrows_the_deployment_one(
    settings: dict[str, Any], action: str, allowed: set[str] | None
) -> None:
    policy = EgressPolicy.from_settings(Settings(**settings), action)
    assert policy.allowed_hosts == (None if allowed is None else frozenset(allowed))


def test_the_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWBEAT_EGRESS_ALLOW_HTTP", "true")
    monkeypatch.setenv("FLOWBEAT_EGRESS_ALLOWED_HOSTS", "api.example.org, data.example.org")
    monkeypatch.setenv(
        "FLOWBEAT_EGRESS_ACTION_ALLOWED_HOSTS", '{"http.request": ["api.example.org"]}'
    )
    monkeypatch.setenv("FLOWBEAT_EGRESS_INTERNAL_HOSTS", "vault.internal,10.2.0.0/16")
    settings = Settings()
    policy = EgressPolicy.from_settings(settings, "http.request")

    assert policy.allow_http is True
    assert policy.allowed_hosts == frozenset({"api.example.org"})
    assert EgressPolicy.from_settings(settings, "data.download").allowed_hosts == frozenset(
        {"api.example.org", "data.example.org"}
    )
    assert policy.internal_hosts == frozenset({"vault.internal"})
    assert [str(network) for network in policy.internal_networks] == ["10.2.0.0/16"]


def test_http_is_refused_unless_the_operator_allows_it() -> None:
    assert Settings.model_fields["egress_allow_http"].default is False
    https_only = Settings(egress_allow_http=False)
    with pytest.raises(EgressSchemeRefused):
        EgressPolicy.from_settings(https_only).check_url(httpx.URL("http://example.org/"))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/secret",
        "http://[::1]:{port}/secret",
        "http://2130706433:{port}/secret",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "http://localhost:{port}/to/http://127.0.0.1:{port}/secret",
    ],
)
def test_a_step_cannot_read_loopback_or_the_metadata_service(
    port: int, hits: list[str], url: str
) -> None:
    ctx = make_ctx(egress_internal_hosts=["localhost"])
    with pytest.raises(ActionError) as info:
        REGISTRY.call("http.request", ctx, {"url": url.format(port=port)})

    assert info.value.code == "egress_address_refused"
    assert info.value.retryable is False
    assert [hit for hit in hits if "/to/" not in hit] == []


def test_a_step_spelling_loopback_in_octal_fails_for_good(port: int, hits: list[str]) -> None:
    ctx = make_ctx(egress_internal_hosts=[])
    with pytest.raises(ActionError) as info:
        REGISTRY.call("http.request", ctx, {"url": f"http://0177.0.0.1:{port}/secret"})
    assert info.value.retryable is False and hits == []


@pytest.mark.parametrize(
    ("settings", "code"),
    [
        ({"egress_allow_http": False}, "egress_scheme_refused"),
        ({"egress_allowed_hosts": "api.example.org"}, "egress_host_not_allowed"),
        (
            {"egress_action_allowed_hosts": {"http.request": ["api.example.org"]}},
            "egress_host_not_allowed",
        ),
    ],
)
def test_a_step_outside_the_scheme_or_the_allow_lists_fails_for_good(
    port: int, hits: list[str], settings: dict[str, Any], code: str
) -> None:
    ctx = make_ctx(**settings)
    with pytest.raises(ActionError) as info:
        REGISTRY.call("http.request", ctx, {"url": f"http://127.0.0.1:{port}/x"})
    assert (info.value.code, info.value.retryable) == (code, False)
    assert hits == []


def test_another_actions_allow_list_does_not_apply(port: int) -> None:
    ctx = make_ctx(egress_action_allowed_hosts={"data.download": ["api.example.org"]})
    out = REGISTRY.call("http.request", ctx, {"url": f"http://127.0.0.1:{port}/x"})
    assert out["text"] == "internal secret"


def test_a_step_redirected_too_often_fails_for_good(port: int) -> None:
    ctx = make_ctx(egress_max_redirects=1)
    with pytest.raises(ActionError) as info:
        REGISTRY.call("http.request", ctx, {"url": f"http://127.0.0.1:{port}/loop"})
    assert (info.value.code, info.value.retryable) == ("egress_redirect_refused", False)


@pytest.mark.parametrize(
    ("settings", "code"),
    [
        ({"egress_internal_hosts": []}, "egress_address_refused"),
        (
            {"egress_action_allowed_hosts": {"data.download": ["files.example.org"]}},
            "egress_host_not_allowed",
        ),
    ],
)
def test_a_download_follows_the_same_policy(
    port: int, hits: list[str], tmp_path: Path, settings: dict[str, Any], code: str
) -> None:
    ctx = make_ctx(data_dir=tmp_path, **settings)
    with pytest.raises(ActionError) as info:
        REGISTRY.call("data.download", ctx, {"url": f"http://127.0.0.1:{port}/x.csv"})
    assert (info.value.code, info.value.retryable) == (code, False)
    assert hits == []


def test_a_literature_client_follows_the_same_policy() -> None:
    """Refused at once: a refusal is not one of the failures the client retries itself."""
    replay = ReplayServer().start()
    try:
        ctx = make_ctx(europepmc_base_url=f"{replay.url}/europepmc", egress_internal_hosts=[])
        with pytest.raises(ActionError) as info:
            REGISTRY.call("europepmc.search", ctx, {"query": "remimazolam"})
        assert replay.seen("/search") == []
    finally:
        replay.stop()
    assert (info.value.code, info.value.retryable) == ("egress_address_refused", False)


def test_a_notice_to_a_refused_address_fails_for_good(port: int, hits: list[str]) -> None:
    notice = Notice(url=f"http://127.0.0.1:{port}/hook", body=b"{}", delivery_id="d-1")
    delivery = deliver(notice, b"secret", "1", HTTP_ONLY)

    assert (delivery.ok, delivery.retryable) == (False, False)
    assert delivery.code == "egress_address_refused"
    assert hits == []
