"""A local OpenAI-compatible server for the LLM actions' tests: recorded reply shapes from
``tests/fixtures/openai``, answer texts and failures scripted by the test, every request kept."""

import copy
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.replay import FIXTURES

SHAPES = FIXTURES / "openai"


@dataclass(frozen=True)
class Request:
    path: str
    query: str
    headers: dict[str, str]
    body: Any


class LlmServer:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._answers: list[str] = []
        self._failures: list[tuple[int, str, str | None]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> "LlmServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def answer(self, *texts: str) -> None:
        """The next chat completions answer these texts, in order; then the recorded one."""
        with self._lock:
            self._answers.extend(texts)

    def fail_next(self, hits: int, status: int, shape: str, retry_after: str | None = None) -> None:
        with self._lock:
            self._failures.extend([(status, shape, retry_after)] * hits)

    def _reply(self, path: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._lock:
            if self._failures:
                status, shape, retry_after = self._failures.pop(0)
                headers = {"Retry-After": retry_after} if retry_after else {}
                return status, json.loads((SHAPES / f"{shape}.json").read_text()), headers
            text = self._answers.pop(0) if self._answers else None
        if path.endswith("/embeddings"):
            return 200, json.loads((SHAPES / "embeddings.json").read_text()), {}
        reply = copy.deepcopy(json.loads((SHAPES / "chat-completion.json").read_text()))
        if text is not None:
            reply["choices"][0]["message"]["content"] = text
        return 200, reply, {}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                path, _, query = self.path.partition("?")
                with server._lock:
                    server.requests.append(Request(path, query, dict(self.headers), body))
                status, reply, headers = server._reply(path)
                raw = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *_: Any) -> None:
                return

        return Handler


def running() -> Iterator[LlmServer]:
    server = LlmServer().start()
    try:
        yield server
    finally:
        server.stop()
