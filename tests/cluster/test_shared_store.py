"""A download on one worker host and its parse on another (issue 31): the ``fetch`` queue's
worker runs on worker1, the ``parse`` queue's on worker2, and the ``shared-store`` pipeline
sends each step to its queue. With a shared directory or an S3 bucket served from a host of
its own as ``FLOWBEAT_DATA_STORE``, the parse reads what the download wrote; with each host's
own data directory, the defect the setting fixes, the parse fails as ``data_file_missing``.

The files come from a server the test runs on the machine's address on the hosts' network; the
S3-compatible server (moto's) listens on the ``store`` host's address alone.
"""

import hashlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chaos.load import write_key
from tests.cluster.deployment import Deployment
from tests.cluster.network import Host
from tests.e2e.conftest import Client, Proc, wait_for
from tests.support.files import CSV, bucket_keys, create_bucket, file_server

S3_PORT = 9000
DIGEST = hashlib.sha256(CSV).hexdigest()
ROWS = [
    {"code": "GB", "name": "United Kingdom", "population": "68350000"},
    {"code": "FR", "name": "France", "population": "68170000"},
    {"code": "IS", "name": "Iceland", "population": None},
]


@pytest.fixture(scope="module")
def files(deployment: Deployment) -> Iterator[str]:
    with file_server(deployment.net.machine) as url:
        yield url


@pytest.fixture(scope="module")
def s3(deployment: Deployment) -> Iterator[str]:
    """moto's S3 on a host of its own, bound to that host's address."""
    net = deployment.net
    store = net.hosts.get("store") or net.add_host("store")
    argv = store.argv(sys.executable, "-m", "moto.server", "-H", store.address, "-p", str(S3_PORT))
    proc = Proc(argv, {"PATH": "/usr/bin:/bin"}, deployment.tmp / "s3.log")
    try:
        proc.wait_ready("Running on", 60)
        yield f"http://{store.address}:{S3_PORT}"
    finally:
        proc.stop()


def _store_settings(variant: str, deployment: Deployment, s3: str) -> dict[str, str]:
    if variant == "shared-directory":
        return {"DATA_STORE": str(deployment.tmp / "shared")}
    if variant == "s3":
        bucket = f"flowbeat-{uuid.uuid4().hex[:12]}"
        create_bucket(s3, bucket)
        return {
            "DATA_STORE": f"s3://{bucket}/data",
            "DATA_STORE_ENDPOINT": s3,
            "SECRET_DATA_STORE_ACCESS_KEY_ID": "flowbeat-test",
            "SECRET_DATA_STORE_SECRET_ACCESS_KEY": "flowbeat-secret",
        }
    return {}


def _workers(hosts: Deployment, variant: str, settings: dict[str, str]) -> list[Proc]:
    opened = {"EGRESS_ALLOW_HTTP": "true", "EGRESS_INTERNAL_HOSTS": hosts.net.machine}
    procs = [
        hosts.start_worker(host, f"{queue}-{variant}", queue, {**opened, **settings})
        for host, queue in ((hosts.workers[0], "fetch"), (hosts.workers[1], "parse"))
    ]
    for proc in procs:
        proc.wait_ready("ready.", 90)
    return procs


def _run(hosts: Deployment, api: Host, key: str, url: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=hosts.api_url(api), headers=headers, timeout=30) as http:
        body = {"pipeline": "shared-store", "params": {"url": url}}
        answer = http.post("/v1/jobs", json=body)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job"]["id"]

        def final() -> dict[str, Any] | None:
            job: dict[str, Any] = http.get(f"/v1/jobs/{job_id}").json()["job"]
            return job if job["status"] in {"succeeded", "failed"} else None

        found: dict[str, Any] = wait_for(final, 60, f"job {job_id} to finish")
        return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("variant", ["shared-directory", "s3", "per-host-directories"])
def test_a_download_and_its_parse_on_two_worker_hosts(
    hosts: Deployment, reader: Client, files: str, s3: str, variant: str
) -> None:
    settings = _store_settings(variant, hosts, s3)
    procs = _workers(hosts, variant, settings)
    try:
        job = _run(hosts, hosts.apis[0], write_key(reader), f"{files}/countries.csv")
    finally:
        for proc in procs:
            proc.stop()
    steps = {step["step_id"]: step for step in job["steps"]}
    assert steps["download"]["status"] == "succeeded", steps["download"]
    downloaded = list((hosts.tmp / f"fetch-{variant}").rglob("*.csv"))
    if variant == "per-host-directories":
        assert job["status"] == "failed"
        error = steps["parse"]["error"]
        assert error["code"] == "data_file_missing", error
        assert "FLOWBEAT_DATA_STORE" in error["message"]
        assert [p.relative_to(hosts.tmp / f"fetch-{variant}") for p in downloaded] == [
            Path(error["details"]["path"])
        ], "the file is on the download's host alone"
        return
    assert (job["status"], job["result"]) == ("succeeded", {"parse": ROWS}), steps
    assert downloaded == [], "the download went to the store, not the worker's own directory"
    if variant == "s3":
        bucket = settings["DATA_STORE"].removeprefix("s3://").split("/")[0]
        assert [k for k in bucket_keys(s3, bucket) if k.endswith(".csv")] == [
            f"data/downloads/{DIGEST}.csv"
        ]
    else:
        assert (Path(settings["DATA_STORE"]) / f"downloads/{DIGEST}.csv").read_bytes() == CSV
