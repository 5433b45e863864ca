"""`transientvod testbed`: namespaced hosts with sshd, vanishing and coming back, shaped links,
and nothing left behind. Needs root (CI runs as root); elsewhere skipped with the reason."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from testbed_support import head_run, leftovers, mounted_on, require_testbed, new_testbed_name
from testbed_support import testbed_factory  # noqa: F401 (a fixture)

from transientvod.testbed import TestbedError, cluster
from transientvod.testbed.layout import link_shape, plan
from transientvod.testbed.record import RECORD_FILE, load_record, new_record, state_dir

REPO = Path(__file__).resolve().parents[2]

pytestmark = require_testbed()


def run_testbed_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transientvod.cli", "testbed", *args],
                          capture_output=True, text=True, timeout=120)


def one_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("args, says", [
    (["up", "--hosts", "1"], "--hosts is 1; a testbed has between 2 and 64 hosts."),
    (["up", "--hosts", "65"], "--hosts is 65; a testbed has between 2 and 64 hosts."),
    (["up", "--bandwidth", "fast"], "the bandwidth 'fast' is not a rate tc understands"),
    (["up", "--bandwidth", "25mbit/deep"], "the queue in '25mbit/deep' is not a time tc understands; give RATE/QUEUE"),
    (["up", "--congestion", "Bad!"], "--congestion is 'Bad!'; give the name of a TCP congestion control such as"),
    (["up", "--congestion", "nosuchcc"], "--congestion is 'nosuchcc'; this kernel offers "),
    (["down"], "is up; start one with"),
    (["status"], "is up; start one with"),
    (["vanish", "tvd-h1"], "is up; start one with"),
    (["up", "--private-disk", "/"], "--private-disk / would hide this machine's whole disk from the hosts; give a"),
    (["up", "--private-disk", __file__], f"--private-disk {__file__} is not a directory; give a directory"),
    (["up", "--private-disk", "/run"], "--private-disk /run holds the testbed's state directory (/run/transientvod)"),
    (["up", "--private-disk", str(REPO.parent)],
     f"holds the package transientvod ({REPO / 'transientvod'}), which the hosts need; give a"),
])
def test_bad_input_is_one_sentence(args, says):
    name = new_testbed_name()
    line = one_sentence(run_testbed_cli(*args, "--name", name))
    assert says in line
    assert leftovers(name) == []


def test_a_rate_tc_rejects_is_one_sentence_and_nothing_is_left():
    # Well formed, but beyond what tc's 32-bit rate table takes: tc itself says no, after
    # namespaces were already made; up must undo them.
    name = new_testbed_name()
    line = one_sentence(run_testbed_cli("up", "--name", name, "--hosts", "2", "--bandwidth", "99999tbit"))
    assert "could not shape" in line and "give a rate such as 100mbit" in line
    assert load_record(name) is None
    assert leftovers(name) == []


def test_up_status_vanish_restore_kill_down(tmp_path):
    name = new_testbed_name()
    done = run_testbed_cli("up", "--name", name, "--hosts", "3", "--bandwidth", "50mbit/400ms")
    assert done.returncode == 0, done.stderr
    try:
        layout = load_record(name).layout
        h1, h2, h3 = layout.hosts
        assert f"{h2.name} ({h2.address})" in done.stdout

        again = one_sentence(run_testbed_cli("up", "--name", name, "--hosts", "2"))
        assert f"a testbed named {name!r} is already up (3 hosts)" in again
        unknown = one_sentence(run_testbed_cli("vanish", "--name", name, f"{name}-h9"))
        assert f"there is no host '{name}-h9'" in unknown and h1.name in unknown

        # Each host: its own hostname, its hosts file mapping that name to 127.0.1.1 (Debian's
        # line), its peers at their addresses, reached from the head over SSH.
        out = head_run(name, ["ssh", h2.name, "hostname; getent hosts $(hostname); getent hosts " + h3.name])
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [h2.name, "127.0.1.1", h2.name, h3.address, h3.name]

        status = run_testbed_cli("status", "--name", name)
        assert status.returncode == 0, status.stderr
        rows = {line.split()[0]: line.split() for line in status.stdout.splitlines()[1:]}
        assert rows[h2.name] == [h2.name, h2.address, "up", "up", "running", "50Mbit/400ms", "default"]

        run_testbed_cli("vanish", "--name", name, h2.name).check_returncode()
        row = {r["host"]: r for r in cluster.status(name)}[h2.name]
        assert (row["condition"], row["link"], row["sshd"]) == ("vanished", "down", "stopped")
        started = time.monotonic()
        unreachable = head_run(name, ["ssh", "-o", "ConnectTimeout=2", h2.name, "true"])
        assert unreachable.returncode == 255, "a vanished host answered"
        assert time.monotonic() - started >= 1.5, "a vanished host refused at once instead of never answering"
        assert head_run(name, ["ssh", h3.name, "true"]).returncode == 0, "the other hosts must stay reachable"

        run_testbed_cli("restore", "--name", name, h2.name).check_returncode()
        row = {r["host"]: r for r in cluster.status(name)}[h2.name]
        assert (row["condition"], row["link"], row["sshd"], row["shaping"]) == ("up", "up", "running", "50Mbit/400ms")
        assert head_run(name, ["ssh", h2.name, "hostname"]).stdout.strip() == h2.name

        run_testbed_cli("kill", "--name", name, h3.name).check_returncode()
        row = {r["host"]: r for r in cluster.status(name)}[h3.name]
        assert (row["condition"], row["link"], row["sshd"]) == ("killed", "up", "gone")
        refused = head_run(name, ["ssh", "-o", "ConnectTimeout=5", h3.name, "true"])
        assert refused.returncode == 255 and "refused" in refused.stderr, refused.stderr
    finally:
        down = run_testbed_cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == []


def test_each_host_has_its_own_private_disk_and_down_leaves_no_mount(tmp_path):
    disk, shared = tmp_path / "disk", tmp_path / "shared"
    shared.mkdir()
    name = new_testbed_name()
    done = run_testbed_cli("up", "--name", name, "--hosts", "2", "--private-disk", str(disk))
    assert done.returncode == 0, done.stderr
    try:
        assert f"each host has its own {disk}" in done.stdout
        h1, h2 = (h.name for h in load_record(name).layout.hosts)

        def on(host: str, command: str) -> subprocess.CompletedProcess:
            return head_run(name, ["ssh", host, command])

        # The head writes on this machine's disk, which the hosts do not see under DIR.
        assert head_run(name, ["sh", "-c", f"echo head > {disk}/head"]).returncode == 0
        assert (disk / "head").read_text() == "head\n"
        listed = on(h1, f"ls -A {disk}")
        assert (listed.returncode, listed.stdout) == (0, ""), "a host sees the head's files under its private disk"

        # A host's files under DIR stay on that host (across its SSH sessions); outside DIR all share.
        wrote = on(h1, f"echo h1 > {disk}/h1 && echo h1 > {shared}/h1")
        assert wrote.returncode == 0, wrote.stderr
        assert on(h1, f"cat {disk}/h1").stdout == "h1\n"
        assert on(h2, f"cat {disk}/h1").returncode != 0, "another host sees h1's private disk"
        assert not (disk / "h1").exists(), "the head sees h1's private disk"
        assert on(h2, f"cat {shared}/h1").stdout == "h1\n" and (shared / "h1").read_text() == "h1\n"
        assert mounted_on(disk) and not any(line.split()[4] == str(disk) for line in
                                             Path("/proc/self/mountinfo").read_text().splitlines())

        status = run_testbed_cli("status", "--name", name)
        assert status.returncode == 0 and f"each host has its own {disk}" in status.stdout, status.stderr

        # A replacement VM has an empty disk.
        run_testbed_cli("restore", "--name", name, h1).check_returncode()
        listed = on(h1, f"ls -A {disk}")
        assert (listed.returncode, listed.stdout) == (0, ""), "a restored host kept its old private disk"
    finally:
        down = run_testbed_cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == []
    assert mounted_on(disk) == [], "a host's private disk outlived down"
    findmnt = subprocess.run(["findmnt", "--noheadings", str(disk)], capture_output=True, text=True)
    assert findmnt.stdout == ""
    assert sorted(p.name for p in disk.iterdir()) == ["head"]


def test_user_data_boots_a_host_with_an_empty_private_disk(testbed_factory, tmp_path):
    # boot runs the script in a mount namespace of its own: a new VM, so its DIR is empty too.
    from transientvod.testbed.boot import boot

    disk = tmp_path / "disk"
    record = testbed_factory(2, private_disk=(str(disk),))
    assert record.private_disk == [str(disk)]
    (disk / "head").write_text("head\n")
    script = tmp_path / "user-data.sh"
    script.write_text(f"ls -A {disk}; echo booted > {disk}/booted; cat {disk}/booted\n")
    assert boot(record.name, record.layout.hosts[0].name, script) == "booted\n"
    assert sorted(p.name for p in disk.iterdir()) == ["head"]


def test_an_older_record_without_private_disks_still_loads():
    name = new_testbed_name()
    fields = asdict(new_record(plan(name, 2)))
    del fields["private_disk"]
    state_dir(name).mkdir(parents=True)
    try:
        (state_dir(name) / RECORD_FILE).write_text(json.dumps(fields))
        assert load_record(name).private_disk == []
    finally:
        shutil.rmtree(state_dir(name))


def test_shaped_link_limits_a_transfer():
    # 1.25 MB at 10 Mbit/s takes 1 s; unshaped, the same transfer takes milliseconds.
    name = new_testbed_name()
    cluster.up(name, 2, "10mbit")
    try:
        layout = load_record(name).layout
        sender, receiver = layout.hosts
        seconds = transfer_seconds(name, sender.name, receiver.address, 1_250_000)
        assert 0.8 < seconds < 4.0, f"1.25 MB took {seconds:.2f} s at 10 Mbit/s"
    finally:
        cluster.down(name)
    assert leftovers(name) == []


def transfer_seconds(name: str, sender_ns: str, receiver_address: str, size: int) -> float:
    """Time to send `size` bytes from one host to a listener on another, measured by the receiver."""
    receiver_ns = next(m.name for m in load_record(name).layout.hosts if m.address == receiver_address)
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", receiver_ns, sys.executable, "-c", RECEIVER, receiver_address, str(size)],
        stdout=subprocess.PIPE, text=True)
    wait_until_listening(receiver)
    subprocess.run(["ip", "netns", "exec", sender_ns, sys.executable, "-c", SENDER, receiver_address, str(size)],
                   check=True, timeout=60)
    out, _ = receiver.communicate(timeout=60)
    return float(out)


def wait_until_listening(listener: subprocess.Popen) -> None:
    """Wait for a listener's first line, printed once its socket is bound: a loaded machine can
    take longer than any fixed sleep to start a Python in a namespace."""
    line = listener.stdout.readline()
    assert line.strip() == "listening", f"the listener did not start: {line!r}"


RECEIVER = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 5999))
print("listening", flush=True)
conn, _ = server.accept()
left, started = int(sys.argv[2]), None
while left > 0:
    data = conn.recv(65536)
    if not data:
        break
    started = started or time.monotonic()
    left -= len(data)
print(time.monotonic() - started)
"""
SENDER = """
import socket, sys
with socket.create_connection((sys.argv[1], 5999)) as conn:
    conn.sendall(bytes(int(sys.argv[2])))
"""


