"""A local HTTP server that replays recorded E-utilities and Europe PMC responses.

Tests point ``FLOWBEAT_PUBMED_BASE_URL`` at ``<url>/eutils`` and ``FLOWBEAT_EUROPEPMC_BASE_URL``
at ``<url>/europepmc``. A request is answered by the recording whose path is the request's and
whose params all equal the request's; unrecorded requests get 404. ``fail_next`` makes the next
hits answer 429 or 503 first, and ``requests`` holds every request seen, for assertions on
params and timing.
"""

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@dataclass(frozen=True)
class Seen:
    path: str
    params: dict[str, str]
    at: float


class ReplayServer:
    def __init__(self, fixture_dirs: tuple[str, ...] = ("eutils", "europepmc")) -> None:
        self.recordings: list[dict[str, Any]] = [
            json.loads(path.read_text())
            for name in fixture_dirs
            for path in sorted((FIXTURES / name).glob("*.json"))
        ]
        self.requests: list[Seen] = []
        self._failures: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> "ReplayServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def fail_next(self, hits: int, status: int = 429, retry_after: str = "1") -> None:
        with self._lock:
            self._failures.extend([(status, retry_after)] * hits)

    def seen(self, path_suffix: str) -> list[Seen]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith(path_suffix)]

    def answer(self, path: str, params: dict[str, str]) -> tuple[int, str, bytes, dict[str, str]]:
        with self._lock:
            self.requests.append(Seen(path, params, time.monotonic()))
            if self._failures:
                status, retry_after = self._failures.pop(0)
                return status, "text/plain", b"slow down", {"Retry-After": retry_after}
        for recording in self.recordings:
            wanted = recording["request"]
            if wanted["path"] != path or any(
                params.get(k) != v for k, v in wanted.get("params", {}).items()
            ):
                continue
            if "docsums" in recording:
                return 200, "application/json", self._esummary(recording, params), {}
            response = recording["response"]
            body = json.dumps(response["body"]).encode()
            return response["status"], response["content_type"], body, {}
        return 404, "application/json", b'{"error": "no recording for this request"}', {}

    @staticmethod
    def _esummary(recording: dict[str, Any], params: dict[str, str]) -> bytes:
        ids = [i for i in params.get("id", "").split(",") if i]
        docs = recording["docsums"]
        result: dict[str, Any] = {"uids": [i for i in ids if i in docs]}
        for pmid in ids:
            result[pmid] = docs.get(pmid, {"uid": pmid, "error": "cannot get document summary"})
        return json.dumps(
            {"header": {"type": "esummary", "version": "0.3"}, "result": result}
        ).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                split = urlsplit(self.path)
                params = {k: v[-1] for k, v in parse_qs(split.query).items()}
                status, content_type, body, headers = server.answer(split.path, params)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        return Handler
