import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from service.actions import REGISTRY, StepContext, load_plugins
from service.platform.errors import ActionError, StepCancelled
from tests.service.actions import make_ctx


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        headers: dict[str, str] | None = None,
        length: bool = True,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length:
            self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _route(self) -> None:
        split = urlsplit(self.path)
        path = split.path
        if path == "/json":
            self._send(200, b'{"ok": true, "items": [1, 2]}', "application/json")
        elif path == "/problem-json":
            self._send(200, b'{"title": "x"}', "application/problem+json")
        elif path == "/text":
            self._send(200, "héllo".encode(), headers={"X-Custom": "Yes"})
        elif path == "/latin1":
            self._send(200, "café".encode("latin-1"), "text/plain; charset=iso-8859-1")
        elif path == "/echo":
            size = int(self.headers.get("Content-Length") or 0)
            payload = {
                "method": self.command,
                "query": parse_qs(split.query),
                "header": self.headers.get("X-Token"),
                "body": self.rfile.read(size).decode(),
            }
            self._send(200, json.dumps(payload).encode(), "application/json")
        elif path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            self._send(status, b"status body", headers={"Retry-After": "7"})
        elif path == "/big":
            self._send(200, b"x" * 5000)
        elif path == "/big-unsized":
            self._send(200, b"y" * 5000, length=False)
            self.close_connection = True
        elif path == "/slow":
            time.sleep(1.5)
            self._send(200, b"late")
        elif path == "/drip":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            for _ in range(30):
                self.wfile.write(b".")
                self.wfile.flush()
                time.sleep(0.05)
            self.close_connection = True
        elif path == "/redirect":
            self._send(302, b"", headers={"Location": "/json"})
        elif path == "/ftp-redirect":
            self._send(302, b"", headers={"Location": "ftp://example.com/file"})
        else:
            self._send(404, b"not found")

    do_GET = _route
    do_POST = _route
    do_PUT = _route
    do_DELETE = _route


