"""What a testbed is made of: names, addresses and the link rate. Pure: nothing is created here.

Every machine (the head and each host) is a network namespace named after its host name,
with one interface `eth0` plugged into a switch: a Linux bridge in a namespace of its own.
All are named `<testbed>-...`, so two testbeds with different names never share anything.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from transientvod.testbed import TestbedError

MIN_HOSTS, MAX_HOSTS = 2, 64
SUBNET = "10.213.0"  # a /24 that exists only inside the testbed's namespaces
HEAD_OCTET, FIRST_HOST_OCTET = 1, 11
INTERFACE = "eth0"  # the same name on every machine, as on a cloud's VMs
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # short: bridge ports are named <host>, <= 15 chars
RATE_PATTERN = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
QUEUE_PATTERN = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
CONGESTION_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,15}$")  # a kernel TCP congestion control: cubic, bbr, reno
# How long a packet may wait in tbf's bucket before it is dropped. 50 ms drops under the
# exchange's bursts (TCP then recovers the losses); a deep queue, 400 ms, drops none. Which one
# a cloud's rate limiter is like is not known here, so the queue is part of the link's spec.
DEFAULT_QUEUE = "50ms"


@dataclass(frozen=True)
class Machine:
    name: str  # host name, namespace name and switch port name
    address: str
    role: str  # "head" or "host"


@dataclass(frozen=True)
class Layout:
    name: str
    machines: tuple[Machine, ...]
    bandwidth: str  # each host's egress: "RATE" or "RATE/QUEUE" (link_shape), "" for unshaped
    # Every machine's TCP congestion control ("cubic", "bbr"), "" for this machine's default. On a
    # shaped link it decides how much of the link a ring allreduce gets (benchmarks/RESULTS.md:
    # at 25 Mbit, BBR 85 % of it, CUBIC 96 %).
    congestion: str = ""

    @property
    def head(self) -> Machine:
        return self.machines[0]

    @property
    def hosts(self) -> tuple[Machine, ...]:
        return self.machines[1:]

    @property
    def switch(self) -> str:
        return f"{self.name}-switch"

    def machine(self, name: str) -> Machine:
        for machine in self.hosts:
            if machine.name == name:
                return machine
        known = ", ".join(m.name for m in self.hosts)
        raise TestbedError(f"there is no host {name!r} in testbed {self.name!r}; its hosts are {known}.")


def plan(name: str, hosts: int, bandwidth: str = "", congestion: str = "") -> Layout:
    """The layout of a testbed, or one sentence saying which argument to fix."""
    if not NAME_PATTERN.match(name):
        raise TestbedError(f"the testbed name {name!r} must be 1-8 lowercase letters or digits, starting with a letter.")
    if not MIN_HOSTS <= hosts <= MAX_HOSTS:
        raise TestbedError(f"--hosts is {hosts}; a testbed has between {MIN_HOSTS} and {MAX_HOSTS} hosts.")
    if bandwidth:
        link_shape(bandwidth)
    if congestion and not CONGESTION_PATTERN.match(congestion):
        raise TestbedError(f"--congestion is {congestion!r}; give the name of a TCP congestion control such as "
                           "cubic or bbr.")
    head = Machine(f"{name}-head", f"{SUBNET}.{HEAD_OCTET}", "head")
    members = [Machine(f"{name}-h{i + 1}", f"{SUBNET}.{FIRST_HOST_OCTET + i}", "host") for i in range(hosts)]
    return Layout(name, (head, *members), bandwidth, congestion)


def link_shape(bandwidth: str) -> tuple[str, str]:
    """'25mbit' or '25mbit/400ms': (tc rate, tbf queue latency), or one sentence saying what to fix."""
    rate, _, queue = bandwidth.strip().lower().partition("/")
    rate_bits_per_second(rate)
    queue = queue or DEFAULT_QUEUE
    match = QUEUE_PATTERN.match(queue)
    if not match or float(match.group(1)) <= 0:
        raise TestbedError(f"the queue in {bandwidth!r} is not a time tc understands; give RATE/QUEUE such as "
                           "25mbit/400ms (the queue is how long a packet may wait before tbf drops it).")
    return rate, queue


def rate_bits_per_second(rate: str) -> float:
    """A tc rate ('100mbit', '1gbit', '12.5mbps') in bits per second."""
    match = RATE_PATTERN.match(rate.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise TestbedError(f"the bandwidth {rate!r} is not a rate tc understands; give one such as 100mbit or 1gbit.")
    return float(match.group(1)) * RATE_UNITS[match.group(2)]


def tbf_burst_bytes(rate: str) -> int:
    """The token bucket's depth: 10 ms at the rate, and at least a few full frames.

    tbf needs a bucket of at least rate / HZ bytes to reach its rate at all; 10 ms is above
    that for any kernel HZ, and small enough that the link still behaves like one of that rate."""
    return max(16 * 1514, int(rate_bits_per_second(rate) / 8 / 100))


def hosts_file(layout: Layout, own: Machine) -> str:
    """/etc/hosts as a machine of this testbed sees it.

    Its own name maps to 127.0.1.1, as Debian's installer writes it (and as on many cloud
    images): the case in which Gloo, resolving the hostname, would hand its peers a loopback
    address. Every other machine maps to its address on the switch."""
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{own.name}"]
    lines += [f"{m.address}\t{m.name}" for m in layout.machines if m != own]
    lines += ["::1\tlocalhost ip6-localhost ip6-loopback"]
    return "\n".join(lines) + "\n"
