"""The head's side of spot capacity: the watcher thread that keeps the host-state file which
discovery (launch/spot_hosts.py) prints, a replayed trace's start once every host has a worker,
and the end of an AWS job's instances when the job ends."""
from __future__ import annotations

import contextlib
import logging
import shlex
import sys
import threading
import time
from pathlib import Path

from transientvod.config import Config
from transientvod.head.preflight import LaunchError


log = logging.getLogger(__name__)


SPOT_HOSTS_MODULE = "transientvod.launch.spot_hosts"  # launch/spot_hosts.py, shipped in the package


def spot_hosts_command(state_file: str | Path, stale_after: float | None = None) -> str:
    """The discovery command horovodrun runs every second: the installed package's spot_hosts
    module, with this launcher's Python (a checkout need not exist where the job runs)."""
    command = f"{shlex.quote(sys.executable)} -m {SPOT_HOSTS_MODULE} --state-file {shlex.quote(str(state_file))}"
    return command if stale_after is None else f"{command} --stale-after {stale_after:g}"


REPLAY_START_TIMEOUT = 120  # seconds to wait for a worker on every host before a replay starts
STATE_REFRESH_SECONDS = 5  # how often the first host state is rewritten while the replay waits


def start_spot_watcher(config: Config) -> tuple[str, threading.Event]:
    """Start the watcher thread for `spot.provider`; returns the discovery command and the
    event that stops the watcher. The first host state is written before this returns, so
    discovery has an answer from Horovod's very first call."""
    from transientvod.spot.providers.from_config import provider_from_config
    from transientvod.spot.hosts import HostState, write_host_state
    from transientvod.spot.providers.provider import ProviderError
    from transientvod.spot.watch import wait_for_workers, watch
    from transientvod.spot.reach.gate import gate_for
    from transientvod.spot.reach.ssh import CONNECT_TIMEOUT_SECONDS

    state_file = config.host_state_file
    gate = gate_for(config.spot)
    try:
        provider = provider_from_config(config.spot, start_time=time.time())
        now = time.time()
        first_hosts = provider.poll(now)
        if gate is not None:
            first_hosts = gate.settle(first_hosts, timeout=CONNECT_TIMEOUT_SECONDS + 10)
        write_host_state(state_file, HostState(provider.name, now, first_hosts))
    except ProviderError as e:
        raise LaunchError(str(e)) from None
    stop = threading.Event()
    replay = config.spot.provider == "trace"

    def watch_job():
        nonlocal provider
        if replay:
            # The replay's clock starts when the job runs on every host, as the study's did.
            initial = [h.name for h in first_hosts if h.state == "usable"]
            deadline = time.monotonic() + REPLAY_START_TIMEOUT
            while not wait_for_workers(state_file, initial, STATE_REFRESH_SECONDS, stop):
                if stop.is_set():
                    return
                if time.monotonic() >= deadline:
                    log.warning("not every host had a worker after %d s; starting the replay anyway",
                                REPLAY_START_TIMEOUT)
                    break
                # Rewrite the first state while the workers start, or discovery would call
                # it stale (and the watcher stopped) on a cluster slower to start than that.
                write_host_state(state_file, HostState(provider.name, time.time(), first_hosts))
            provider = provider_from_config(config.spot, start_time=time.time())
        watch(provider, state_file, poll_seconds=config.spot.poll_seconds,
              revoke=revocation(config) if replay else None, stop=stop, gate=gate)
        if gate is not None:
            gate.close()

    threading.Thread(target=watch_job, name="spot-watcher", daemon=True).start()
    if config.spot.provider == "trace" and config.notices.source == "none":
        config.notices.source = "hoststate"  # a replayed notice reaches workers through the same file
    return spot_hosts_command(state_file, config.spot.stale_after), stop


def revocation(config: Config):
    """What a replayed revocation does to its host (`spot.revoke`): kill its workers, or make a
    testbed host vanish from the network (`vanish:<testbed>`), as a revoked VM does."""
    from transientvod.spot.watch import workers_killer

    kind, _, testbed = config.spot.revoke.partition(":")
    if kind != "vanish":
        return workers_killer(config.host_state_file)
    from transientvod.testbed import cluster

    def vanish(host: str) -> str:
        cluster.vanish(testbed, host)
        return f"it vanished from testbed {testbed}'s network"
    return vanish


@contextlib.contextmanager
def job_instances_ended_at_exit(config: Config):
    """Once the job has started: at its end, however it ends (finished, failed, Ctrl-C), every
    instance of an AWS job is terminated, and its fleet stops (spot/job_instances.py, the same
    function `transientvod down` calls), unless spot.end_instances_at_exit is false. A job that
    fails its checks before it starts leaves them running, to be fixed and started again."""
    if config.spot.provider != "aws" or not config.spot.end_instances_at_exit:
        yield
        return
    try:
        yield
    finally:
        end_job_instances(config)


def end_job_instances(config: Config) -> list:
    """Terminates every instance of the AWS job of `config` and prints what it ended; an AWS
    error is one sentence naming what to end by hand, never a traceback over the job's own end."""
    from transientvod.spot.provisioning.job_instances import JobInstances, describe_ended
    from transientvod.spot.providers.provider import ProviderError

    spot = config.spot
    try:
        job = JobInstances(spot.job_tag, spot.region or None, spot.endpoint_url or None, whose="the launcher's")
        ended = job.end_all(by="launcher")
    except ProviderError as e:
        print(f"transientvod: could not end the instances of job {spot.job_tag} ({e}); run 'transientvod down "
              f"--job-tag {spot.job_tag}'.", file=sys.stderr, flush=True)
        return []
    print(f"transientvod: the job ended; {describe_ended(spot.job_tag, ended, 'the launcher')}", flush=True)
    return ended
