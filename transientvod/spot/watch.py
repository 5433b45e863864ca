"""The watcher: asks a provider every few seconds and writes the host-state file.

`launch/spot_hosts.py` (run by Horovod every second) only reads the file this loop writes,
so discovery stays fast however slow the cloud API is. When replaying a trace, the watcher
also plays the cloud's part at a revocation (`revoke`): by default it kills the worker
processes still running on the revoked host, which is what makes the no-notice case a real
failure; on a testbed, the launcher passes one that makes the host vanish from the network.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable

from transientvod.spot.hosts import GONE, NOTICED, HostState, registered_workers, write_host_state
from transientvod.spot.providers.provider import ProviderError, SpotProvider

log = logging.getLogger(__name__)

WATCH_POLL_SECONDS = float(os.environ.get("TRANSIENTVOD_WATCH_POLL_SECONDS", "2"))


def kill_workers(state_file, host: str) -> list[int]:
    """SIGKILL the registered workers of `host` that are still alive; returns their pids."""
    killed = []
    for pid in registered_workers(state_file, host):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass  # Horovod already removed it (the graceful path)
    return killed


def workers_killer(state_file) -> Callable[[str], str]:
    """The default revocation of a replay: SIGKILL the host's registered workers."""
    def kill(host: str) -> str:
        killed = kill_workers(state_file, host)
        return f"killed its workers {killed}" if killed else "no worker of it was left"
    return kill


def wait_for_workers(state_file, hosts: list[str], timeout: float, stop: threading.Event) -> bool:
    """Wait until every host in `hosts` has a registered worker (the job is running there).

    A replayed trace starts its clock here, not when horovodrun was launched: trace second 0
    is the cluster's start in the study, and starting workers on a small machine takes a
    while. Returns False after `timeout` seconds (the replay then starts anyway)."""
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        if all(registered_workers(state_file, host) for host in hosts):
            return True
        stop.wait(0.2)
    return False


def watch(provider: SpotProvider, state_file, poll_seconds: float = WATCH_POLL_SECONDS,
          revoke: Callable[[str], str] | None = None, stop: threading.Event | None = None,
          clock=time.time, gate=None) -> None:
    """Poll until `stop` is set. A provider error is logged and the last state is kept (it
    goes stale, which spot_hosts.py reports); the loop never dies of one bad answer.
    `revoke(host)`, if given, plays the cloud's part when a host is gone; it returns what it did.
    `gate` (reach/gate.py's SshGate), if given, holds hosts out of discovery until they take SSH."""
    stop = stop or threading.Event()
    previous: dict[str, str] = {}
    failing = False
    while not stop.is_set():
        now = clock()
        try:
            hosts = provider.poll(now)
        except ProviderError as e:
            if not failing:
                log.warning("the %s provider failed (%s); keeping the last host state", provider.name, e)
            failing = True
            stop.wait(poll_seconds)
            continue
        if failing:
            log.info("the %s provider answers again", provider.name)
            failing = False
        if gate is not None:
            hosts = gate.admit(hosts)
        write_host_state(state_file, HostState(provider=provider.name, written_at=now, hosts=hosts))
        for host in hosts:
            before = previous.get(host.name)
            if before == host.state:
                continue
            if host.state == NOTICED:
                log.info("host %s (%s) has an interruption notice; dropped from discovery", host.name, host.instance_id)
            elif host.state == GONE:
                done = revoke(host.name) if revoke is not None else ""
                log.info("host %s (%s) is gone%s", host.name, host.instance_id, f"; {done}" if done else "")
            previous[host.name] = host.state
        stop.wait(poll_seconds)
