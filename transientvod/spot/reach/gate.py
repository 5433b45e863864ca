"""A cloud lists a server as running long before it can run a worker: a fleet's instance is
`running` while its user data still installs the project, and it takes the launcher's key
only at the end (spot/provisioning/user_data.py). Listed in discovery then, horovodrun fails to start a
worker there, and that stops the whole job (tests/testbed/test_fleet_join.py saw it).

So the watcher holds each remote host as JOINING until the launcher can log in to it, probing
`ssh HOST true` (reach/ssh.py's probe, horovodrun's own options) in the background, at most once
every PROBE_INTERVAL_SECONDS per host, so a slow cloud API poll never waits for SSH. The test
is the very thing horovodrun needs, whatever made the host ready (user data, a baked image,
a hand-started sshd), and it works for every provider. Local hosts are not probed; a host
that left is forgotten, so a replacement under its name is probed again.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

from transientvod.spot.hosts import GONE, JOINING, USABLE, HostStatus
from transientvod.spot.reach.ssh import MAX_PARALLEL, probe, remote_hosts

log = logging.getLogger(__name__)

PROBE_INTERVAL_SECONDS = float(os.environ.get("TRANSIENTVOD_SSH_PROBE_INTERVAL", "10"))


CLOUD_PROVIDERS = ("aws", "gce")  # a trace replay's hosts are the user's own, up from the start


def gate_for(spot) -> "SshGate | None":
    """The gate a watcher of this `spot` config uses, or None (trace replays; wait_for_ssh off)."""
    return SshGate() if spot.provider in CLOUD_PROVIDERS and spot.wait_for_ssh else None


class SshGate:
    def __init__(self, probe_host=probe, is_remote=lambda host: bool(remote_hosts([host])), clock=time.monotonic):
        self._probe = probe_host
        self._is_remote = is_remote
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=MAX_PARALLEL, thread_name_prefix="ssh-gate")
        self._ready: set[str] = set()
        self._probing: dict[str, Future] = {}
        self._last_probe: dict[str, float] = {}
        self._last_answer: dict[str, str] = {}

    def admit(self, hosts: list[HostStatus]) -> list[HostStatus]:
        """`hosts` with every usable remote host that does not yet take the launcher's SSH login
        as JOINING; starts the probes it needs."""
        admitted = []
        for host in hosts:
            if host.state == GONE:
                self._forget(host.name)
            if host.state == USABLE and not self._is_ready(host.name):
                host = dataclasses.replace(host, state=JOINING)
            admitted.append(host)
        return admitted

    def settle(self, hosts: list[HostStatus], timeout: float) -> list[HostStatus]:
        """`admit`, after waiting up to `timeout` for the probes it starts: the launcher's first
        state, so that hosts ready at launch are in discovery from Horovod's first call."""
        self.admit(hosts)
        wait(list(self._probing.values()), timeout=timeout)
        return self.admit(hosts)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _is_ready(self, name: str) -> bool:
        if name in self._ready:
            return True
        running = self._probing.get(name)
        if running is not None and running.done():
            del self._probing[name]
            answer = running.result()
            if answer is None:
                log.info("host %s takes the launcher's SSH login; it joins discovery", name)
                self._ready.add(name)
                return True
            if self._last_answer.get(name) != answer:
                log.info("host %s is running but does not take the launcher's SSH login yet (%s); held out of "
                         "discovery until it does", name, answer)
                self._last_answer[name] = answer
        elif running is None:
            if not self._is_remote(name):
                self._ready.add(name)
                return True
            now = self._clock()
            if now - self._last_probe.get(name, -PROBE_INTERVAL_SECONDS) >= PROBE_INTERVAL_SECONDS:
                self._last_probe[name] = now
                self._probing[name] = self._pool.submit(self._probe, name)
        return False

    def _forget(self, name: str) -> None:
        self._ready.discard(name)
        self._last_probe.pop(name, None)
        self._last_answer.pop(name, None)
