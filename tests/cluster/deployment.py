"""flowbeat deployed on the hosts of a ``Network`` as an operator would: PostgreSQL and Redis of
their own on a ``db`` host, then ``flowbeat migrate``, two ``flowbeat api``, three ``flowbeat
worker`` and two ``flowbeat beat``, each on a host of its own, from the venv's entry points.

PostgreSQL and Redis listen on two addresses of the db host, so a partition can cut a host off
from one and not the other. Timings are the test stack's (a 3 s lease, a sweep every second, a
3 s beat lock) so that a fault and its recovery fit in seconds.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.cluster.network import Host, Network
from tests.conftest import TEST_PROFILES
from tests.e2e.conftest import ROOT, Proc, wait_for

BIN = Path(sys.executable).parent
PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
API_PORT = 8000
LEASE_S = 3
BEAT_LOCK_TTL_S = 3
TIMINGS = {
    "LEASE_S": str(LEASE_S),
    "VISIBILITY_TIMEOUT_S": "30",
    "UNACKED_RESTORE_INTERVAL_S": "1",
    "SWEEP_INTERVAL_S": "1",
    "STALL_AFTER_S": "20",
    "DISPATCH_GRACE_S": "2",
    "WORKER_PREFETCH": "1",
    "WORKER_HEARTBEAT_S": "1",
    "WORKER_DEAD_AFTER_S": "4",
    "BEAT_LOCK_TTL_S": str(BEAT_LOCK_TTL_S),
    "RUNS_KEPT_PER_PIPELINE": "1000000",
}
READY = {"worker": "ready.", "beat": "beat: Starting"}


def as_postgres(*argv: str) -> list[str]:
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *argv]


class Deployment:
    def __init__(self, net: Network, tmp: Path) -> None:
        self.net, self.tmp = net, tmp
        self.db = net.add_host("db", extra_addresses=1)
        self.apis = [net.add_host(f"api{n}") for n in (1, 2)]
        self.workers = [net.add_host(f"worker{n}") for n in (1, 2, 3)]
        self.beats = [net.add_host(f"beat{n}") for n in (1, 2)]
        self.procs: dict[str, Proc] = {}
        self.retired: list[Proc] = []

    @property
    def pg_address(self) -> str:
        return self.db.addresses[0]

    @property
    def redis_address(self) -> str:
        return self.db.addresses[1]

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.pg_address}:5432/postgres"

    @property
    def broker_url(self) -> str:
        return f"redis://{self.redis_address}:6379/1"

    def api_url(self, host: Host) -> str:
        return f"http://{host.address}:{API_PORT}"

    def env(self, host: Host) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("FLOWBEAT_")}
        return {
            **inherited,
            "PYTHONPATH": str(ROOT),
            "FLOWBEAT_DATABASE_URL": self.database_url,
            "FLOWBEAT_BROKER_URL": self.broker_url,
            "FLOWBEAT_PROFILES_DIR": str(TEST_PROFILES),
            "FLOWBEAT_ACTION_MODULES": "tests.drill_actions",
            "FLOWBEAT_DATA_DIR": str(self.tmp / host.name),
            **{f"FLOWBEAT_{key}": value for key, value in TIMINGS.items()},
        }

    def start_servers(self, data: Path) -> None:
        """PostgreSQL (a data directory of its own, owned by postgres) and Redis, without
        persistence: the drills are about the network, not the disk."""
        shutil.chown(data, "postgres", "postgres")
        initdb = PG_BIN[-1].parent / "initdb"
        subprocess.run(
            as_postgres(str(initdb), "-D", str(data / "pg"), "-U", "postgres", "-A", "trust"),
            check=True,
            capture_output=True,
        )
        with (data / "pg" / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.net.address(0)}/24 trust\n")
        postgres = [
            str(PG_BIN[-1]),
            "-D",
            str(data / "pg"),
            "-c",
            f"listen_addresses={self.pg_address}",
        ]
        postgres += ["-c", f"unix_socket_directories={data}", "-c", "fsync=off"]
        postgres += ["-c", "max_connections=300"]
        self._start("postgres", self.db.argv(*as_postgres(*postgres)), self.db)
        self.procs["postgres"].wait_ready("ready to accept connections", 60)
        redis = ["redis-server", "--bind", self.redis_address, "--port", "6379", "--save", ""]
        redis += ["--appendonly", "no", "--protected-mode", "no", "--dir", str(data)]
        self._start("redis", self.db.argv(*redis), self.db)
        self.procs["redis"].wait_ready("Ready to accept connections", 30)

    def migrate(self) -> None:
        host = self.apis[0]
        done = subprocess.run(
            host.argv(str(BIN / "flowbeat"), "migrate"),
            env=self.env(host),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"flowbeat migrate failed:\n{done.stdout}{done.stderr}"

    def start_all(self) -> None:
        """Every flowbeat process at once, then wait for each: starting them one by one
        would take the sum of their imports."""
        for host in [*self.apis, *self.workers, *self.beats]:
            self.start(host, wait=False)
        for host in [*self.apis, *self.workers, *self.beats]:
            self.await_ready(host)

    def start(self, host: Host, wait: bool = True) -> Proc:
        role = host.name.rstrip("0123456789")
        command = {
            "api": ["api", "--host", host.address, "--port", str(API_PORT)],
            "worker": ["worker", "--concurrency", "2"],
            "beat": ["beat"],
        }[role]
        proc = self._start(host.name, host.argv(str(BIN / "flowbeat"), *command), host)
        if wait:
            self.await_ready(host)
        return proc

    def start_worker(self, host: Host, name: str, queues: str, settings: dict[str, str]) -> Proc:
        """A worker of a scenario's own beside the host's, on ``queues`` only and with its own
        ``FLOWBEAT_`` settings over the deployment's; not restarted by ``running``."""
        argv = host.argv(str(BIN / "flowbeat"), "worker", "--concurrency", "1", "--queues", queues)
        env = {
            **self.env(host),
            "FLOWBEAT_DATA_DIR": str(self.tmp / name),
            **{f"FLOWBEAT_{key}": value for key, value in settings.items()},
        }
        if name in self.procs:
            self.retired.append(self.procs[name])
        proc = self.procs[name] = Proc(argv, env, self.tmp / f"{name}-{len(self.retired)}.log")
        return proc

    def await_ready(self, host: Host, timeout_s: float = 90) -> None:
        proc = self.procs[host.name]
        role = host.name.rstrip("0123456789")
        if role in READY:
            proc.wait_ready(READY[role], timeout_s)
            return
        wait_for(lambda: self.healthy(host) or proc.popen.poll() is not None, timeout_s, host.name)
        if proc.popen.poll() is not None:
            raise AssertionError(f"{host.name} exited early:\n{proc.output()[-3000:]}")

    def healthy(self, host: Host) -> bool:
        try:
            return httpx.get(f"{self.api_url(host)}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _start(self, name: str, argv: list[str], host: Host) -> Proc:
        if name in self.procs:
            self.retired.append(self.procs[name])
        log = self.tmp / f"{name}-{len(self.retired)}.log"
        proc = Proc(argv, self.env(host), log)
        self.procs[name] = proc
        return proc

    def drain(self, host: Host, timeout_s: float = 60) -> None:
        """SIGTERM to the host's main process alone, as Kubernetes stops a pod: a worker's
        warm shutdown lets its running steps finish (docs/guides/deployment.md). A signal to
        the whole process group would reach the pool processes too and cut their steps short."""
        proc = self.procs[host.name]
        proc.popen.send_signal(signal.SIGTERM)
        proc.popen.wait(timeout=timeout_s)
        proc.stop()

    def running(self) -> None:
        """Every flowbeat process up again after a scenario killed some."""
        for host in [*self.apis, *self.workers, *self.beats]:
            if self.procs[host.name].popen.poll() is not None:
                self.start(host)

    def close(self) -> None:
        """flowbeat's processes first, all told at once so that they drain side by side, then
        PostgreSQL and Redis, which they may still be talking to."""
        servers = [p for p in (self.procs.pop(n, None) for n in ("postgres", "redis")) if p]
        flowbeat = [*self.retired, *self.procs.values()]
        for proc in flowbeat:
            if proc.popen.poll() is None:
                os.killpg(proc.popen.pid, signal.SIGTERM)
        for proc in [*flowbeat, *servers]:
            proc.stop()


@contextmanager
def deployed(net: Network, tmp: Path) -> Iterator[Deployment]:
    data = Path(tempfile.mkdtemp(prefix=f"flowbeat-cluster-{net.subnet}-"))
    deployment = Deployment(net, tmp)
    try:
        deployment.start_servers(data)
        deployment.migrate()
        deployment.start_all()
        yield deployment
    finally:
        deployment.close()
        shutil.rmtree(data, ignore_errors=True)
