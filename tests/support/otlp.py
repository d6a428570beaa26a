"""A local OTLP receiver (HTTP, protobuf), as a collector takes a process's spans: each
export is decoded and kept, so a test reads the spans every process sent."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]


def _decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource in request.resource_spans:
        service = next(
            (a.value.string_value for a in resource.resource.attributes if a.key == "service.name"),
            "",
        )
        for scope in resource.scope_spans:
            for span in scope.spans:
                attributes: dict[str, object] = {
                    a.key: getattr(a.value, a.value.WhichOneof("value") or "string_value")
                    for a in span.attributes
                }
                spans.append(
                    ReceivedSpan(
                        service,
                        span.name,
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        attributes,
                    )
                )
    return spans


class Collector:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [span for span in self.spans if span.trace_id == trace_id]


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Collector]]:
    """Yields the endpoint to give ``OTEL_EXPORTER_OTLP_ENDPOINT`` and what it received."""
    collector = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path == "/v1/traces":
                with collector.lock:
                    collector.spans.extend(_decode(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", collector
    finally:
        server.shutdown()
        server.server_close()
