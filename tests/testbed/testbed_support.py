"""What the testbed tests share: a skip with the reason where a testbed cannot be made, unique
names (a developer's own testbed may be up), running on the head, and the leftover check."""
from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest

from transientvod.testbed import TestbedError, cluster
from transientvod.testbed.boot import stand_in_dir
from transientvod.testbed.record import state_dir

_names = itertools.count(1)


def require_testbed():
    """A skip marker naming what this machine lacks; none where a testbed can be made."""
    try:
        cluster.preflight()
    except TestbedError as e:
        return pytest.mark.skip(reason=str(e))
    return pytest.mark.testbed


def new_testbed_name() -> str:
    """Unique within this test run, and short (host names become interface names)."""
    return f"t{os.getpid() % 10000:04d}{next(_names):02d}"


def head_run(name: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    from transientvod.testbed import sshd
    from transientvod.testbed.record import require_record

    head = require_record(name).layout.head
    return subprocess.run(sshd.exec_argv(head, argv), capture_output=True, text=True, timeout=timeout)


def leftovers(name: str) -> list[str]:
    """Whatever of testbed `name` still exists: namespaces, links in this machine's namespace,
    /etc/netns entries, its state directory, processes started from it."""
    found = []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    found += [f"namespace {ns}" for ns in namespaces if ns.startswith(f"{name}-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if f"{name}-" in line]
    netns = Path("/etc/netns")
    if netns.exists():
        found += [f"/etc/netns/{entry.name}" for entry in netns.iterdir() if entry.name.startswith(f"{name}-")]
    if state_dir(name).exists():
        found.append(str(state_dir(name)))
    if stand_in_dir(name).exists():
        found.append(str(stand_in_dir(name)))
    found += [f"process {pid}: {line.strip()}" for pid, line in command_lines().items() if f"testbed-{name}/" in line]
    return found


def command_lines() -> dict[int, str]:
    """Every process's argv on this machine, and so on every testbed host and the head (all
    testbed namespaces share its PID namespace)."""
    lines = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                lines[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # it ended meanwhile
    return lines


def mounted_on(path) -> list[str]:
    """The processes whose mount table has something mounted on `path`: none once every host
    that had it as a private disk is gone, whatever mount namespace it was in."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                mounts = (proc / "mountinfo").read_text().splitlines()
            except OSError:
                continue
            if any(line.split()[4] == str(path) for line in mounts):
                found.append(proc.name)
    return found


@pytest.fixture
def testbed_factory():
    """Make testbeds in a test; each is taken down afterwards, and must leave nothing."""
    made = []

    def make(hosts: int, bandwidth: str = "", private_disk: tuple[str, ...] = ()):
        name = new_testbed_name()
        made.append(name)
        return cluster.up(name, hosts, bandwidth, tuple(private_disk))

    yield make
    for name in made:
        try:
            cluster.down(name)
        except TestbedError:
            pass  # the test took it down itself
        assert leftovers(name) == []
