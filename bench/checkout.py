"""A second checkout of this repository at another revision, for a bench's "base" side.

``git worktree add --detach`` makes it in a temp directory; it is removed on the way out. The
base side's processes run this venv's interpreter with the checkout as their working directory
and first on ``sys.path``, so they import the checkout's ``service``, ``tasks`` and ``api``
(the venv's editable install of flowbeat comes after ``sys.path``). Each process is started
through ``BOOT``, which logs where those packages resolve from and exits if any is not the
checkout: a base that silently ran the head's code would measure nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.harness import REPO, log

PACKAGES = ("service", "tasks", "api")
MARKER = "bench checkout:"
BOOT = f"""
import importlib.util, os, runpy, sys
sys.path[0] = os.getcwd()
checkout, module, *args = sys.argv[1:]
origins = {{name: importlib.util.find_spec(name).origin for name in {PACKAGES!r}}}
print("{MARKER}", ", ".join(f"{{n}} from {{o}}" for n, o in origins.items()), file=sys.stderr,
      flush=True)
strays = [o for o in origins.values() if not (o or "").startswith(checkout + os.sep)]
if strays:
    sys.exit(f"{MARKER} not the checkout {{checkout}}: {{strays}}")
sys.argv = [module, *args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""
"""Run ``module`` as ``python -m`` would (the working directory first on ``sys.path``), once
the packages are known to resolve to the checkout; ``find_spec`` imports none of them, so the
process imports what it would have imported anyway, in the same order."""


@dataclass(frozen=True)
class Checkout:
    root: Path
    rev: str
    commit: str

    def launch(self, argv: list[str]) -> list[str]:
        """``[python, -m, module, *args]`` as run on the checkout's code, through ``BOOT``."""
        if argv[:2] != [sys.executable, "-m"]:
            raise ValueError(f"not a `python -m` command line: {argv[:3]}")
        return [sys.executable, "-c", BOOT, str(self.root), *argv[2:]]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, "PYTHONPATH": str(self.root)}

    def run(self, argv: list[str], env: dict[str, str]) -> str:
        """A short ``python -m`` command on the checkout's code; its standard output, or an
        error carrying what it printed."""
        command = " ".join(argv[2:])
        done = subprocess.run(
            self.launch(argv),
            env=self.env(env),
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(
                f"{command} in the base checkout exited {done.returncode}:\n"
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        confirm(done.stderr, command)
        return done.stdout


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextmanager
def worktree(rev: str) -> Iterator[Checkout]:
    """``rev`` checked out, detached, in a temp directory; removed (``--force``, then a prune of
    the worktree list) when the context exits, failures and SIGTERM included."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    parent = Path(tempfile.mkdtemp(prefix="flowbeat-bench-base-"))
    root = parent / commit[:12]
    try:
        _git("worktree", "add", "--detach", str(root), commit)
        log(f"base: {rev} ({commit[:12]}) checked out in {root}")
        yield Checkout(root, rev, commit)
    finally:
        if root.exists():
            remove = ["git", "worktree", "remove", "--force", str(root)]
            subprocess.run(remove, cwd=REPO, check=False)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, check=False)
        shutil.rmtree(parent, ignore_errors=True)
        log(f"base: worktree {root} removed")


def confirm(output: str, where: str) -> None:
    """Log the line ``BOOT`` wrote into a base process's ``output``: where its code came from."""
    for line in output.splitlines():
        if line.startswith(MARKER):
            log(f"base: {where}: {line.removeprefix(MARKER).strip()}")
            return
    raise RuntimeError(f"{where} printed no line saying where its code came from")
