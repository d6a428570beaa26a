"""The import policy: every refusal has its own code, and only allowed documents come through.

URL fetches go to a TLS server the test starts on 127.0.0.1 with a certificate for
``pipelines.test``; a resolver maps the test host names to that address, which the settings
open the way an operator opens an internal host (``FLOWBEAT_EGRESS_INTERNAL_HOSTS``).
"""

import os
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from service.catalogue.imports import fetch_url, import_policy, read_import_file
from service.platform.egress import EgressPolicy
from service.platform.errors.imports import ImportRefused
from service.platform.settings import Settings

PROFILE = "name: weekly\nsteps: [{id: search, action: noop}]\n"
HOST = "pipelines.test"


@dataclass
class Route:
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/yaml"})
    body: bytes = PROFILE.encode()
    chunked: bool = False
    stall: bool = False


class TlsServer:
    def __init__(self, cert: Path, key: Path) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.requests.append((self.path, self.headers.get("Host")))
                route = server.routes.get(self.path, Route(status=404, body=b"no"))
                if route.stall:
                    server.release.wait(10)
                self.send_response(route.status)
                for name, value in route.headers.items():
                    self.send_header(name, value)
                if route.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for start in range(0, len(route.body), 4096):
                        part = route.body[start : start + 4096]
                        self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                self.wfile.write(route.body)

            def log_message(self, *args: object) -> None:
                del args

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str, host: str = HOST) -> str:
        return f"https://{host}:{self.port}{path}"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    argv += ["-nodes", "-days", "1", "-subj", f"/CN={HOST}", "-keyout", str(key), "-out", str(cert)]
    argv += ["-addext", f"subjectAltName=DNS:{HOST},DNS:other.test"]
    subprocess.run(
        argv,
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def tls_server(certificate: tuple[Path, Path]) -> Iterator[TlsServer]:
    tls = TlsServer(*certificate)
    tls.thread.start()
    yield tls
    tls.release.set()
    tls.httpd.shutdown()
    tls.httpd.server_close()


@pytest.fixture
def server(tls_server: TlsServer) -> TlsServer:
    """The module's server with no routes and no recorded requests."""
    tls_server.routes.clear()
    tls_server.requests.clear()
    return tls_server


@pytest.fixture
def trust(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificate[0]))


def local(host: str, port: int) -> list[str]:
    del host, port
    return ["127.0.0.1"]


def policy(**overrides: Any) -> EgressPolicy:
    """The import policy of a deployment that opened the test server's address."""
    settings: dict[str, Any] = {
        "import_allowed_hosts": [HOST],
        "import_timeout_s": 3.0,
        "egress_internal_hosts": ["127.0.0.1"],
    }
    return import_policy(Settings(**{**settings, **overrides}))


def public_only(allowed: set[str]) -> EgressPolicy:
    """The import policy of a deployment that opened no internal host."""
    return import_policy(Settings(import_allowed_hosts=sorted(allowed), egress_internal_hosts=[]))


def refused(code: str, call: object, *args: object, **kwargs: object) -> ImportRefused:
    with pytest.raises(ImportRefused) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    assert caught.value.code == code, caught.value.message
    return caught.value


def test_the_import_policy_is_https_only_within_both_allow_lists() -> None:
    settings = Settings(
        import_allowed_hosts=[HOST.upper(), "other.test"],
        egress_allowed_hosts=[HOST, "third.test"],
        egress_allow_http=True,
        egress_internal_hosts=["10.0.0.0/8"],
        import_max_redirects=2,
    )
    imports = import_policy(settings)
    assert imports.allowed_hosts == frozenset({HOST})
    assert imports.allow_http is False
    assert imports.internal_networks == EgressPolicy.from_settings(settings).internal_networks
    assert (imports.max_redirects, imports.max_bytes, imports.timeout_s) == (2, 100_000, 10.0)


