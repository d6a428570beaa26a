"""A command run at a pseudo-terminal of a given width, as a person at a terminal runs it:
stdout is a terminal (``isatty``), its size comes from the terminal, not ``COLUMNS``."""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence

ROWS = 50
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def at_terminal(
    argv: Sequence[str], env: Mapping[str, str], *, columns: int, cwd: str, timeout_s: float
) -> tuple[int, str]:
    """The exit code and what the command printed, without its colours and with ``\\n`` line
    ends; ``COLUMNS`` and ``LINES`` are left out, so the width is the terminal's."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, columns, 0, 0))
    sized = {key: value for key, value in env.items() if key not in ("COLUMNS", "LINES")}
    with subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, env=sized, cwd=cwd
    ) as process:
        os.close(follower)
        printed = _read_all(leader, time.monotonic() + timeout_s)
        code = process.wait(timeout=timeout_s)
    os.close(leader)
    return code, _ESCAPES.sub("", printed.decode()).replace("\r\n", "\n")


def _read_all(leader: int, deadline: float) -> bytes:
    """Until the command closes the terminal (Linux reports that as EIO, not as an end), or
    the deadline passes."""
    chunks = []
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([leader], [], [], left)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)
