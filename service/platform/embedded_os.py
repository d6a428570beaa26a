"""What the embedded servers need of the operating system: commands run as the servers' user
(with the tail of their output when they fail), ownership and traversal of their directories,
pids, free loopback ports, and stopping a process."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from service.platform.errors import FlowbeatError

LOOPBACK = "127.0.0.1"
_DEFAULT_SYSTEM_USER = "flowbeat"
_STOP_TIMEOUT_S = 30.0


class EmbeddedError(FlowbeatError):
    """An embedded server could not be started or stopped."""

    code = "embedded_unavailable"


NO_ROOM = ("No space left on device", "Read-only file system", "Permission denied")
OUTPUT_TAIL_CHARS = 1500


@dataclass(frozen=True)
class _RunAs:
    """The identity the servers run under: ``None`` fields mean the calling user."""

    uid: int | None = None
    gid: int | None = None
    home: str | None = None


def _run_as() -> _RunAs:
    if os.geteuid() != 0:
        return _RunAs()
    name = os.environ.get("FLOWBEAT_EMBEDDED_USER", _DEFAULT_SYSTEM_USER)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        created = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            try:
                entry = pwd.getpwnam("nobody")
            except KeyError:
                raise EmbeddedError(f"cannot create user {name!r}: {created.stderr}") from None
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def _grant_traverse(path: Path) -> None:
    """Let the unprivileged server user reach ``path`` (its data, and the binaries inside a
    virtualenv that may sit in a private directory): add o+x, traverse only, where it lacks."""
    for ancestor in [path, *path.parents]:
        mode = ancestor.stat().st_mode
        if not mode & stat.S_IXOTH:
            ancestor.chmod(mode | stat.S_IXOTH)


def _own(path: Path, run_as: _RunAs) -> None:
    if run_as.uid is not None and run_as.gid is not None:
        os.chown(path, run_as.uid, run_as.gid)


def _run(argv: list[str], run_as: _RunAs, cwd: Path, timeout: float) -> None:
    """Run a server tool in its own session, so a Ctrl-C to the caller does not reach the server."""
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    if run_as.home is not None:
        env["HOME"] = run_as.home
    with tempfile.TemporaryFile("w+") as output:
        try:
            completed = subprocess.run(
                argv,
                cwd=cwd,
                env=env,
                user=run_as.uid,
                group=run_as.gid,
                extra_groups=[] if run_as.uid is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            output.seek(0)
            raise EmbeddedError(f"{argv[0]} timed out after {timeout}s: {output.read()}") from exc
        if completed.returncode != 0:
            output.seek(0)
            command = " ".join(argv)
            raise EmbeddedError(f"{command} failed ({completed.returncode}): {output.read()}")


def _pid_alive(pid: int, program: bytes | None = None) -> bool:
    """Whether ``pid`` runs (and, if ``program`` is given, runs that program).

    A zombie left unreaped by a container's PID 1 counts as gone, and checking the program
    guards against a stale pid file whose number the kernel has since given to another process.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    try:
        status = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return True
    if status.rsplit(")", 1)[-1].split()[:1] == ["Z"]:
        return False
    return program is None or program in cmdline


def _port_free(port: int) -> bool:
    """Whether a server could listen on ``port``; TIME_WAIT leftovers of our own server do not
    count as taken, since both servers bind with SO_REUSEADDR as well."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _free_port(avoid: set[int]) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def _choose_port(remembered: object, avoid: set[int]) -> int:
    if isinstance(remembered, int) and remembered not in avoid and _port_free(remembered):
        return remembered
    return _free_port(avoid)


def _terminate(pid: int, sig: signal.Signals) -> None:
    """Signal ``pid`` and wait for it to exit; SIGTERM makes Redis fsync its AOF first."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            raise EmbeddedError(f"process {pid} did not stop within {_STOP_TIMEOUT_S}s")
        time.sleep(0.02)