def test_an_allowed_document_is_fetched_from_the_checked_address(
    server: TlsServer, trust: ssl.SSLContext
) -> None:
    server.routes["/weekly.yaml"] = Route()
    text = fetch_url(server.url("/weekly.yaml"), policy(), resolver=local, ssl_context=trust)
    assert text == PROFILE
    assert server.requests == [("/weekly.yaml", f"{HOST}:{server.port}")]


def test_a_redirect_on_the_allow_list_is_followed(server: TlsServer, trust: ssl.SSLContext) -> None:
    server.routes["/old"] = Route(status=302, headers={"Location": "/new"}, body=b"")
    server.routes["/new"] = Route(headers={"Content-Type": "text/plain; charset=utf-8"})
    assert fetch_url(server.url("/old"), policy(), resolver=local, ssl_context=trust) == PROFILE


@pytest.mark.parametrize(
    "location", ["https://other.test/x", "http://pipelines.test/x", "file:///etc/passwd"]
)
def test_a_redirect_off_the_list_is_refused(
    server: TlsServer, trust: ssl.SSLContext, location: str
) -> None:
    server.routes["/hop"] = Route(status=301, headers={"Location": location}, body=b"")
    refused(
        "import_redirect_refused",
        fetch_url,
        server.url("/hop"),
        policy(),
        resolver=local,
        ssl_context=trust,
    )
    assert [path for path, _ in server.requests] == ["/hop"]


def test_a_redirect_loop_ends_at_the_limit(server: TlsServer, trust: ssl.SSLContext) -> None:
    server.routes["/loop"] = Route(status=307, headers={"Location": "/loop"}, body=b"")
    refused(
        "import_redirect_refused",
        fetch_url,
        server.url("/loop"),
        policy(import_max_redirects=2),
        resolver=local,
        ssl_context=trust,
    )
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("route", "code"),
    [
        (Route(headers={"Content-Type": "text/html"}), "import_content_type_refused"),
        (Route(headers={}), "import_content_type_refused"),
        (Route(body=b"\xff\xfe" + PROFILE.encode()), "import_content_type_refused"),
        (Route(body=b"a: 1\n" * 30_000), "import_too_large"),
        (Route(body=b"a: 1\n" * 30_000, chunked=True), "import_too_large"),
        (Route(status=404), "import_fetch_failed"),
        (Route(stall=True), "import_timeout"),
    ],
)
def test_a_document_the_policy_refuses(
    server: TlsServer, trust: ssl.SSLContext, route: Route, code: str
) -> None:
    server.routes["/doc"] = route
    refused(
        code,
        fetch_url,
        server.url("/doc"),
        policy(import_timeout_s=0.5),
        resolver=local,
        ssl_context=trust,
    )


def test_a_certificate_for_another_name_fails(server: TlsServer, trust: ssl.SSLContext) -> None:
    server.routes["/doc"] = Route()
    refused(
        "import_fetch_failed",
        fetch_url,
        server.url("/doc", host="third.test"),
        policy(import_allowed_hosts=["third.test"]),
        resolver=local,
        ssl_context=trust,
    )


@pytest.mark.parametrize(
    ("url", "allowed", "code"),
    [
        ("https://pipelines.test/p.yaml", set(), "imports_disabled"),
        ("http://pipelines.test/p.yaml", {HOST}, "import_scheme_refused"),
        ("ftp://pipelines.test/p.yaml", {HOST}, "import_scheme_refused"),
        ("https://user:pw@pipelines.test/p.yaml", {HOST}, "import_scheme_refused"),
        ("https://evil.test/p.yaml", {HOST}, "import_host_not_allowed"),
        ("https://pipelines.test.evil.test/p.yaml", {HOST}, "import_host_not_allowed"),
    ],
)
def test_urls_refused_before_any_connection(url: str, allowed: set[str], code: str) -> None:
    def no_dns(host: str, port: int) -> list[str]:
        raise AssertionError("resolved a refused URL")

    refused(code, fetch_url, url, public_only(allowed), resolver=no_dns)


