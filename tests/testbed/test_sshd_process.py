"""The testbed's view of a host's sshd process: a killed sshd waiting to be reaped is gone.

A testbed sshd detaches from its parent, so once killed it is a zombie until this machine's
init reaps it, which may take a while; os.kill(pid, 0) still finds a zombie. CI once saw
the fleet-join test find the sshd that boot had just killed. These tests make the zombie
and the sleeping process themselves (children of the test), so they need no testbed."""
from __future__ import annotations

import subprocess
import sys
import time

from transientvod.testbed import sshd
from transientvod.testbed.layout import Machine

HOST = Machine(name="tvdtest-h1", address="10.0.0.2", role="host")


def write_pid(tmp_path, pid: int) -> None:
    sshd.pid_path(tmp_path, HOST).write_text(f"{pid}\n")


def test_a_zombie_is_not_a_running_sshd(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Not reaped: wait until the kernel shows it as a zombie (no wait() from us yet).
        for _ in range(1000):
            if sshd.process_state(child.pid) == "gone":
                break
            time.sleep(0.01)
        with open(f"/proc/{child.pid}/stat") as stat:
            assert stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # the case under test exists
        write_pid(tmp_path, child.pid)
        assert sshd.running_pid(tmp_path, HOST) is None
    finally:
        child.wait()


def test_stop_returns_once_the_process_is_gone_and_forgets_its_pid(tmp_path):
    child = subprocess.Popen(["sleep", "60"])
    try:
        write_pid(tmp_path, child.pid)
        assert sshd.running_pid(tmp_path, HOST) == child.pid
        sshd.stop(tmp_path, HOST)
        assert sshd.process_state(child.pid) == "gone"
        assert not sshd.pid_path(tmp_path, HOST).exists()
        assert sshd.running_pid(tmp_path, HOST) is None
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -9  # stop killed it
