"""The watcher's SSH gate with real ssh, on the head of a testbed: a host whose sshd is not
running (killed, as a fleet's instance is before its user data starts sshd) is held out of
discovery as joining; once a server under its name takes the login, it joins."""
from __future__ import annotations

import sys

from testbed_support import head_run, require_testbed, testbed_factory  # noqa: F401 (a fixture)

from transientvod.testbed import cluster

pytestmark = [require_testbed()]

GATE = """
import sys
from transientvod.spot.hosts import HostStatus
from transientvod.spot.reach.gate import SshGate
hosts = [HostStatus(name, 1) for name in sys.argv[1:]]
print(" ".join(f"{h.name}={h.state}" for h in SshGate().settle(hosts, timeout=30)))
"""


def gate_says(record) -> dict[str, str]:
    names = [h.name for h in record.layout.hosts]
    done = head_run(record.name, [sys.executable, "-c", GATE, *names], timeout=90)
    assert done.returncode == 0, done.stderr
    return dict(pair.split("=") for pair in done.stdout.split())


def test_a_host_without_sshd_stays_joining_until_it_takes_the_login(testbed_factory):
    record = testbed_factory(2)
    h1, h2 = record.layout.hosts
    cluster.kill(record.name, h2.name)  # its sshd is gone with its other processes
    assert gate_says(record) == {h1.name: "usable", h2.name: "joining"}
    cluster.restore(record.name, h2.name)
    assert gate_says(record) == {h1.name: "usable", h2.name: "usable"}