@pytest.mark.parametrize(
    "addresses",
    [
        ["127.0.0.1"],
        ["10.1.2.3"],
        ["192.168.0.10"],
        ["169.254.169.254"],
        ["100.64.0.1"],
        ["0.0.0.0"],
        ["::1"],
        ["fd00::1"],
        ["::ffff:127.0.0.1"],
        ["93.184.216.34", "10.0.0.1"],
    ],
)
def test_hosts_resolving_to_non_public_addresses_are_refused(addresses: list[str]) -> None:
    def resolver(host: str, port: int) -> list[str]:
        return addresses

    error = refused(
        "import_address_refused",
        fetch_url,
        "https://pipelines.test/p.yaml",
        public_only({HOST}),
        resolver=resolver,
    )
    assert error.details["host"] == HOST


def test_an_opened_address_admits_only_itself(server: TlsServer, trust: ssl.SSLContext) -> None:
    server.routes["/doc"] = Route()

    def elsewhere(host: str, port: int) -> list[str]:
        return ["127.0.0.2"]

    refused(
        "import_address_refused",
        fetch_url,
        server.url("/doc"),
        policy(),
        resolver=elsewhere,
        ssl_context=trust,
    )
    assert server.requests == []


def test_a_redirect_to_a_refused_address_is_refused(
    server: TlsServer, trust: ssl.SSLContext
) -> None:
    server.routes["/hop"] = Route(status=302, headers={"Location": "https://other.test/x"})

    def other_is_private(host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host == HOST else ["10.0.0.1"]

    opened = policy(import_allowed_hosts=[HOST, "other.test"])
    refused(
        "import_address_refused",
        fetch_url,
        server.url("/hop"),
        opened,
        resolver=other_is_private,
        ssl_context=trust,
    )
    assert [path for path, _ in server.requests] == ["/hop"]


@pytest.fixture
def import_dir(tmp_path: Path) -> Path:
    root = tmp_path / "imports"
    (root / "team").mkdir(parents=True)
    (root / "team" / "weekly.yaml").write_text(PROFILE)
    (tmp_path / "secret.yaml").write_text("name: secret\n")
    (root / "escape.yaml").symlink_to(tmp_path / "secret.yaml")
    (root / "inside.yaml").symlink_to(root / "team" / "weekly.yaml")
    (root / "big.yaml").write_bytes(b"a: 1\n" * 30_000)
    os.mkfifo(root / "pipe.yaml")
    return root


def test_a_file_inside_the_import_directory_is_read(import_dir: Path) -> None:
    assert read_import_file("team/weekly.yaml", import_dir, 100_000) == PROFILE
    assert read_import_file("inside.yaml", import_dir, 100_000) == PROFILE
    assert read_import_file(str(import_dir / "team/weekly.yaml"), import_dir, 100_000) == PROFILE


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("../secret.yaml", "import_path_refused"),
        ("team/../../secret.yaml", "import_path_refused"),
        ("team/../weekly.yaml", "import_path_refused"),
        ("/etc/passwd", "import_path_refused"),
        ("escape.yaml", "import_path_refused"),
        ("team", "import_path_refused"),
        ("pipe.yaml", "import_path_refused"),
        ("", "import_path_refused"),
        ("missing.yaml", "import_not_found"),
        ("big.yaml", "import_too_large"),
    ],
)
def test_a_file_the_policy_refuses(import_dir: Path, path: str, code: str) -> None:
    refused(code, read_import_file, path, import_dir, 100_000)


def test_file_imports_are_disabled_without_a_directory() -> None:
    refused("imports_disabled", read_import_file, "weekly.yaml", None, 100_000)


def test_an_empty_import_dir_setting_disables_file_imports() -> None:
    assert Settings(import_dir="").import_dir is None
    assert Settings(import_dir="/srv/imports").import_dir == Path("/srv/imports")


def test_international_host_names_are_checked_in_their_dns_form() -> None:
    seen: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        seen.append(host)
        return ["10.0.0.1"]

    allowed = public_only({"xn--bcher-kva.example"})
    refused("import_address_refused", fetch_url, "https://Bücher.example/p", allowed,
            resolver=resolver)  # fmt: skip
    assert seen == ["xn--bcher-kva.example"]
