"""The testbed's verbs: up, down, status, vanish, kill, restore, exec.

- vanish: the VM disappears. Its link goes down and every process on it is frozen (SIGSTOP),
  so no FIN or RST ever reaches its peers: they learn of it only by timeouts, as on a cloud.
- kill: its processes are killed; the kernel closes their sockets, so peers see resets at once.
- restore: a replacement server with the same name and address: whatever was frozen is
  killed (a new VM has none of the old processes), the link comes up, sshd starts afresh.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from transientvod.testbed import TestbedError, network, sshd
from transientvod.testbed.boot import remove_stand_ins
from transientvod.testbed.layout import Layout, hosts_file, plan
from transientvod.testbed.private_disk import prepare as prepare_private_disk
from transientvod.testbed.record import RUN_ROOT, Record, load_record, new_record, require_record

DEFAULT_NAME = "tvd"


def preflight() -> None:
    """Raise TestbedError naming the first thing this machine lacks for a testbed."""
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (it makes network namespaces and veth pairs); run it as root.")
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            raise TestbedError(f"{tool} is not installed; the testbed needs iproute2 (ip, tc) and util-linux (unshare).")
    sshd.check_installed()
    probe = f"tvdprobe{os.getpid() % 100000}"
    try:
        network.run(["ip", "netns", "add", probe], "create a network namespace (does this kernel allow it?)")
        network.run(["ip", "-n", probe, "link", "add", "br0", "type", "bridge"],
                    "create a bridge (the kernel lacks bridge support?)")
        network.run(["ip", "-n", probe, "link", "add", "eth0", "type", "veth", "peer", "name", "p0"],
                    "create a veth pair (the kernel lacks veth support?)")
        network.run(["tc", "-n", probe, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "100mbit",
                     "burst", "32kb", "latency", "50ms"], "shape a link with tbf (the kernel lacks sch_tbf?)")
    finally:
        network.delete_namespace(probe)


def up(name: str = DEFAULT_NAME, hosts: int = 3, bandwidth: str = "", private_disk: tuple[str, ...] = (),
       congestion: str = "") -> Record:
    """Make the head and the hosts; each host gets its own empty tmpfs over every private_disk
    directory (the head keeps this machine's). `congestion`: every machine's TCP congestion
    control, "" for this machine's default."""
    layout = plan(name, hosts, bandwidth, congestion)
    existing = load_record(name)
    if existing is not None:
        raise TestbedError(f"a testbed named {name!r} is already up ({len(existing.layout.hosts)} hosts); "
                           f"run 'transientvod testbed down' first, or choose another --name.")
    preflight()
    if congestion:
        network.check_congestion(congestion)
    taken = [ns for ns in [layout.switch] + [m.name for m in layout.machines] if network.namespace_exists(ns)]
    if taken:
        raise TestbedError(f"the network namespace {taken[0]} already exists and is not this testbed's; "
                           f"remove it (ip netns delete {taken[0]}) or choose another --name.")
    private = prepare_private_disk(private_disk)
    record = new_record(layout, private)
    record.save()  # before anything exists: down must find what a crash leaves behind
    try:
        _claim_privsep_dir()
        _build(layout, record.directory, private)
    except BaseException:
        down(name)
        raise
    record.complete = True
    record.save()
    return record


def _build(layout: Layout, directory: Path, private_disk: list[str]) -> None:
    network.make_switch(layout)
    for machine in layout.machines:
        network.make_machine(layout, machine)
        netns_dir = Path(f"/etc/netns/{machine.name}")
        netns_dir.mkdir(parents=True, exist_ok=True)
        (netns_dir / "hosts").write_text(hosts_file(layout, machine))
        if layout.congestion:
            network.set_congestion(machine, layout.congestion)
    if layout.bandwidth:
        for host in layout.hosts:
            network.shape(host.name, layout.bandwidth)
    sshd.make_keys(directory)
    sshd.write_client_config(directory, Path(f"/etc/netns/{layout.head.name}"))
    for host in layout.hosts:
        sshd.start(directory, host, private_disk)
    for host in layout.hosts:
        if not sshd.ssh_probe(layout.head, host):
            raise TestbedError(f"the head cannot reach {host.name} over SSH; see {directory} for its sshd config.")


def down(name: str = DEFAULT_NAME) -> None:
    """Remove everything the record lists, whether up finished or not."""
    record = require_record(name)
    # Hosts first, the switch last: processes go with their namespace.
    for namespace in reversed(record.namespaces):
        network.delete_namespace(namespace)
    for directory in record.netns_dirs:
        shutil.rmtree(directory, ignore_errors=True)
    remove_stand_ins(name)  # boot's shutdown stand-ins, after every process that could call them
    with _testbeds_locked():
        shutil.rmtree(record.directory, ignore_errors=True)
        _release_privsep_dir()


# sshd needs /run/sshd for every new connection. When a testbed makes it, this file says so; the
# last testbed down removes both. Testbeds come up and down in several processes at once (tests,
# benchmarks, a developer's own), so the check-then-act of both runs under one lock: handing the
# directory from record to record raced, and left it behind with no testbed up.
PRIVSEP_MADE_BY_TESTBED = RUN_ROOT / "made-run-sshd"


@contextlib.contextmanager
def _testbeds_locked():
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    with open(RUN_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _claim_privsep_dir() -> None:
    with _testbeds_locked():
        if sshd.make_privsep_dir():
            PRIVSEP_MADE_BY_TESTBED.touch()


def _release_privsep_dir() -> None:
    """Remove /run/sshd if a testbed made it and none is left (called under the lock)."""
    if not PRIVSEP_MADE_BY_TESTBED.exists() or any(RUN_ROOT.glob("testbed-*")):
        return
    try:
        sshd.PRIVSEP_DIR.rmdir()
    except OSError:
        pass  # not empty, or already gone
    PRIVSEP_MADE_BY_TESTBED.unlink(missing_ok=True)


def status(name: str = DEFAULT_NAME) -> list[dict]:
    record = require_record(name)
    rows = []
    for host in record.layout.hosts:
        exists = network.namespace_exists(host.name)
        pid = sshd.running_pid(record.directory, host) if exists else None
        rows.append({
            "host": host.name,
            "address": host.address,
            "condition": record.host_condition.get(host.name, "up"),
            "link": ("up" if network.link_is_up(host.name) else "down") if exists else "missing",
            "sshd": sshd.process_state(pid) if pid else "gone",
            "shaping": network.shaping(host.name) if exists else "-",
            "congestion": network.congestion(host.name) if exists else "-",
        })
    return rows


def vanish(name: str, host_name: str) -> None:
    record = require_record(name)
    host = record.layout.machine(host_name)
    network.set_link(host.name, up=False)
    network.signal_all(host.name, signal.SIGSTOP)
    _set_condition(record, host.name, "vanished")


def kill(name: str, host_name: str) -> None:
    record = require_record(name)
    host = record.layout.machine(host_name)
    network.kill_all(host.name)
    _set_condition(record, host.name, "killed")


def restore(name: str, host_name: str) -> None:
    record = require_record(name)
    host = record.layout.machine(host_name)
    network.kill_all(host.name)  # while the link is still down: the old processes never speak again
    network.set_link(host.name, up=True)
    if record.bandwidth:
        network.shape(host.name, record.bandwidth)
    if record.congestion:
        network.set_congestion(host, record.congestion)  # the link's return re-made the route without it
    sshd.start(record.directory, host, record.private_disk)  # a new VM: its private disk empty again
    _set_condition(record, host.name, "up")


def exec_on_head(name: str, argv: list[str]) -> int:
    """Run a command on the head (its network, hosts file, ssh config and hostname)."""
    record = require_record(name)
    if not argv:
        raise TestbedError("give the command to run on the head after '--', for example: "
                           "transientvod testbed exec -- horovodrun ...")
    return subprocess.call(sshd.exec_argv(record.layout.head, argv))


def _set_condition(record: Record, host: str, condition: str) -> None:
    record.host_condition[host] = condition
    record.host_changed_at[host] = time.time()
    record.save()
