"""`transientvod train` ended by SIGTERM (kill, systemd) or SIGHUP (a closing SSH session) sent
to the launcher alone: it takes Ctrl-C's ending path (ending_signals), stops horovodrun, and
horovodrun's workers end with it; nothing the launcher started is left running. Without it,
Python's default would end the launcher at once and leave horovodrun and the workers training
(and a cloud job's instances billing) on their own."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import BOTH, wait_until

pytestmark = pytest.mark.slow


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): a pid reused later has another."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(root: int) -> dict[int, str]:
    """Every process under `root` (by parent pid), with its start time."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            started = start_time(child)
            if started is not None:
                found[child] = started
                todo.append(child)
    return found


def still_running(processes: dict[int, str]) -> list[int]:
    alive = []
    for pid, started in processes.items():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if start_time(pid) == started and state != "Z":
            alive.append(pid)
    return alive


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_launcher_stops_horovodrun_and_every_worker(job, tmp_path, signum):
    j = job(f"signal-{signum.name.lower()}", train={"steps": 20000})
    log_path = tmp_path / "job.log"
    proc = j.start(j.discovery(f"0={BOTH}"), log_path)
    try:
        wait_until(lambda: j.last_step() >= 30 and len({e["pid"] for e in j.rows("events.jsonl")}) == 2, 120,
                 "step 30 on two workers", proc)
        started = descendants(proc.pid)  # horovodrun, its middlemen, the workers
        workers = {e["pid"] for e in j.rows("events.jsonl")}
        assert workers <= started.keys(), (workers, started)
        signalled = time.monotonic()
        os.kill(proc.pid, signum)  # the launcher alone, as `kill PID` does; not its group
        proc.wait(timeout=90)
        print(f"the launcher exited {time.monotonic() - signalled:.1f} s after {signum.name}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    log = log_path.read_text()
    assert proc.returncode == 128 + signum, log[-6000:]
    assert (f"transientvod: {signum.name} stopped the job (horovodrun and its workers ended); the same command "
            "resumes it from its last durable checkpoint.") in log, log[-6000:]
    # horovodrun has exited (the launcher waits for it); its middlemen end the workers' groups.
    deadline = time.monotonic() + 30
    while still_running(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert still_running(started) == [], log[-6000:]
    assert j.last_step() < 20000
