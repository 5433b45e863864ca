"""Can the launcher reach the job's remote hosts over SSH, as horovodrun will?

horovodrun starts every remote worker with `ssh HOST ...` and reports a host it cannot log in
to only as a worker that failed, deep in its log, after its own timeouts. So before it starts,
the launcher tries `ssh HOST true` on every remote host the discovery script lists, all at once
and bounded in time, with horovodrun's own options (no password, any host key) plus BatchMode
(never a prompt). Reaching none is one sentence naming a host, what ssh answered and the key
ssh offered (the identity files `ssh -G` names that exist); reaching some logs the others.

Which hosts are remote is Horovod's rule: a host is local when its name resolves to an address
of one of this machine's interfaces.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import psutil

from transientvod.spot.user_data import JOIN_LOG

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = int(os.environ.get("TRANSIENTVOD_SSH_CONNECT_TIMEOUT", "10"))
# horovodrun's ssh options (horovod/runner/util/remote.py) and no prompt of any kind.
SSH_OPTIONS = ("-T", "-n", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no")
MAX_PARALLEL = 32


class UnreachableHosts(RuntimeError):
    """No remote host of the job takes the launcher's SSH login; one sentence."""


def local_addresses() -> set[str]:
    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}


def remote_hosts(hosts: list[str]) -> list[str]:
    """The hosts horovodrun will reach over SSH (a name that does not resolve counts as remote:
    ssh will say why it cannot reach it)."""
    mine = local_addresses()
    remote = []
    for host in hosts:
        try:
            address = socket.gethostbyname(host)
        except OSError:
            address = None
        if address not in mine:
            remote.append(host)
    return remote


def identity_files(host: str) -> tuple[list[str], list[str]]:
    """The identity files ssh's configuration names for `host`, and those of them that exist:
    the keys ssh offers (it skips the others)."""
    try:
        done = subprocess.run(["ssh", "-G", host], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return [], []
    named = [line.split(None, 1)[1] for line in done.stdout.splitlines() if line.startswith("identityfile ")]
    return named, [path for path in (os.path.expanduser(p) for p in named) if os.path.exists(path)]


def key_words(host: str) -> str:
    """'key PATH' for the sentence, or which files ssh looked for when none exists."""
    named, offered = identity_files(host)
    if offered:
        return f"key {', '.join(offered)}"
    return f"no key (none of {', '.join(named) or 'the identity files'} exists)"


def probe(host: str) -> str | None:
    """None if `ssh host true` succeeds; else what ssh said (its last line)."""
    argv = ["ssh", *SSH_OPTIONS, "-o", f"ConnectTimeout={CONNECT_TIMEOUT_SECONDS}", host, "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CONNECT_TIMEOUT_SECONDS + 10)
    except FileNotFoundError:
        return "there is no ssh client on the launcher's machine"
    except subprocess.TimeoutExpired:
        return f"no answer within {CONNECT_TIMEOUT_SECONDS + 10} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    return (lines or [f"ssh exited with {done.returncode}"])[-1]


def check_reach(hosts: list[str]) -> dict[str, str]:
    """Probe the remote ones of `hosts`; raises UnreachableHosts if none answers. Returns the
    hosts it could not reach, with ssh's answer (the job goes on with the others: Horovod
    leaves a failing host out)."""
    remote = remote_hosts(hosts)
    if not remote:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(remote))) as pool:
        answers = dict(zip(remote, pool.map(probe, remote)))
    failed = {host: why for host, why in answers.items() if why is not None}
    if len(failed) == len(remote):
        host = remote[0]
        others = f" (and {len(remote) - 1} more hosts)" if len(remote) > 1 else ""
        raise UnreachableHosts(
            f"the launcher reaches no worker host over SSH: {host}{others} answered '{failed[host]}' to "
            f"{key_words(host)}; "
            "authorize that key on the workers (transientvod fleet --ssh-public-key takes its .pub) or name the "
            f"right one as IdentityFile in ~/.ssh/config, and note that a fleet's host takes the key only once "
            f"its user data has finished ({JOIN_LOG} on the host).")
    for host, why in failed.items():
        log.warning("the launcher cannot reach %s over SSH (%s); horovodrun will leave it out.", host, why)
    return failed
