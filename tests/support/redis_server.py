"""A Redis server of a test's own, to SIGKILL and start again empty (no persistence), as a
restarted broker looks to its clients; the shared server cannot be restarted under other
tests' feet."""

import socket
import subprocess
import time
from pathlib import Path

from tests.e2e.conftest import wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.directory = directory
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(self.directory)]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, 10, "redis-server to answer")
        return proc

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def restart(self) -> float:
        """Kill it and start it again, empty; returns when it answers again."""
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = self._start()
        return time.time()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