def test_congestion_control_is_every_machines_and_comes_back_with_a_restored_host():
    # A control other than this machine's default, so that a connection using it shows the
    # testbed's doing. Both ends are checked: the side that accepts takes it from its route too.
    default = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    other = next((a for a in ("reno", "cubic", "bbr") if a != default and a in available), None)
    if other is None:
        pytest.skip(f"this kernel offers no congestion control besides its default ({', '.join(available)})")
    name = new_testbed_name()
    cluster.up(name, 2, congestion=other)
    try:
        sender, receiver = load_record(name).layout.hosts
        assert connection_congestion(sender.name, receiver.name, receiver.address) == (other, other)
        # Its link going down and up again makes the kernel re-create the subnet's route, without
        # the congestion control: restore must set it again.
        cluster.vanish(name, receiver.name)
        cluster.restore(name, receiver.name)
        assert connection_congestion(sender.name, receiver.name, receiver.address) == (other, other)
        assert [row["congestion"] for row in cluster.status(name)] == [other, other]
    finally:
        cluster.down(name)
    assert leftovers(name) == []


def connection_congestion(sender_ns: str, receiver_ns: str, receiver_address: str) -> tuple[str, str]:
    """The congestion control of one TCP connection from sender to receiver, as each end sees it."""
    receiver = subprocess.Popen(["ip", "netns", "exec", receiver_ns, sys.executable, "-c", CONGESTION_OF_ACCEPTED,
                                 receiver_address], stdout=subprocess.PIPE, text=True)
    wait_until_listening(receiver)
    sent = subprocess.run(["ip", "netns", "exec", sender_ns, sys.executable, "-c", CONGESTION_OF_CONNECTED,
                           receiver_address], capture_output=True, text=True, timeout=60, check=True)
    accepted, _ = receiver.communicate(timeout=60)
    return sent.stdout.strip(), accepted.strip()


