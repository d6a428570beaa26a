"""The flowbeat command run inside the test process, through typer's ``CliRunner``.

A new interpreter per command spent about a second importing flowbeat, most of the CLI tests'
time. Here a command goes through ``service.cli.main``, the function
``python -m service.cli`` calls, so its refusals print and exit as they do there, and the
answer has the attributes of ``subprocess.run``'s: ``returncode``, ``stdout`` and ``stderr``
apart. What a process would start afresh is made afresh: the settings are read from the
environment given, the console wraps as one started on this stdout, and the engines and Celery
apps the command made are closed after it, so no connection outlives it; what it wrote into
the environment is undone.

A command that starts a worker, a beat or a server, whose point is the process itself
(signals, exit status, the interpreter's imports), or that runs while steps run in a thread of
the test process (whatever they print goes on to the one ``sys.stdout``, the command's here)
still runs as a process: ``run_process``. One run here that would replace its process with a
worker, beat or flower (``os.exec*``) fails instead of replacing the test process.
"""

import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from celery import _state as celery_state
from sqlalchemy import Engine, create_engine
from typer.testing import CliRunner

from service.cli import main
from service.cli.app import console
from service.platform.settings import get_settings

ROOT = Path(__file__).resolve().parents[2]
Env = Mapping[str, str | None]
"""Variables to set for one command; ``None`` unsets one."""


def run_process(
    args: Sequence[str], env: Env, answer: str | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m service.cli ARGS`` as a process, with ``env`` over this process's
    environment and this checkout first on its path."""
    merged = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env={name: value for name, value in merged.items() if value is not None},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        input=answer,
        check=False,
    )


def run_cli(
    args: Sequence[str], env: Env, answer: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``flowbeat ARGS`` with ``env`` over this process's environment; ``answer`` is typed at
    its prompt. An exception that escapes ``main`` is printed as the interpreter prints it and
    exits 1, so a test that looks for ``Traceback`` still finds it."""
    runner = CliRunner()
    with runner.isolation(input=answer, env=env) as (out, err, _), _as_a_new_process():
        returncode = _exit_code(args)
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    get_settings.cache_clear()
    return subprocess.CompletedProcess(["flowbeat", *args], returncode, stdout, stderr)


def _exit_code(args: Sequence[str]) -> int:
    """As the interpreter ends: ``SystemExit``'s code, a message for a code that is not a
    number, the traceback of any other exception."""
    with mock.patch.object(sys, "argv", ["flowbeat", *args]):
        try:
            main()
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                return exc.code or 0
            print(exc.code, file=sys.stderr)
            return 1
        except Exception:
            traceback.print_exc()
            return 1
    return 0


@contextmanager
def _as_a_new_process() -> Iterator[None]:
    """Settings read again and the console set up as ``service.cli.app`` sets it at import,
    for the environment and stdout of this command; the environment, the excepthook typer
    installs and the current Celery app put back after it, and the engines and Celery apps
    it made closed."""
    made: list[Engine] = []

    def recorded(*args: Any, **kwargs: Any) -> Engine:
        engine = create_engine(*args, **kwargs)
        made.append(engine)
        return engine

    apps = set(celery_state._apps)
    current = celery_state._tls.current_app
    get_settings.cache_clear()
    try:
        with ExitStack() as patches:
            patches.enter_context(mock.patch.dict(os.environ))
            patches.enter_context(mock.patch.object(sys, "excepthook", sys.excepthook))
            for name in ("execv", "execve"):
                patches.enter_context(mock.patch.object(os, name, _refuse_exec))
            patches.enter_context(mock.patch("service.platform.db.create_engine", recorded))
            patches.enter_context(mock.patch.object(console, "soft_wrap", not console.is_terminal))
            patches.enter_context(mock.patch.object(console, "_width", _columns()))
            yield
    finally:
        for engine in made:
            engine.dispose()
        for app in set(celery_state._apps) - apps:
            app.close()
        celery_state._set_current_app(current)


def _refuse_exec(path: str, *args: Any) -> None:
    raise RuntimeError(f"a command run in the test process would exec {path}: run it as one")


def _columns() -> int | None:
    """The width rich's console takes from ``COLUMNS`` when it is built, else none fixed."""
    columns = console._environ.get("COLUMNS")
    return int(columns) if columns is not None and columns.isdigit() else None
