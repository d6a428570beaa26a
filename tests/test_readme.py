"""Every ``curl`` against the API in the README and the docs pages is sent with curl to a live API
and succeeds.

The pages are read in the order of the site's nav (``mkdocs.yml``), after the README, as a reader
goes through them. A block's command is taken as a user would paste it: ``$KEY`` is an admin
key, ``$ID`` the job the first ``POST /v1/jobs`` (the README's tour) created, ``-H …`` the
authorization header, a ``cursor=…`` the first page, and a file it sends
(``--data-binary @weekly-sedation.yaml``) is the reader's profile of that name, written by the
test. Each answer must be a 2xx or 3xx, unless the
command's own comment (after ``#`` on its lines or on the comment lines right below it) names
the status it answers, as for a diff of a job that stored no items. One command is left out
on purpose: an import from a URL whose host is not this API (``lab.example.org``), since it
needs that host to exist and to be on the operator's allow-list.
"""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from service.platform.auth import create_api_key
from service.platform.db import make_engine, make_session_factory, unit_of_work
from tests.conftest import Stack

ROOT = Path(__file__).resolve().parents[1]
STREAM_READ_S = 3
NO_JOB = "00000000-0000-0000-0000-000000000000"
BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)
EXTERNAL_HOST = re.compile(r"https?://(?!localhost)[a-z0-9.-]+\.[a-z]{2,}")
READERS_PROFILE = """\
name: weekly-sedation
tags: [lit]
steps:
  - id: only
    action: noop
"""


@dataclass
class Example:
    command: str
    comment: str = ""

    def allowed(self) -> set[int]:
        """The error statuses its comment says it may answer."""
        return {int(code) for code in re.findall(r"\b([45]\d\d)\b", self.comment)}


def _nav_pages(entries: object) -> list[str]:
    """The Markdown files of a MkDocs nav, in its order."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in _nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in _nav_pages(value)]
    return []


def documents() -> list[Path]:
    """The README, then every page of the docs site in the order of its nav."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return [ROOT / "README.md", *(ROOT / "docs" / page for page in _nav_pages(nav))]


def readme_curls() -> list[Example]:
    """Each ``curl`` of each bash block with its comment; a line that leaves a quote open, or
    ends in a backslash, goes on with the next."""
    examples: list[Example] = []
    text = "\n".join(path.read_text(encoding="utf-8") for path in documents())
    for block in BLOCK.findall(text):
        pending, current = "", None
        for line in block.splitlines():
            if not pending and line.lstrip().startswith("#"):
                if current is not None:
                    current.comment += line
                continue
            pending = f"{pending}\n{line}" if pending else line
            text = re.sub(r"\\\n\s*", " ", pending)
            try:
                tokens = shlex.split(text, comments=True)
            except ValueError:
                continue
            pending, current = "", None
            if tokens[:1] == ["curl"] and "localhost:8000" in text:
                command, _, comment = text.partition(" #")
                current = Example(command, comment)
                examples.append(current)
    return examples


@pytest.fixture(scope="module")
def api(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path_factory.mktemp("readme") / "api.log"
    argv = [sys.executable, "-m", "uvicorn", "--factory", "api.app:app_from_env"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    env = {**os.environ, **stack.env, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    sessions = make_session_factory(make_engine(stack.database_url))
    with unit_of_work(sessions) as session:
        created, _ = create_api_key(session, owner="readme", scopes=["read", "write", "admin"])
    return created


def _argv(command: str, base: str, key: str, job_id: str) -> list[str]:
    """A stream (``curl -N``) is read for a few seconds: its jobs never end here, no worker runs."""
    text = command.replace("-H …", '-H "Authorization: Bearer $KEY"').replace("=…", "=")
    text = text.replace("$KEY", key).replace("$ID", job_id)
    text = text.replace("localhost:8000", base.removeprefix("http://"))
    argv = [*shlex.split(text, comments=True), "-sS", "-o", "-", "-w", "\n%{http_code}"]
    return [*argv, "--max-time", str(STREAM_READ_S)] if "-N" in argv else argv


def test_the_readme_and_docs_have_api_examples() -> None:
    assert len(readme_curls()) >= 15
    assert any(example.allowed() for example in readme_curls())
    readme = documents()[0].read_text(encoding="utf-8")
    assert any("localhost:8000" in block and "curl" in block for block in BLOCK.findall(readme)), (
        "the README's tour sends a job with curl"
    )


@pytest.mark.e2e  # starts the API as a process
def test_every_readme_curl_succeeds_against_the_api(api: str, key: str, tmp_path: Path) -> None:
    (tmp_path / "weekly-sedation.yaml").write_text(READERS_PROFILE, encoding="utf-8")
    job_id = NO_JOB
    problems = []
    for example in readme_curls():
        command = example.command
        if EXTERNAL_HOST.search(command):
            continue
        done = subprocess.run(
            _argv(command, api, key, job_id),
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
        )
        body, _, status = done.stdout.rpartition("\n")
        first_job = job_id == NO_JOB and command.split()[3].endswith("/v1/jobs")
        if first_job and " -X POST " in command and status == "202":
            job_id = json.loads(body)["job"]["id"]
        if not status.isdigit() or (int(status) >= 400 and int(status) not in example.allowed()):
            problems.append(f"{status} {_error_code(body)}: {command}\n{body[:300]}")
    assert problems == []


def _error_code(body: str) -> str | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        code = parsed["error"].get("code")
        return str(code) if code is not None else None
    return None
