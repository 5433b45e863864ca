"""A host boots from user data: the fleet's join script, run on a testbed host as cloud-init runs
it on a fresh VM (as root, once, in the foreground).

The testbed's own sshd on that host is stopped first: whatever SSH the host offers afterwards is
the script's doing, with the script's key. The hosts of a testbed share this machine's disk, so
the script runs in a mount namespace of its own, where what a VM has to itself and the script
writes to is private: /run and /var/log are empty tmpfs (sshd's pid file and privilege
separation directory, no systemd, so the script starts sshd itself; the join log), and /root
(the SSH user's home) is a tmpfs too, with each of the machine's own entries bind-mounted back
into it but .ssh and the shell's start-up files: the script's authorized_keys stay in the
tmpfs, and the machine's Python (which lives under /root here) is the real one. Its start-up
files are not a new VM's: here they set up pyenv, whose every login takes a lock in the
shared /root/.pyenv, and a host that vanishes while a login holds it leaves the lock behind,
so that every later login on this machine waits a minute for it. (An
overlay over /root would not do: other sessions of this machine keep changing its files, which
overlayfs does not allow under a mounted overlay.) Those mounts live as long as the host's
processes; `down` kills them with the host's namespace, and nothing is left on the disk.
A VM has cores of its own, while the hosts of a testbed share this machine's: the script runs
pinned to one of them (the host's number, modulo how many there are), and so does everything
it starts (sshd, and the workers horovodrun starts through it), so two booted hosts do not
each size their threads to the whole machine and take turns on it.
The rest of the file system (the venv, the
repository, /etc/ssh's host keys and sshd_config) is the machine's, as a baked image's would be,
except the testbed's private disks (`up --private-disk DIR`): each is an empty tmpfs here too, as
it is under the testbed's own sshd, since a new VM's disk is empty. The script makes its own mount
namespace rather than entering the stopped sshd's (nsenter): that one dies with the old sshd.

A VM's user data may shut the VM down (the watchdog does, when the fleet's heartbeat stops);
a testbed host shares this machine's kernel, and its `shutdown` would be this machine's. So the
script runs with stand-ins first on its PATH: `shutdown` and `poweroff` that only record their
call (`shutdown_calls`) and end nothing. They live in /tmp/transientvod-testbed-<name>/, not
in the testbed's directory under /run, which the host's private /run covers; `down` removes it.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from transientvod.testbed import TestbedError, sshd
from transientvod.testbed.record import require_record

# Run inside the host's new mount namespace, in this order: the machine's /root is kept
# reachable under the fresh /run before the tmpfs covers it.
PRIVATE_MOUNTS = """
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=755 tmpfs /var/log
mkdir /run/.machine-root && mount --bind /root /run/.machine-root
mount -t tmpfs -o mode=700 tmpfs /root
for entry in /run/.machine-root/* /run/.machine-root/.[!.]*; do
  name=${entry##*/}
  case "$name" in .ssh|.bashrc|.profile|.bash_profile|.bash_login|.bash_logout) continue ;; esac
  [ -e "$entry" ] || continue
  if [ -d "$entry" ]; then mkdir "/root/$name"; else touch "/root/$name"; fi
  mount --bind "$entry" "/root/$name"
done
"""
STAND_IN = """#!/bin/sh
# The testbed's stand-in for {name} (testbed/boot.py): records the call, ends nothing.
mkdir -p {calls}
echo "{name} $*" >> {calls}/"$(hostname)"
"""
BOOT_TIMEOUT_SECONDS = 600  # an install from the network takes minutes; a baked venv, a second


def boot(name: str, host_name: str, script: Path, timeout: float = BOOT_TIMEOUT_SECONDS) -> str:
    """Run `script` on the host as its user data; returns what it printed. The host's known
    key on the head is forgotten (a new server has a new host key)."""
    record = require_record(name)
    host = record.layout.machine(host_name)
    if not script.is_file():
        raise TestbedError(f"the user data {script} does not exist; write it with 'transientvod fleet "
                           "--print-user-data ... > FILE'.")
    stand_ins = shutdown_stand_ins(name)
    sshd.stop(record.directory, host)
    # The private disks after PRIVATE_MOUNTS: one under /root or /run then covers the tmpfs there.
    argv = ["ip", "netns", "exec", host.name, "taskset", "--cpu-list", str(own_core(record.layout, host)), "unshare", "--uts", "--mount", "--propagation", "private", "--",
            "sh", "-ec", f'hostname "$0"\n{PRIVATE_MOUNTS}\nscript=$1 && shift\n{sshd.PRIVATE_DISK_MOUNTS}\n'
            f'PATH={shlex.quote(str(stand_ins))}:"$PATH"; export PATH\nexec bash "$script"', host.name, str(script),
            *record.private_disk]
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


def own_core(layout, host) -> int:
    """The core a booted host runs on: hosts in turn over this machine's cores."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[layout.hosts.index(host) % len(cores)]


def stand_in_dir(name: str) -> Path:
    """Where testbed `name` keeps its shutdown stand-ins and their records (seen by its hosts)."""
    return Path(tempfile.gettempdir()) / f"transientvod-testbed-{name}"


def shutdown_stand_ins(name: str) -> Path:
    """The testbed's directory of `shutdown` and `poweroff` stand-ins (made once)."""
    bin_dir = stand_in_dir(name) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for program_name in ("shutdown", "poweroff"):
        program = bin_dir / program_name
        program.write_text(STAND_IN.format(name=program_name, calls=shlex.quote(str(stand_in_dir(name) / "calls"))))
        program.chmod(0o755)
    return bin_dir


def shutdown_calls(name: str, host_name: str) -> list[str]:
    """What the host's booted programs asked of `shutdown` or `poweroff`, one call a line."""
    path = stand_in_dir(name) / "calls" / host_name
    return path.read_text().splitlines() if path.exists() else []


def remove_stand_ins(name: str) -> None:
    shutil.rmtree(stand_in_dir(name), ignore_errors=True)
