"""`transientvod watch` feeds launch/spot_hosts.py; a bad provider is one sentence."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import yaml

from conftest import REPO, TRANSIENTVOD


def test_watch_replays_a_trace_into_the_host_state_file(tmp_path):
    state = tmp_path / "hosts.json"
    config = tmp_path / "watch.yaml"
    config.write_text(yaml.safe_dump({"spot": {
        "provider": "trace", "trace": "k80_spot_2workers_vm_trace.csv", "trace_run": "spot2-us-east1-c-run1",
        "hosts": "hostA,hostB", "state_file": str(state), "poll_seconds": 0.1,
        # worker-0 went at 941.8 s of trace time, its notice 30 s earlier; start 2 s of real
        # time (x100) before the notice, so that a loaded machine still sees both hosts first.
        "time_scale": 100.0, "start_at": 711.8}}))
    watcher = subprocess.Popen(TRANSIENTVOD + ["watch", "--config", str(config)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = set()
        wanted = {"hostA:1\nhostB:1\n", "hostA:1\n"}
        deadline = time.monotonic() + 30
        while not wanted <= seen and time.monotonic() < deadline:
            if state.exists():
                done = subprocess.run([sys.executable, str(REPO / "launch" / "spot_hosts.py"), "--state-file", str(state)],
                                      capture_output=True, text=True, timeout=10)
                seen.add(done.stdout)
            time.sleep(0.1)
    finally:
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=10)
    assert "hostA:1\nhostB:1\n" in seen, seen  # both VMs at first
    assert "hostA:1\n" in seen, seen  # then worker-0's host (hostB) is dropped at its notice
    assert "hostB (spot2-us-east1-c-run1-worker-0) has an interruption notice" in err


def test_unknown_provider_is_one_sentence(tmp_path):
    config = tmp_path / "watch.yaml"
    config.write_text("spot: {provider: gcp}\n")
    done = subprocess.run(TRANSIENTVOD + ["watch", "--config", str(config)], capture_output=True, text=True,
                          timeout=30, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"transientvod: {config}: spot.provider is 'gcp'; it must be one of none, trace, aws, gce."]


def test_broken_trace_names_the_line(tmp_path):
    trace = tmp_path / "mine.csv"
    trace.write_text("VM_name,Uptime,Revoked\nr1-master,100,Job completed\nr1-worker-0,soon,Revoked\n")
    config = tmp_path / "watch.yaml"
    config.write_text(yaml.safe_dump({"spot": {"provider": "trace", "trace": str(trace), "hosts": "a,b"}}))
    done = subprocess.run(TRANSIENTVOD + ["watch", "--config", str(config)], capture_output=True, text=True,
                          timeout=30, cwd=REPO)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "line 3" in lines[0] and "Traceback" not in done.stderr
