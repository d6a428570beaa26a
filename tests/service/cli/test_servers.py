"""``flowbeat api`` believes forwarded headers only from the proxies it is told to trust: behind
a proxy that terminates TLS, the dashboard's login cookie is then Secure, and a client that
merely claims https does not change what the API believes."""

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.platform.auth import create_api_key
from service.platform.db import make_engine, make_session_factory, unit_of_work
from tests.conftest import Stack
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e  # starts the API as a process

ROOT = Path(__file__).resolve().parents[3]
PROXY = "127.0.0.2"
STRANGER = "127.0.0.3"
"""Loopback addresses other than 127.0.0.1, which uvicorn trusts by default."""


@pytest.fixture(scope="module")
def api(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        **stack.env,
        "PYTHONPATH": str(ROOT),
        "FLOWBEAT_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "FLOWBEAT_FORWARDED_ALLOW_IPS": PROXY,
    }
    log = tmp_path_factory.mktemp("api") / "api.log"
    argv = [sys.executable, "-m", "service.cli", "api", "--port", str(port)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(base) or proc.poll() is not None, 60, "the API")
        assert proc.poll() is None, log.read_text()
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    sessions = make_session_factory(make_engine(stack.database_url))
    with unit_of_work(sessions) as session:
        created, _ = create_api_key(session, owner="proxied", scopes=["read"])
    return created


def _login_cookie(base: str, key: str, source: str) -> str:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=10) as client:
        answer = client.post(
            f"{base}/ui/login", data={"key": key}, headers={"X-Forwarded-Proto": "https"}
        )
    assert answer.status_code == 303, answer.text
    return answer.headers["set-cookie"].lower()


@pytest.mark.timeout(90)
def test_a_login_through_a_trusted_tls_proxy_gets_a_secure_cookie(api: str, key: str) -> None:
    assert "; secure" in _login_cookie(api, key, PROXY)


@pytest.mark.timeout(90)
def test_a_client_that_is_not_a_trusted_proxy_cannot_claim_https(api: str, key: str) -> None:
    assert "secure" not in _login_cookie(api, key, STRANGER)


def test_a_worker_on_a_pool_that_cannot_enforce_step_timeouts_says_so(
    stack: Stack, tmp_path: Path
) -> None:
    """The broker is a closed port: the worker never takes a message, it only starts."""
    env = {
        **os.environ,
        **stack.env,
        "PYTHONPATH": str(ROOT),
        "FLOWBEAT_DATA_DIR": str(tmp_path),
        "FLOWBEAT_BROKER_URL": "redis://127.0.0.1:1/0",
    }
    argv = [sys.executable, "-m", "service.cli", "worker", "--pool", "threads"]
    proc = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
    finally:
        proc.kill()
        proc.wait(timeout=30)

    assert first.startswith("warning: the threads pool does not hold steps to their timeout_s")
