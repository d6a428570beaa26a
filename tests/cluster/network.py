"""Hosts on one machine: a network namespace per host, each joined by a veth pair to a bridge
of the run's own in the root namespace, on a /24 of 10.231.0.0/16 that no other run holds.

The bridge is the claim: creating ``fbc<n>`` fails when another run holds ``n``, so parallel
runs never share a name or a subnet. A run writes its pid under ``STATE`` beside the claim, and
the next run takes apart whatever a run that died (SIGKILL, a lost machine) left behind. The
hosts have no default route and the root namespace does not forward, so the only addresses a
host can reach are the run's own; ``partition`` drops packets (``ip rule … blackhole``) in both
directions, which looks to either side like a cable pulled, not a refused connection.
"""

import contextlib
import ipaddress
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "fbc"
STATE = Path("/run/flowbeat-cluster")
SUBNETS = range(1, 255)


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def usable() -> str | None:
    """Why network namespaces cannot be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    try:
        ip("netns", "list")
    except (OSError, RuntimeError) as exc:
        return f"no ip netns: {exc}"
    return None


@dataclass
class Host:
    name: str
    netns: str
    addresses: list[str]

    @property
    def address(self) -> str:
        return self.addresses[0]

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside the host, as its own process (``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", self.netns, *command]

    def pids(self) -> list[int]:
        return [int(pid) for pid in ip("netns", "pids", self.netns).split()]

    def kill_all(self) -> dict[int, float]:
        """SIGKILL every process of the host at once, as a lost machine; each pid and when."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return dict.fromkeys(pids, time.time())


@dataclass
class Network:
    subnet: int
    hosts: dict[str, Host] = field(default_factory=dict)
    _rules: set[tuple[str, str, str]] = field(default_factory=set)

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.subnet}"

    def address(self, last: int) -> str:
        return f"10.231.{self.subnet}.{last}"

    @property
    def machine(self) -> str:
        """The bridge's address: the machine itself (the test, as a client) on the network."""
        return self.address(1)

    def add_host(self, name: str, extra_addresses: int = 0) -> Host:
        """A namespace with loopback and one interface on the bridge; ``extra_addresses`` more
        addresses on it, for servers a partition must tell apart on one host."""
        index = len(self.hosts)
        netns, outside, inside = f"{self.bridge}-{name}", f"{self.bridge}v{index}", "eth0"
        ip("netns", "add", netns)
        ip(
            "link",
            "add",
            outside,
            "type",
            "veth",
            "peer",
            "name",
            f"{self.bridge}p",
            "netns",
            netns,
        )
        ip("-n", netns, "link", "set", f"{self.bridge}p", "name", inside)
        ip("link", "set", outside, "master", self.bridge, "up")
        first = 10 + 10 * index
        addresses = [self.address(first + n) for n in range(extra_addresses + 1)]
        for address in addresses:
            ip("-n", netns, "addr", "add", f"{address}/24", "dev", inside)
        ip("-n", netns, "link", "set", inside, "up")
        ip("-n", netns, "link", "set", "lo", "up")
        host = Host(name, netns, addresses)
        self.hosts[name] = host
        return host

    def partition(self, host: Host, targets: Iterable[str]) -> None:
        """Drop every packet between ``host`` and each target address (``machine`` among
        them: the root namespace), both ways."""
        for target in targets:
            self._rule(host.netns, "to", target)
            self._rule(self._owner(target), "from", target, "to", host.address)

    def heal(self) -> None:
        for netns, direction, spec in sorted(self._rules):
            ip(*_in(netns), "rule", "del", direction, *spec.split(), "blackhole")
        self._rules.clear()

    def _rule(self, netns: str, *spec: str) -> None:
        ip(*_in(netns), "rule", "add", *spec, "blackhole")
        self._rules.add((netns, spec[0], " ".join(spec[1:])))

    def _owner(self, address: str) -> str:
        """The namespace that holds ``address``; ``""`` for the root namespace."""
        if address == self.machine:
            return ""
        return next(h.netns for h in self.hosts.values() if address in h.addresses)

    def close(self) -> None:
        take_apart(self.subnet)


def _in(netns: str) -> list[str]:
    return ["-n", netns] if netns else []


def take_apart(subnet: int) -> None:
    """Kill every process in the run's namespaces, then delete them (their veths and rules go
    with them), the root namespace's rules for the run's addresses, and the bridge; each step
    goes on whatever the one before it left."""
    bridge = f"{PREFIX}{subnet}"
    for rule in ip("rule", "show").splitlines():
        if f" 10.231.{subnet}." in rule and rule.split(":")[0].isdigit():
            ip("rule", "del", "pref", rule.split(":")[0], check=False)
    spaces = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
    ours = [name for name in spaces if name.startswith(f"{bridge}-")]
    for netns in ours:
        for pid in ip("netns", "pids", netns, check=False).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for netns in ours:
        _await_empty(netns)
        ip("netns", "del", netns, check=False)
    ip("link", "del", bridge, check=False)
    (STATE / str(subnet)).unlink(missing_ok=True)


def _await_empty(netns: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while ip("netns", "pids", netns, check=False).split() and time.monotonic() < deadline:
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def sweep_dead_runs() -> None:
    """Take apart what runs that died without cleaning up left behind."""
    STATE.mkdir(parents=True, exist_ok=True)
    for claim in STATE.iterdir():
        with contextlib.suppress(ValueError):
            if not _alive(int(claim.read_text())):
                take_apart(int(claim.name))


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A bridge on a free subnet, taken apart at the end whatever happened; subnets are tried
    in random order so that runs starting together seldom try the same one first."""
    sweep_dead_runs()
    for subnet in random.sample(SUBNETS, len(SUBNETS)):
        bridge = f"{PREFIX}{subnet}"
        if (
            subprocess.run(
                ["ip", "link", "add", bridge, "type", "bridge"], check=False, capture_output=True
            ).returncode
            == 0
        ):
            break
    else:
        raise RuntimeError("every 10.231.n.0/24 is held by another run")
    (STATE / str(subnet)).write_text(str(os.getpid()))
    net = Network(subnet)
    try:
        gateway = ipaddress.ip_interface(f"{net.address(1)}/24")
        ip("addr", "add", str(gateway), "dev", bridge)
        ip("link", "set", bridge, "up")
        yield net
    finally:
        net.close()