CONGESTION_OF_ACCEPTED = """
import socket, sys
server = socket.create_server((sys.argv[1], 5998))
print("listening", flush=True)
conn, _ = server.accept()
print(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\\0").decode())
conn.recv(1)
"""
CONGESTION_OF_CONNECTED = """
import socket, sys
with socket.create_connection((sys.argv[1], 5998)) as conn:
    print(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\\0").decode())
    conn.sendall(b"x")
"""


def test_down_after_a_crashed_up_removes_what_was_made(monkeypatch):
    # up dies after the switch and the first machines exist: the record already lists them.
    name = new_testbed_name()
    from transientvod.testbed import sshd

    def crash(directory):
        raise KeyboardInterrupt

    monkeypatch.setattr(sshd, "make_keys", crash)
    with pytest.raises(KeyboardInterrupt):
        cluster.up(name, 2)
    assert leftovers(name) == [], "up must undo itself when interrupted"


def test_down_removes_what_a_killed_up_left(tmp_path):
    # The whole process is SIGKILLed mid-up: nothing can undo itself, so down must.
    name = new_testbed_name()
    script = (f"import os, signal\nfrom transientvod.testbed import cluster, sshd\n"
              f"sshd.make_keys = lambda d: os.kill(os.getpid(), signal.SIGKILL)\n"
              f"cluster.up({name!r}, 3)\n")
    subprocess.run([sys.executable, "-c", script], timeout=60)
    assert leftovers(name), "the killed up left nothing: this test no longer tests anything"
    assert load_record(name) is not None
    run_testbed_cli("down", "--name", name).check_returncode()
    assert leftovers(name) == []


