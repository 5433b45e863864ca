"""One training job on a testbed: started on the head with `transientvod train`, watched through
its run directory (the hosts share the file system). Used by the testbed's tests and benchmarks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from transientvod.testbed import sshd
from transientvod.testbed.record import Record

TESTBED_HOSTS_MODULE = "transientvod.launch.testbed_hosts"  # launch/testbed_hosts.py, shipped in the package


class RehearsalError(RuntimeError):
    """The job ended or stalled before what was waited for; the message ends with its log."""


class Rehearsal:
    def __init__(self, record: Record, directory: Path, name: str, config: dict):
        # Absolute: the job runs from this directory, where a relative path would be read twice.
        directory = Path(directory).resolve()
        config = {**config, "run": {"name": name, "output_dir": str(directory / "runs")}}
        self.record = record
        self.run_dir = directory / "runs" / name
        self.config_path = directory / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = directory / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def cloud_hosts(self, lag_seconds: float = 5.0) -> str:
        """Discovery as a cloud's API answers it: the hosts that are up, `lag_seconds` late."""
        return f"{sys.executable} -m {TESTBED_HOSTS_MODULE} --name {self.record.name} --lag {lag_seconds:g}"

    def start(self, discovery: str | None, env: dict | None = None) -> None:
        argv = [sys.executable, "-m", "transientvod.cli", "train", "--config", str(self.config_path)]
        argv += ["--discovery", discovery] if discovery else []
        # Its own session, so that a hung job can be killed with every process it started here.
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(sshd.exec_argv(self.record.layout.head, argv), cwd=self.config_path.parent,
                                         stdout=log, stderr=subprocess.STDOUT, env=env or dict(os.environ),
                                         start_new_session=True)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise RehearsalError(f"the job did not end within {timeout} s\n{self.log()}") from None

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.last_step() < step:
            if self.proc.poll() is not None:
                raise RehearsalError(f"the job ended (exit {self.proc.returncode}) before step {step}\n{self.log()}")
            if time.monotonic() > deadline:
                raise RehearsalError(f"the job did not reach step {step} within {timeout} s\n{self.log()}")
            time.sleep(0.1)

    def rows(self, name: str) -> list[dict]:
        path = self.run_dir / name
        if not path.exists():
            return []
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # the line being written right now
        return rows

    def synced(self) -> list[dict]:
        return [e for e in self.rows("events.jsonl") if e["event"] == "synced"]

    def first_sync_at_size(self, size: int, after: float) -> dict | None:
        rows = [e for e in self.synced() if e["size"] == size and e["time"] > after]
        return min(rows, key=lambda e: e["time"]) if rows else None

    def rank0_host(self) -> str:
        return next(e["host"] for e in reversed(self.synced()) if e["rank"] == 0)

    def last_step(self) -> int:
        return max((row["step"] for row in self.rows("metrics.jsonl")), default=0)

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def log(self) -> str:
        return "--- job log (last 12000 characters) ---\n" + self.log_path.read_text(errors="replace")[-12000:]
