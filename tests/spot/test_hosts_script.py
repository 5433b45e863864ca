"""launch/spot_hosts.py, the discovery script, run as Horovod runs it: a fresh process. Each
test runs it both ways: as the checkout's file, and as the installed package's module, through
the command the launcher gives horovodrun."""
from __future__ import annotations

import shlex
import subprocess
import sys
import time

import pytest

from conftest import REPO
from transientvod.head.spot_watcher import SPOT_HOSTS_MODULE, spot_hosts_command
from transientvod.spot.hosts import GONE, NOTICED, HostState, HostStatus, write_host_state

SCRIPT = str(REPO / "launch" / "spot_hosts.py")


@pytest.fixture(params=["checkout file", "installed module"])
def discover(request):
    def run(state_file, *extra):
        if request.param == "checkout file":
            argv = [sys.executable, SCRIPT, "--state-file", str(state_file)]
        else:
            argv = shlex.split(spot_hosts_command(state_file))
        return subprocess.run(argv + list(extra), capture_output=True, text=True, timeout=30)
    return run


def test_prints_usable_hosts_only_as_host_slots(discover, tmp_path):
    state = tmp_path / "hosts.json"
    write_host_state(state, HostState("trace", time.time(), [
        HostStatus("a", 4), HostStatus("b", 1, NOTICED, notice_at=time.time()), HostStatus("c", 2, GONE),
        HostStatus("d", 8)]))
    done = discover(state)
    assert done.returncode == 0
    assert done.stdout == "a:4\nd:8\n"
    assert done.stderr == ""


def test_empty_output_when_no_host_is_usable(discover, tmp_path):
    state = tmp_path / "hosts.json"
    write_host_state(state, HostState("aws", time.time(), [HostStatus("a", 1, GONE)]))
    done = discover(state)
    assert done.returncode == 0 and done.stdout == ""


def test_stale_state_is_reported_and_last_hosts_kept(discover, tmp_path):
    state = tmp_path / "hosts.json"
    write_host_state(state, HostState("aws", time.time() - 120, [HostStatus("a", 1), HostStatus("b", 1, NOTICED)]))
    done = discover(state, "--stale-after", "30")
    assert done.returncode == 0
    assert done.stdout == "a:1\n"
    assert "120 s old" in done.stderr or "s old" in done.stderr


def test_never_had_a_state_exits_non_zero_with_one_sentence(discover, tmp_path):
    done = discover(tmp_path / "missing.json")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "does not exist" in done.stderr and "Traceback" not in done.stderr


def test_unreadable_state_file(discover, tmp_path):
    state = tmp_path / "hosts.json"
    state.write_text("{not json")
    done = discover(state)
    assert done.returncode == 1 and "not valid JSON" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("run", [f"runpy.run_path({SCRIPT!r}, run_name='__main__')",
                                 f"runpy.run_module({SPOT_HOSTS_MODULE!r}, run_name='__main__')"])
def test_the_script_imports_neither_torch_nor_horovod(tmp_path, run):
    state = tmp_path / "hosts.json"
    write_host_state(state, HostState("trace", time.time(), [HostStatus("a", 1)]))
    # Run the script in-process, then list any torch/horovod module it pulled in.
    probe = (f"import runpy, sys; sys.argv = ['spot_hosts.py', '--state-file', {str(state)!r}]\n"
             f"try:\n    {run}\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["a:1", "[]"], done.stdout
