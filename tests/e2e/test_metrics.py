"""A worker started as operators start it exports what its pool processes did, behind a token,
and logs one JSON object a line with the job, step and attempt of the work it was doing."""

import json
import re
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import Client, Cluster, Proc, wait_for

TOKEN = "scrape-" + uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, flags=re.M)
    return float(match.group(1)) if match else 0.0


def _worker(cluster: Cluster, tmp_path: Path, port: int) -> Proc:
    env = {
        **cluster.env,
        "FLOWBEAT_WORKER_METRICS_PORT": str(port),
        "FLOWBEAT_METRICS_TOKEN": TOKEN,
        "FLOWBEAT_DATA_DIR": str(tmp_path / "data"),
        "FLOWBEAT_LOG_FORMAT": "json",
    }
    argv = [sys.executable, "-m", "service.cli", "worker", "--concurrency", "2"]
    proc = Proc(argv, env, tmp_path / "metrics-worker.log")
    cluster.procs.append(proc)
    proc.wait_ready("ready.")
    return proc


def _scraped(url: str, series: str) -> str | None:
    """The exposition once ``series`` counts one job: a pool process writes its files before
    the job's final status is visible, but a scrape may still race the last one."""
    text = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).text
    return text if _value(text, series) == 1 else None


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_worker_exports_its_pool_processes_counts_behind_a_token(
    client: Client, cluster: Cluster, tmp_path: Path
) -> None:
    port = _free_port()
    worker = _worker(cluster, tmp_path, port)
    url = f"http://127.0.0.1:{port}/metrics"

    job_id = client.submit("flaky", succeed_on=2)
    assert client.wait_final(job_id).job.status == "succeeded"

    assert httpx.get(url, timeout=5).status_code == 401
    finished = 'flowbeat_jobs_finished_total{pipeline="flaky",status="succeeded",trigger="api"}'
    text = wait_for(lambda: _scraped(url, finished), 10, finished)
    assert _value(text, 'flowbeat_step_retries_total{action="fail"}') == 1
    assert _value(text, 'flowbeat_step_duration_seconds_count{action="fail",outcome="error"}') == 1
    assert _value(text, 'flowbeat_step_duration_seconds_count{action="fail",outcome="ok"}') == 1
    waits = 'flowbeat_step_queue_wait_seconds_count{task="flowbeat.run_step"}'
    assert _value(text, waits) == 1, "one message: a retry is no wait, and after followed in it"
    assert str(job_id) not in text

    lines = _json_lines(worker.output())
    assert lines and all({"ts", "level", "logger", "message"} <= set(line) for line in lines)
    counted = [line for line in lines if line["message"] == "drill.count after"]
    assert counted == [counted[0]]
    assert (counted[0]["job_id"], counted[0]["step_id"], counted[0]["attempt"]) == (
        str(job_id),
        "after",
        1,
    )


def test_a_worker_exporter_off_loopback_needs_a_token(cluster: Cluster, tmp_path: Path) -> None:
    env = {
        **cluster.env,
        "FLOWBEAT_WORKER_METRICS_PORT": str(_free_port()),
        "FLOWBEAT_METRICS_HOST": "0.0.0.0",
        "FLOWBEAT_DATA_DIR": str(tmp_path),
    }
    env.pop("FLOWBEAT_METRICS_TOKEN", None)
    done = Proc([sys.executable, "-m", "service.cli", "worker"], env, tmp_path / "refused.log")
    assert done.popen.wait(timeout=60) == 2
    assert "metrics_token_required" in done.output()
