"""Files served over HTTP for the data actions to download, and an S3-compatible server (moto's)
for a bucket to keep them in: real clients against local servers."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import obstore
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from obstore.store import S3Store

CSV = b"code,name,population\nGB,United Kingdom,68350000\nFR,France,68170000\nIS,Iceland,\n"
JSONL = b'{"code": "GB", "name": "United Kingdom"}\n\n{"code": "NO", "name": "Norway"}\n'
BODIES = {"/countries.csv": CSV, "/countries.jsonl": JSONL, "/big.csv": b"x" * 5000}
S3_KEYS = {"access_key_id": "flowbeat-test", "secret_access_key": "flowbeat-secret"}


class Handler(BaseHTTPRequestHandler):
    """``BODIES``, a body of unknown length past the tests' cap, a 503 and 404s; a path
    ``/sized/<n>.csv`` is ``n`` bytes of CSV rows, streamed."""

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        if self.path == "/big-unsized.csv":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"y" * 5000)
            self.close_connection = True
            return
        if self.path.startswith("/sized/") and self.path.removeprefix("/sized/")[:-4].isdigit():
            self._rows(int(self.path.removeprefix("/sized/")[:-4]))
            return
        body = BODIES.get(self.path)
        status = 200 if body is not None else (503 if self.path == "/down" else 404)
        body = body if body is not None else b"no"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _rows(self, size: int) -> None:
        line = b"n,padding\n"
        row = b"1," + b"p" * 1013 + b"\n"
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        sent = len(line)
        self.wfile.write(line)
        while sent + len(row) <= size:
            self.wfile.write(row)
            sent += len(row)
        self.wfile.write(b"\n" * (size - sent))


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None


@contextmanager
def file_server(address: str = "127.0.0.1") -> Iterator[str]:
    """The files on ``address`` (any port), as a base URL."""
    httpd = QuietServer((address, 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://{address}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def create_bucket(endpoint: str, bucket: str) -> None:
    """moto's S3 takes an unsigned ``PUT /<bucket>`` as a client's ``CreateBucket``."""
    httpx.put(f"{endpoint}/{bucket}", timeout=10).raise_for_status()


def bucket_keys(endpoint: str, bucket: str) -> list[str]:
    store = S3Store(
        bucket,
        endpoint=endpoint,
        access_key_id=S3_KEYS["access_key_id"],
        secret_access_key=S3_KEYS["secret_access_key"],
        client_options={"allow_http": True},
    )
    return sorted(item["path"] for batch in obstore.list(store) for item in batch)


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 on loopback (any port), as an endpoint URL."""
    server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