def test_layout_names_and_addresses():
    layout = plan("tvd", 3, "100mbit")
    assert [m.name for m in layout.machines] == ["tvd-head", "tvd-h1", "tvd-h2", "tvd-h3"]
    assert [m.address for m in layout.machines] == ["10.213.0.1", "10.213.0.11", "10.213.0.12", "10.213.0.13"]
    with pytest.raises(TestbedError, match="1-8 lowercase letters"):
        plan("Bad_Name", 3)


def test_a_link_is_a_rate_and_a_queue_of_50_ms_unless_given():
    assert link_shape("100mbit") == ("100mbit", "50ms")
    assert link_shape("25Mbit/400ms") == ("25mbit", "400ms")
    with pytest.raises(TestbedError, match="not a rate tc understands"):
        link_shape("/400ms")
    with pytest.raises(TestbedError, match="the queue in '25mbit/0ms'"):
        plan("tvd", 2, "25mbit/0ms")
    assert plan("tvd", 2, "25mbit", "cubic").congestion == "cubic"
    assert plan("tvd", 2).congestion == ""  # this machine's default


def test_down_leaves_sshds_privilege_directory_to_a_testbed_still_up():
    # sshd needs /run/sshd for every new connection. The testbed that made it hands it on to
    # one still up, and the last one down removes it.
    from transientvod.testbed.sshd import PRIVSEP_DIR

    if PRIVSEP_DIR.exists():
        pytest.skip(f"{PRIVSEP_DIR} exists already (this machine's own sshd, or a testbed that is up owns it)")
    first, second = new_testbed_name(), new_testbed_name()
    cluster.up(first, 2)
    try:
        cluster.up(second, 2)
        try:
            cluster.down(first)
            assert PRIVSEP_DIR.exists() and cluster.PRIVSEP_MADE_BY_TESTBED.exists()
            host = load_record(second).layout.hosts[0].name
            assert head_run(second, ["ssh", host, "true"]).returncode == 0, "the testbed still up lost its SSH"
        finally:
            cluster.down(second)
        assert not PRIVSEP_DIR.exists() and not cluster.PRIVSEP_MADE_BY_TESTBED.exists()
    finally:
        if load_record(first) is not None:
            cluster.down(first)
    assert leftovers(first) == [] and leftovers(second) == []
