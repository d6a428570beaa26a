"""A local webhook receiver that answers with scripted statuses and records what it got, and
the signature scheme written out again, independently of ``service.catalogue.notices.sign``."""

import hashlib
import hmac
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


def signature(secret: str, delivery: str, timestamp: str, body: bytes) -> str:
    """``sha256=`` hex HMAC-SHA256 of ``<delivery id>.<timestamp>.<body>``."""
    signed = delivery.encode() + b"." + timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signed_headers(
    secret: str, delivery: str, body: bytes, *, at: float | None = None
) -> dict[str, str]:
    """The headers of a delivery to ``POST /v1/hooks/{name}``."""
    timestamp = str(int(time.time() if at is None else at))
    return {
        "Content-Type": "application/json",
        "X-Flowbeat-Delivery": delivery,
        "X-Flowbeat-Timestamp": timestamp,
        "X-Flowbeat-Signature": signature(secret, delivery, timestamp, body),
    }


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    def signed_with(self, secret: str) -> bool:
        expected = signature(
            secret,
            self.headers["X-Flowbeat-Delivery"],
            self.headers["X-Flowbeat-Timestamp"],
            self.body,
        )
        return self.headers["X-Flowbeat-Signature"] == expected


@dataclass
class Receiver:
    statuses: list[int]
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_status(self, got: Received) -> int:
        with self.lock:
            self.received.append(got)
            return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]


class WebhookServer:
    """``statuses`` are answered in order; the last one repeats."""

    def __init__(self, statuses: list[int]) -> None:
        self.receiver = Receiver(list(statuses))
        receiver = self.receiver

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                got = Received(dict(self.headers.items()), self.rfile.read(length))
                self.send_response(receiver.next_status(got))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def received(self) -> list[Received]:
        with self.receiver.lock:
            return list(self.receiver.received)

    def __enter__(self) -> "WebhookServer":
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
