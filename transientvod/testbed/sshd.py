"""SSH for the testbed: one key pair made for it, one sshd per host, and the head's client config.

Each host's sshd listens on that host's address only and runs in a UTS namespace of its own
whose hostname is the host's name, so whatever horovodrun starts over SSH sees the hostname,
hosts file and network of that host. The head's `/etc/ssh` (bind-mounted by `ip netns exec`
from `/etc/netns/<head>/ssh`) names the testbed's key and known-hosts file and nothing more:
in particular no keepalive, which the product itself must supply.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from transientvod.testbed import TestbedError
from transientvod.testbed.layout import Machine
from transientvod.testbed.network import run

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it
CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
STOP_TIMEOUT_SECONDS = 10  # SIGKILL cannot be caught; a process takes this long only if the kernel is stuck


def check_installed() -> None:
    if not os.path.exists(SSHD):
        raise TestbedError("sshd is not installed; install Debian's openssh-server (apt-get install openssh-server).")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        raise TestbedError("the ssh client is not installed; install openssh-client (apt-get install openssh-client).")


def make_keys(directory: Path) -> None:
    for key in (CLIENT_KEY, HOST_KEY):
        if not (directory / key).exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "transientvod-testbed", "-f",
                 str(directory / key)], f"make the testbed's {key} key")
    (directory / "authorized_keys").write_text((directory / f"{CLIENT_KEY}.pub").read_text())


def make_privsep_dir() -> bool:
    """Create /run/sshd if missing; True if we made it (so `down` removes only what it made)."""
    if PRIVSEP_DIR.exists():
        return False
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
    return True


def write_client_config(directory: Path, netns_dir: Path) -> None:
    """The head's /etc/ssh/ssh_config: the testbed's key and known hosts, quiet, no prompts."""
    ssh_dir = netns_dir / "ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    (ssh_dir / "ssh_config").write_text(
        "# Written by transientvod testbed; bind-mounted over /etc/ssh in the head namespace.\n"
        "Host *\n"
        f"    IdentityFile {directory / CLIENT_KEY}\n"
        f"    UserKnownHostsFile {directory / 'known_hosts'}\n"
        "    StrictHostKeyChecking accept-new\n"
        "    BatchMode yes\n"
        "    LogLevel ERROR\n")


def config_path(directory: Path, host: Machine) -> Path:
    return directory / f"{host.name}.sshd_config"


def pid_path(directory: Path, host: Machine) -> Path:
    return directory / f"{host.name}.sshd.pid"


def write_server_config(directory: Path, host: Machine) -> None:
    config_path(directory, host).write_text(
        f"ListenAddress {host.address}\n"
        "Port 22\n"
        f"HostKey {directory / HOST_KEY}\n"
        f"PidFile {pid_path(directory, host)}\n"
        f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PrintMotd no\n"
        # horovodrun opens one connection per slot, and more to probe interfaces, all at once.
        "MaxStartups 200\n"
        "MaxSessions 200\n"
        "LogLevel ERROR\n")


# A fresh tmpfs over each private disk, given as "$@", in the host's own mount namespace: a tmpfs
# rather than a bind of some real directory, so a host's disk dies with its mount namespace and
# leaves nothing on this machine (see private_disk).
PRIVATE_DISK_MOUNTS = ('for dir in "$@"; do mkdir -p "$dir" && '
                       'mount -t tmpfs -o mode=755 tvd-private-disk "$dir" || exit 1; done')


def start(directory: Path, host: Machine, private_disk: list[str] | tuple[str, ...] = ()) -> None:
    """Start the host's sshd in its namespace, under its own hostname, each private disk an
    empty tmpfs of its own. sshd binds its socket before it detaches, so the host accepts
    connections once this returns."""
    write_server_config(directory, host)
    pid_path(directory, host).unlink(missing_ok=True)
    # Private propagation: the tmpfs never reaches this machine's mount table or another host's.
    mount = ["--mount", "--propagation", "private"] if private_disk else []
    script = f'hostname "$0" && sshd=$1 config=$2 && shift 2 && {PRIVATE_DISK_MOUNTS} && exec "$sshd" -f "$config"'
    run(["ip", "netns", "exec", host.name, "unshare", "--uts", *mount, "--", "sh", "-c", script, host.name, SSHD,
         str(config_path(directory, host)), *private_disk], f"start sshd on {host.name}")


def running_pid(directory: Path, host: Machine) -> int | None:
    """The host's sshd's pid, or None if it is gone. A killed sshd is an orphan (it detached
    from its parent), reaped whenever this machine's init gets to it: until then it is a
    zombie, which os.kill(pid, 0) still finds, so the state comes from /proc."""
    try:
        pid = int(pid_path(directory, host).read_text().strip())
    except (OSError, ValueError):
        return None
    return None if process_state(pid) == "gone" else pid


def process_state(pid: int) -> str:
    """'running', 'stopped' (SIGSTOP) or 'gone' (no process, or a killed one not yet reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "gone"
    return {"T": "stopped", "t": "stopped", "Z": "gone", "X": "gone"}.get(fields[0], "running")


def stop(directory: Path, host: Machine, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
    """Kill the host's sshd and return once it is gone, so that its port is free for whatever
    starts next (boot's user data starts an sshd of its own on the same address)."""
    pid = running_pid(directory, host)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while process_state(pid) != "gone":
        if time.monotonic() > deadline:
            raise TestbedError(f"sshd (pid {pid}) on {host.name} did not exit within {timeout:g} s of SIGKILL.")
        time.sleep(0.01)
    pid_path(directory, host).unlink(missing_ok=True)  # its pid may be some other process's later


def exec_argv(head: Machine, argv: list[str]) -> list[str]:
    """argv that runs a command on the head: its namespace, hosts file, ssh config and hostname."""
    return ["ip", "netns", "exec", head.name, "unshare", "--uts", "--", "sh", "-c",
            'hostname "$0" && exec "$@"', head.name, *argv]


def ssh_probe(head: Machine, host: Machine, timeout: float = 10.0) -> bool:
    """True if the head reaches the host over SSH with the testbed's key."""
    argv = exec_argv(head, ["ssh", "-o", f"ConnectTimeout={int(timeout)}", host.name, "true"])
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout + 5).returncode == 0
    except subprocess.TimeoutExpired:
        return False
