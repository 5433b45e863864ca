"""Namespaces, veth pairs, the switch, link state, shaping and TCP's congestion control: thin
wrappers over `ip` and `tc`.

Each veth pair is created with its ends already in their namespaces (the machine's `eth0`
and the switch port), so nothing ever appears in this machine's own namespace.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

from transientvod.testbed import TestbedError
from transientvod.testbed.layout import INTERFACE, SUBNET, Layout, Machine, link_shape, tbf_burst_bytes

BRIDGE = "br0"
AVAILABLE_CONGESTION = "/proc/sys/net/ipv4/tcp_available_congestion_control"


def run(argv: list[str], what: str) -> str:
    """Run a command; on failure, one sentence saying what could not be done and why."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]} is not installed; the testbed needs iproute2 (ip, tc) and util-linux.") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise TestbedError(f"could not {what}: {why}")
    return done.stdout


def namespace_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def make_switch(layout: Layout) -> None:
    switch = layout.switch
    run(["ip", "netns", "add", switch], f"create the network namespace {switch}")
    run(["ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge"], "create the switch's bridge")
    run(["ip", "-n", switch, "link", "set", BRIDGE, "up"], "bring the switch's bridge up")


def make_machine(layout: Layout, machine: Machine) -> None:
    """A namespace with loopback and eth0, plugged into the switch."""
    ns = machine.name
    run(["ip", "netns", "add", ns], f"create the network namespace {ns}")
    run(["ip", "-n", ns, "link", "set", "lo", "up"], f"bring up loopback in {ns}")
    run(["ip", "link", "add", INTERFACE, "netns", ns, "type", "veth", "peer", "name", machine.name,
         "netns", layout.switch], f"create the link of {ns}")
    run(["ip", "-n", layout.switch, "link", "set", machine.name, "master", BRIDGE, "up"],
        f"plug {ns} into the switch")
    run(["ip", "-n", ns, "addr", "add", f"{machine.address}/24", "dev", INTERFACE], f"give {ns} its address")
    set_link(machine.name, up=True)


def set_link(namespace: str, up: bool) -> None:
    run(["ip", "-n", namespace, "link", "set", INTERFACE, "up" if up else "down"],
        f"set the link of {namespace} {'up' if up else 'down'}")


def link_is_up(namespace: str) -> bool:
    out = run(["ip", "-n", namespace, "-o", "link", "show", INTERFACE], f"read the link of {namespace}")
    return "state UP" in out or ",UP" in out.split(">")[0]


def shape(namespace: str, bandwidth: str) -> None:
    """Limit the machine's egress to a rate with a token bucket (tbf): `bandwidth` is RATE or
    RATE/QUEUE (layout.link_shape)."""
    rate, queue = link_shape(bandwidth)
    run(["tc", "-n", namespace, "qdisc", "replace", "dev", INTERFACE, "root", "tbf", "rate", rate,
         "burst", str(tbf_burst_bytes(rate)), "latency", queue],
        f"shape {namespace} to {rate} (tc rejected it; give a rate such as 100mbit or 1gbit)")


def available_congestion_controls() -> list[str]:
    try:
        with open(AVAILABLE_CONGESTION) as f:
            return f.read().split()
    except OSError:
        return []


def check_congestion(algorithm: str) -> None:
    """One sentence if this kernel lacks the congestion control (tcp_<name> not loaded)."""
    available = available_congestion_controls()
    if algorithm not in available:
        raise TestbedError(f"--congestion is {algorithm!r}; this kernel offers {', '.join(available) or 'none'} "
                           f"({AVAILABLE_CONGESTION}; modprobe tcp_{algorithm} adds it where the module exists).")


def set_congestion(machine: Machine, algorithm: str) -> None:
    """Every TCP connection the machine makes or accepts on the testbed's subnet uses `algorithm`.

    Set on the subnet's route (`congctl`), not with the namespace's sysctl: outside the first
    namespace the kernel lets the sysctl choose only from net.ipv4.tcp_allowed_congestion_control,
    a setting of the whole machine, while a route may name any congestion control the kernel
    has. The kernel re-creates the route without it whenever the link comes up again, so the
    testbed sets it again then (cluster.restore)."""
    run(["ip", "-n", machine.name, "route", "replace", f"{SUBNET}.0/24", "dev", INTERFACE, "proto", "kernel",
         "scope", "link", "src", machine.address, "congctl", algorithm],
        f"set TCP's congestion control of {machine.name} to {algorithm}")


def congestion(namespace: str) -> str:
    """The congestion control the machine's subnet route names, or 'default' (the kernel's)."""
    out = run(["ip", "-n", namespace, "route", "show", f"{SUBNET}.0/24"], f"read the routes of {namespace}")
    words = out.split()
    return words[words.index("congctl") + 1] if "congctl" in words else "default"


def shaping(namespace: str) -> str:
    out = run(["tc", "-n", namespace, "qdisc", "show", "dev", INTERFACE], f"read the shaping of {namespace}")
    for line in out.splitlines():
        words = line.split()
        if "tbf" in words:
            # tc prints "... tbf 8001: root refcnt 2 rate 25Mbit burst 31250b lat 400ms": RATE/QUEUE
            rate = words[words.index("rate") + 1] if "rate" in words else "tbf"
            return f"{rate}/{words[words.index('lat') + 1]}" if "lat" in words else rate
    return "none"


def pids(namespace: str) -> list[int]:
    if not namespace_exists(namespace):
        return []
    out = run(["ip", "netns", "pids", namespace], f"list the processes of {namespace}")
    return [int(p) for p in out.split()]


def signal_all(namespace: str, signum: int) -> int:
    """Send `signum` to every process in the namespace, again until no new one appears
    (a process may fork while we go through the list). Returns how many were signalled."""
    done: set[int] = set()
    for _ in range(20):
        new = [p for p in pids(namespace) if p not in done]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
            done.add(pid)
    return len(done)


def kill_all(namespace: str, wait_seconds: float = 5.0) -> None:
    """SIGKILL every process in the namespace and wait until they are gone."""
    deadline = time.monotonic() + wait_seconds
    while pids(namespace) and time.monotonic() < deadline:
        signal_all(namespace, signal.SIGKILL)
        time.sleep(0.05)


def delete_namespace(namespace: str) -> None:
    """Remove a namespace (its veth ends go with it); nothing if it does not exist."""
    if namespace_exists(namespace):
        kill_all(namespace)
        run(["ip", "netns", "delete", namespace], f"delete the network namespace {namespace}")
