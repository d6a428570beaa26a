"""A TCP proxy a test controls: ``cut()`` drops every connection through it and refuses new
ones, as a dead server looks to a client; ``stall()`` keeps every connection open and takes
new ones but passes no byte, as a partition that drops packets looks; ``heal()`` ends both.
``strand()`` silently drops every byte of the connections open now, for good, while new ones
flow: what a client sees when a NAT or firewall forgets its connections, or the server fails
over to another address, and nothing tells the client its sockets are dead."""

import contextlib
import socket
import threading
from types import TracebackType

CHUNK_BYTES = 65536


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._cut = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stranded: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="tcpproxy", daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def strand(self) -> None:
        with self._lock:
            self._stranded |= self._open

    def stall(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._cut.clear()
        self._flowing.set()

    def close(self) -> None:
        """Held bytes are dropped with their connections, never delivered late."""
        self._closed.set()
        self.cut()
        self._flowing.set()
        _close(self.listener)

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open |= {client, server}
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            with contextlib.suppress(OSError):
                while chunk := source.recv(CHUNK_BYTES):
                    self._flowing.wait()
                    if source not in self._stranded:
                        target.sendall(chunk)
        finally:
            for sock in (source, target):
                _close(sock)
            with self._lock:
                self._open -= {source, target}
                self._stranded -= {source, target}


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
