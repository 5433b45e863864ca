"""The job channel's token is on no process's command line, on any host (channel/token.py).

A real job over SSH on testbed hosts that share no disk with the head, not even the token's
directory: each host has its own empty tmpfs over ~/.transientvod/channel-tokens (and over the
run directory), so its workers can read the token only if the launcher wrote it there through
ssh's stdin. While the job runs, every process's argv (/proc/*/cmdline) is scanned: the testbed's
hosts are namespaces that share this machine's process table, so one scan sees the head's and
every host's processes. Two positive controls show the scan sees what a leak would be on: a
value planted on the command line of a process started on a host over ssh is found, and the
workers' own ssh command lines (which carry the token file's name) are seen for every host."""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LOCAL_HOSTS, TINY_JOB, job_environment
from testbed_support import command_lines, require_testbed, testbed_factory  # noqa: F401 (a fixture)

from transientvod.channel import token as channel_token
from transientvod.testbed import sshd
from transientvod.testbed.rehearsal import Rehearsal

pytestmark = [require_testbed(), pytest.mark.slow]


def new_token_file(directory: Path, before: set[Path], proc: subprocess.Popen, timeout: float = 120) -> Path:
    """The token file the job's launcher writes on the head (its name is random)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        made = set(directory.glob("*.token")) - before
        if made:
            return made.pop()
        time.sleep(0.1)
    pytest.fail("the launcher wrote no token file on the head")


def test_the_channel_token_reaches_private_hosts_and_no_command_line(testbed_factory, tmp_path):
    runs = tmp_path / "runs"
    tokens = channel_token.home() / channel_token.TOKEN_DIR
    made = [d for d in (tokens.parent, tokens) if not d.exists()]  # by this test: removed at its end
    try:
        run_the_job(testbed_factory, tmp_path, runs, tokens)
    finally:
        for directory in reversed(made):
            directory.rmdir()  # empty again: the launcher removed its token file


def run_the_job(testbed_factory, tmp_path: Path, runs: Path, tokens: Path) -> None:
    record = testbed_factory(2, private_disk=(runs, tokens))
    h1, h2 = record.layout.hosts
    config = json.loads(json.dumps(TINY_JOB))
    config["train"]["steps"] = 400
    config["cluster"].update(min_np=2, max_np=2, network_interface="eth0")
    config["checkpoint"] = {"dir": str(tmp_path / "checkpoints")}  # shared by every host
    config["tracking"] = {"enabled": True}  # the head's MLflow server too, from cluster.head_ports
    job = Rehearsal(record, tmp_path, "token", config)
    assert job.run_dir.parent == runs
    before = set(tokens.glob("*.token"))

    # The positive control: a value on the command line of a process a host runs, started over
    # ssh from the head as horovodrun starts workers.
    planted = f"tvd-planted-{secrets.token_hex(6)}"
    control = subprocess.Popen(sshd.exec_argv(record.layout.head, [
        "ssh", h1.name, f"{sys.executable} -c 'import time; time.sleep(900)' {planted}"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        job.start(f"{LOCAL_HOSTS} --hosts {h1.name}:1,{h2.name}:1", env=job_environment())
        token_path = new_token_file(tokens, before, job.proc)
        assert token_path.stat().st_mode & 0o777 == 0o600
        token = token_path.read_text()
        assert len(token) >= 32
        planted_seen, workers_seen, leaks, store_ports = False, set(), [], set()
        while job.proc.poll() is None:
            for pid, line in command_lines().items():
                served = re.search(r"mlflow server --backend-store-uri \S+ --host \S+ --port (\d+)", line)
                if served and str(job.run_dir.parent) in line:
                    store_ports.add(int(served.group(1)))
                if token in line:
                    leaks.append(line[:300])
                if planted in line and "time.sleep(900)" in line and not line.startswith("ssh "):
                    planted_seen = True  # the host's own process, not the head's ssh client
                # horovodrun's worker command lines: the token file's name rides them, never the token.
                if "transientvod.worker.train" in line and f"{channel_token.TOKEN_FILE_ENV}=" in line:
                    workers_seen |= {h.name for h in (h1, h2) if f"HOROVOD_HOSTNAME={h.name} " in line}
            time.sleep(0.2)
    finally:
        os.killpg(control.pid, signal.SIGKILL)
        control.wait()
        for pid, line in command_lines().items():  # the host's end of the control, which ssh's end leaves
            if planted in line:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert job.proc.returncode == 0, job.log()
    assert planted_seen, "the scan never found the planted value: it proves nothing"
    assert workers_seen == {h1.name, h2.name}, f"the scan saw the workers of {workers_seen} only"
    assert leaks == []
    # The head's services took ports of cluster.head_ports (default 30000-30099): the channel's is
    # in the workers' --config URL that the launcher prints, the MLflow server's on its own argv.
    channel_port = int(re.search(r"--config http://[\d.]+:(\d+)/config\.yaml", job.log()).group(1))
    assert len(store_ports) == 1 and {channel_port, *store_ports} <= set(range(30000, 30100)), (channel_port, store_ports)
    assert channel_port not in store_ports
    assert job.summary()["steps"] == 400  # the records reached the head through the channel
    # Nothing of the token is left on the head, nor in the run's files or the job's log.
    assert not token_path.exists() and not token_path.with_suffix(".hosts").exists()
    assert token not in job.log_path.read_text(errors="replace")
    for path in job.run_dir.parent.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
