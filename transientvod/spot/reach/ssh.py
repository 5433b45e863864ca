"""Can the launcher reach the job's remote hosts over SSH, as horovodrun will?

horovodrun starts every remote worker with `ssh HOST ...` and reports a host it cannot log in
to only as a worker that failed, deep in its log, after its own timeouts. So before it starts,
the launcher tries `ssh HOST true` on every remote host the discovery script lists, all at once
and bounded in time, with horovodrun's own options (no password, any host key) plus BatchMode
(never a prompt). A host it cannot reach is one sentence naming the host, what ssh answered and
the key ssh offered (the identity files `ssh -G` names that exist). Reaching only some of the
hosts is refused too: horovodrun does not leave such a host out, its worker fails to start and
the whole job stops with it (tests/testbed/test_fleet_join.py saw it, with min_np 1).

Which hosts are remote is Horovod's rule: a host is local when its name resolves to an address
of one of this machine's interfaces.
"""
from __future__ import annotations

import os
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import psutil

from transientvod.spot.provisioning.user_data import JOIN_LOG

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


def probe(host: str, command: str = "true", stdin: str | None = None) -> str | None:
    """None if `ssh host COMMAND` succeeds; else what ssh said (its last line). `stdin`, when
    given, is the command's standard input (else ssh's -n gives it /dev/null): the way to hand a
    host a secret that must not appear on any command line."""
    options = SSH_OPTIONS if stdin is None else tuple(option for option in SSH_OPTIONS if option != "-n")
    argv = ["ssh", *options, "-o", f"ConnectTimeout={CONNECT_TIMEOUT_SECONDS}", host, command]
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=CONNECT_TIMEOUT_SECONDS + 10)
    except FileNotFoundError:
        return "there is no ssh client on the launcher's machine"
    except subprocess.TimeoutExpired:
        return f"no answer within {CONNECT_TIMEOUT_SECONDS + 10} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    return (lines or [f"ssh exited with {done.returncode}"])[-1]


def check_reach(hosts: list[str]) -> None:
    """Probe the remote ones of `hosts`; raises UnreachableHosts unless every one answers."""
    remote = remote_hosts(hosts)
    if not remote:
        return
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(remote))) as pool:
        answers = dict(zip(remote, pool.map(probe, remote)))
    failed = [host for host in remote if answers[host] is not None]
    if not failed:
        return
    host = failed[0]
    others = f" (and {len(failed) - 1} more hosts)" if len(failed) > 1 else ""
    if len(failed) == len(remote):
        what = f"the launcher reaches no worker host over SSH: {host}{others}"
    else:
        what = (f"the launcher cannot reach {host}{others} over SSH, and horovodrun would stop the whole job on "
                f"it: {host}")
    raise UnreachableHosts(
        f"{what} answered '{answers[host]}' to {key_words(host)}; authorize that key on the workers (transientvod "
        "fleet --ssh-public-key takes its .pub) or name the right one as IdentityFile in ~/.ssh/config, and note "
        f"that a fleet's host takes the key only once its user data has finished ({JOIN_LOG} on the host).")
