"""Child processes of ``flowbeat dev`` and ``flowbeat run``: started in their own process
groups, stopped in order on Ctrl-C or SIGTERM, reaped so none is left a zombie."""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

PR_SET_CHILD_SUBREAPER = 36
STOP_TIMEOUT_S = 15.0


def adopt_orphans() -> None:
    """Become the reaper of what this command starts, on Linux.

    The embedded servers detach from their starter, and a worker's pool processes outlive a
    worker killed hard. Their orphans are re-parented to this process while it runs instead of
    to PID 1, which in a container or a bare VM may never reap them; ``_reap`` collects them.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap() -> None:
    """Collect every child that has exited, so none is left a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


class Stop(Exception):
    """SIGTERM, raised where the command waits, so it cleans up as it does on Ctrl-C."""


def _raise_stop(signum: int, _: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


@contextmanager
def stoppable() -> Iterator[None]:
    """SIGTERM stops the command the way SIGINT (Ctrl-C) does; both are ignored while its
    processes are being stopped, so a second Ctrl-C cannot leave half of them running."""
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def processes(
    commands: list[list[str]], log: Path | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Child processes for the duration of a command; with ``log``, their output goes there.

    Each runs in its own process group, so a Ctrl-C in the terminal reaches this command only
    and it stops them in order: SIGTERM to every group, then SIGKILL to whatever of a group is
    left after ``STOP_TIMEOUT_S`` or after its leader exited (a worker's pool processes).
    """
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    sink = log.open("ab") if log else None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for command in commands:
            procs.append(
                subprocess.Popen(
                    command,
                    env=os.environ.copy(),
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=sink,
                    start_new_session=True,
                )
            )
        yield procs
    finally:
        previous = {
            sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            _stop_groups(procs)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if sink:
                sink.close()


def _stop_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _reap()


def await_first_exit(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Block until one of ``procs`` exits, reaping adopted orphans that exit meanwhile."""
    ours = {proc.pid: proc for proc in procs}
    while True:
        exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        if exited is None:
            continue
        if exited.si_pid in ours:
            ours[exited.si_pid].poll()
            return ours[exited.si_pid]
        os.waitpid(exited.si_pid, 0)


def flowbeat_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "service.cli", *args]


def worker_argv(concurrency: int | None, pool: str) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "--loglevel=INFO"]
    argv.append(f"--pool={pool}")
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    return argv
