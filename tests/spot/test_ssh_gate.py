"""The watcher's SSH gate (spot/reach/gate.py): running hosts join discovery only once the
launcher can log in. Here with a probe function of the test's own, for the gate's rules; on
real hosts with real ssh in tests/testbed/test_ssh_gate_real_hosts.py."""
from __future__ import annotations

import threading

from transientvod.config import load_config
from transientvod.spot.hosts import GONE, JOINING, NOTICED, USABLE, HostStatus
from transientvod.spot.reach.gate import SshGate, gate_for


class Probe:
    """Answers like reach/ssh.py's probe: None when the host takes the login, else ssh's last line."""

    def __init__(self):
        self.ready: set[str] = set()
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, host: str) -> str | None:
        with self.lock:
            self.calls.append(host)
        return None if host in self.ready else f"ssh: connect to host {host} port 22: Connection refused"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def states(hosts: list[HostStatus]) -> dict[str, str]:
    return {h.name: h.state for h in hosts}


def make_gate(probe: Probe, clock: Clock, local=("local",)) -> SshGate:
    return SshGate(probe_host=probe, is_remote=lambda host: host not in local, clock=clock)


def test_a_host_joins_once_it_takes_the_login_and_is_probed_at_most_once_per_interval():
    probe, clock = Probe(), Clock()
    gate = make_gate(probe, clock)
    hosts = [HostStatus("a", 1), HostStatus("b", 1)]
    probe.ready.add("a")
    assert states(gate.settle(hosts, timeout=10)) == {"a": USABLE, "b": JOINING}
    for _ in range(5):  # the watcher polls every few seconds; the probe waits for its interval
        gate.settle(hosts, timeout=10)
    assert probe.calls.count("b") == 1 and probe.calls.count("a") == 1
    probe.ready.add("b")
    clock.now += 10.0
    assert states(gate.settle(hosts, timeout=10)) == {"a": USABLE, "b": USABLE}
    assert probe.calls.count("b") == 2 and probe.calls.count("a") == 1  # a joined host is not probed again


def test_local_hosts_are_not_probed_and_noticed_or_gone_hosts_keep_their_state():
    probe, clock = Probe(), Clock()
    gate = make_gate(probe, clock)
    hosts = [HostStatus("local", 1), HostStatus("n", 1, state=NOTICED), HostStatus("g", 1, state=GONE)]
    assert states(gate.settle(hosts, timeout=10)) == {"local": USABLE, "n": NOTICED, "g": GONE}
    assert probe.calls == []


def test_a_host_that_left_is_probed_again_when_a_server_comes_back_under_its_name():
    probe, clock = Probe(), Clock()
    gate = make_gate(probe, clock)
    probe.ready.add("a")
    assert states(gate.settle([HostStatus("a", 1)], timeout=10)) == {"a": USABLE}
    gate.admit([HostStatus("a", 1, state=GONE)])
    probe.ready.discard("a")  # the replacement is still installing
    assert states(gate.settle([HostStatus("a", 1)], timeout=10)) == {"a": JOINING}
    assert probe.calls == ["a", "a"]


def test_the_gate_watches_cloud_providers_unless_turned_off(tmp_path):
    def spot(**values):
        return load_config(None, [f"spot.{k}={v}" for k, v in values.items()]).spot

    assert gate_for(spot(provider="aws", job_tag="j", region="us-east-1")) is not None
    assert gate_for(spot(provider="gce", job_label="j")) is not None
    assert gate_for(spot(provider="aws", job_tag="j", region="us-east-1", wait_for_ssh="false")) is None
    assert gate_for(spot(provider="trace", trace="k80_spot_2workers_vm_trace.csv")) is None  # the user's own hosts