class QuietServer(ThreadingHTTPServer):
    """Clients that give up early (timeouts, size caps) are expected, not errors."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = QuietServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


def request(ctx: StepContext | None = None, **inputs: Any) -> Any:
    return REGISTRY.call("http.request", ctx or make_ctx(), inputs)


def fails(**inputs: Any) -> ActionError:
    with pytest.raises(ActionError) as info:
        request(**inputs)
    return info.value


def test_json_response(server: str) -> None:
    out = request(url=f"{server}/json")
    assert out["status"] == 200
    assert out["json"] == {"ok": True, "items": [1, 2]}
    assert "text" not in out
    assert out["headers"]["content-type"] == "application/json"


def test_json_suffix_media_type(server: str) -> None:
    assert request(url=f"{server}/problem-json")["json"] == {"title": "x"}


def test_text_response(server: str) -> None:
    out = request(url=f"{server}/text")
    assert out["text"] == "héllo"
    assert "json" not in out
    assert out["headers"]["x-custom"] == "Yes"
    assert all(key == key.lower() for key in out["headers"])


def test_text_uses_declared_charset(server: str) -> None:
    assert request(url=f"{server}/latin1")["text"] == "café"


@pytest.mark.parametrize(
    ("path", "expect_json", "key", "value"),
    [
        ("/json", False, "text", '{"ok": true, "items": [1, 2]}'),
        ("/echo", True, "json", None),
    ],
)
def test_expect_json_overrides_content_type(
    server: str, path: str, expect_json: bool, key: str, value: Any
) -> None:
    out = request(url=f"{server}{path}", expect_json=expect_json)
    assert key in out
    if value is not None:
        assert out[key] == value


def test_expect_json_on_non_json_is_not_retryable(server: str) -> None:
    err = fails(url=f"{server}/text", expect_json=True)
    assert err.retryable is False
    assert err.details["reason"] == "bad_json"


def test_sends_method_params_headers_and_json(server: str) -> None:
    out = request(
        url=f"{server}/echo",
        method="post",
        params={"term": "crispr", "limit": 5},
        headers={"X-Token": "t0k"},
        json={"q": "remimazolam"},
    )
    echoed = out["json"]
    assert echoed["method"] == "POST"
    assert echoed["query"] == {"term": ["crispr"], "limit": ["5"]}
    assert echoed["header"] == "t0k"
    assert json.loads(echoed["body"]) == {"q": "remimazolam"}


def test_sends_raw_body(server: str) -> None:
    out = request(url=f"{server}/echo", method="PUT", body="raw text")
    assert out["json"]["body"] == "raw text"


def test_follows_redirects(server: str) -> None:
    assert request(url=f"{server}/redirect")["json"]["ok"] is True


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (404, False), (422, False), (429, True), (500, True), (503, True)],
)
def test_error_statuses(server: str, status: int, retryable: bool) -> None:
    err = fails(url=f"{server}/status/{status}")
    assert err.retryable is retryable
    assert err.details["status"] == status
    assert err.details["reason"] == "http_status"
    assert err.details["body"] == "status body"
    assert err.details["retry_after"] == "7"


@pytest.mark.parametrize("path", ["/big", "/big-unsized"])
def test_oversized_body_is_aborted(server: str, path: str) -> None:
    err = fails(url=f"{server}{path}", max_bytes=1000)
    assert err.retryable is False
    assert err.details["reason"] == "response_too_large"


def test_size_cap_defaults_to_settings(server: str) -> None:
    ctx = make_ctx(http_max_response_bytes=100)
    with pytest.raises(ActionError) as info:
        request(ctx, url=f"{server}/big")
    assert info.value.details["reason"] == "response_too_large"
    assert request(url=f"{server}/big", max_bytes=5000)["text"] == "x" * 5000


def test_a_step_cannot_raise_the_operators_size_cap(server: str) -> None:
    ctx = make_ctx(http_max_response_bytes=100)
    with pytest.raises(ActionError) as info:
        request(ctx, url=f"{server}/big", max_bytes=5000)
    assert info.value.details == {"reason": "response_too_large", "max_bytes": 100}


def test_timeout_is_retryable(server: str) -> None:
    started = time.monotonic()
    err = fails(url=f"{server}/slow", timeout_s=0.2)
    assert err.retryable is True
    assert err.details["reason"] == "timeout"
    assert time.monotonic() - started < 1.4


def test_timeout_defaults_to_settings(server: str) -> None:
    with pytest.raises(ActionError) as info:
        request(make_ctx(http_timeout_s=0.2), url=f"{server}/slow")
    assert info.value.details["reason"] == "timeout"


def test_trickling_response_hits_overall_deadline(server: str) -> None:
    err = fails(url=f"{server}/drip", timeout_s=0.4)
    assert err.retryable is True
    assert err.details["reason"] == "timeout"


def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    err = fails(url=f"http://127.0.0.1:{port}/", timeout_s=2)
    assert err.retryable is True
    assert err.details["reason"] == "transport"


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/x", "file:///etc/passwd", "javascript:alert(1)", "/relative", "http://"],
)
def test_bad_scheme_is_refused(url: str) -> None:
    err = fails(url=url)
    assert err.retryable is False
    assert err.code == "egress_scheme_refused" or err.details["reason"] == "bad_url"


def test_redirect_to_other_scheme_is_refused(server: str) -> None:
    err = fails(url=f"{server}/ftp-redirect")
    assert err.retryable is False


@pytest.mark.parametrize(
    "inputs",
    [
        {"method": "TRACE"},
        {"json": {"a": 1}, "body": "x"},
        {"timeout_s": 0},
        {"max_bytes": -5},
    ],
)
def test_bad_inputs_are_not_retryable(server: str, inputs: dict[str, Any]) -> None:
    err = fails(url=f"{server}/json", **inputs)
    assert err.retryable is False
    assert err.details["reason"] == "bad_inputs"


def test_cancelled_before_request(server: str) -> None:
    ctx = make_ctx()
    ctx.cancel_event.set()
    with pytest.raises(StepCancelled):
        request(ctx, url=f"{server}/json")


def test_cancelled_while_reading(server: str) -> None:
    ctx = make_ctx()
    cancel: Callable[[], None] = ctx.cancel_event.set
    timer = threading.Timer(0.2, cancel)
    timer.start()
    try:
        with pytest.raises(StepCancelled):
            request(ctx, url=f"{server}/drip", timeout_s=10)
    finally:
        timer.cancel()
