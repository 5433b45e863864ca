"""A host boots from user data: the fleet's join script, run on a testbed host as cloud-init runs
it on a fresh VM (as root, once, in the foreground).

The testbed's own sshd on that host is stopped first: whatever SSH the host offers afterwards is
the script's doing, with the script's key. The hosts of a testbed share this machine's disk, so
the script runs in a mount namespace of its own, where what a VM has to itself and the script
writes to is private: /run and /var/log are empty tmpfs (sshd's pid file and privilege
separation directory, no systemd, so the script starts sshd itself; the join log), and /root
(the SSH user's home and authorized_keys) is an overlay whose writes go to a tmpfs (the machine's
/root stays readable underneath: this machine's Python lives there). Those mounts live as long
as the host's processes; `down` kills them with the host's namespace, and nothing is left on the
machine's disk. The rest of the file system (the venv, the
repository, /etc/ssh's host keys and sshd_config) is the machine's, as a baked image's would be.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from transientvod.testbed import TestbedError, sshd
from transientvod.testbed.record import require_record

# Mounted in this order: the overlay's upper layer lives in the fresh /run.
PRIVATE_MOUNTS = ("mount -t tmpfs -o mode=755 tmpfs /run", "mount -t tmpfs -o mode=755 tmpfs /var/log",
                  "mkdir -p /run/.vm-root/upper /run/.vm-root/work",
                  "mount -t overlay overlay -o lowerdir=/root,upperdir=/run/.vm-root/upper,"
                  "workdir=/run/.vm-root/work /root")
BOOT_TIMEOUT_SECONDS = 600  # an install from the network takes minutes; a baked venv, a second


def boot(name: str, host_name: str, script: Path, timeout: float = BOOT_TIMEOUT_SECONDS) -> str:
    """Run `script` on the host as its user data; returns what it printed. The host's known
    key on the head is forgotten (a new server has a new host key)."""
    record = require_record(name)
    host = record.layout.machine(host_name)
    if not script.is_file():
        raise TestbedError(f"the user data {script} does not exist; write it with 'transientvod fleet "
                           "--print-user-data ... > FILE'.")
    sshd.stop(record.directory, host)
    mounts = " && ".join(PRIVATE_MOUNTS)
    argv = ["ip", "netns", "exec", host.name, "unshare", "--uts", "--mount", "--propagation", "private", "--",
            "sh", "-c", f'hostname "$0" && {mounts} && exec bash "$1"', host.name, str(script)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"the user data on {host.name} did not finish within {timeout:g} s.") from None
    output = done.stdout + done.stderr
    if done.returncode != 0:
        last = (output.strip().splitlines() or ["no output"])[-1]
        raise TestbedError(f"the user data on {host.name} exited with {done.returncode} ({last}).")
    known_hosts = record.directory / "known_hosts"
    if known_hosts.exists():
        subprocess.run(["ssh-keygen", "-R", host.name, "-f", str(known_hosts)], capture_output=True, timeout=30)
    return output
