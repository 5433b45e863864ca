"""horovodrun itself: its command line for an elastic job, running it with its stderr passed
through line by line, reading why it stopped (too few hosts for too long, no common network
interface, a rank's recorded error), and stopping it and its workers."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from transientvod.config import Config
from transientvod.head.preflight import LaunchError
from transientvod.head.worker_env import worker_environment


log = logging.getLogger(__name__)


HOST_COOLDOWN_MAX = 600  # seconds: the longest a failed host is kept out (cluster.host_cooldown)


def horovodrun_command(config: Config, worker_config: str, discovery: str, script: list[str] | None = None) -> list[str]:
    """`worker_config`: the resolved config's path, or its URL on the launcher's channel.
    `script`: a library-mode script and its arguments, which the workers run in place of the
    task loop (they find the config in the environment: library/job.py)."""
    c = config.cluster
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if horovodrun is None:
        raise LaunchError("horovodrun is not installed; run 'make install' (or bash launch/install_horovod.sh).")
    argv = [horovodrun, "-np", str(c.np or c.max_np), "--min-np", str(c.min_np), "--max-np", str(c.max_np),
            "--host-discovery-script", discovery, "--slots-per-host", str(c.slots_per_host),
            "--elastic-timeout", str(c.elastic_timeout), "--gloo"]
    if c.network_interface:
        argv += ["--network-interface", c.network_interface]
    if c.reset_limit:
        argv += ["--reset-limit", str(c.reset_limit)]
    if c.host_cooldown:
        argv += ["--blacklist-cooldown-range", str(c.host_cooldown), str(max(c.host_cooldown, HOST_COOLDOWN_MAX))]
    if script:
        return argv + [sys.executable, *script]
    return argv + [sys.executable, "-m", "transientvod.worker.train", "--config", worker_config]


# Horovod's driver says this when fewer than --min-np slots stayed available for --elastic-timeout
# (its message begins "Timed out waiting for {activity}", placeholder and all).
CAPACITY_TIMEOUT = "Please check that you have enough resources to run at least"
# Where horovodrun waits at the start of an elastic job without --network-interface: for two
# hosts to probe. Its traceback names this frame before the capacity timeout's message.
INTERFACE_PROBE = "get_common_interfaces"
CAPACITY_TIMED_OUT, INTERFACES_TIMED_OUT = "capacity", "interfaces"
STOPPED = "stopped"  # a rank recorded an error that stops the job (train.report_job_error)
STOPPED_EXIT = 3  # the job's exit code then, as the worker's (train.py)
JOB_ERROR_POLL_SECONDS = 0.5
WORKER_LINE = re.compile(r"^\[\d+\]<(stdout|stderr)>:")  # how horovodrun prefixes a worker's lines


def run_horovodrun(argv: list[str], extra_env: dict[str, str] | None = None,
                   job_errors: Path | None = None) -> tuple[int, str]:
    """Run horovodrun, passing its stderr through line by line (its driver logs there);
    returns its exit code and what ended it early, if anything: waiting for capacity, for two
    hosts to probe for their network interface, or an error that stops the job ("" when none),
    so that the launcher can say so in one sentence. Its stdout goes straight to ours. It starts with
    the allow-listed environment (worker_environment): what it has, every worker's ssh command
    line shows.

    A rank whose task raised (or that cannot go on for the whole job: train.report_job_error)
    writes `job_errors` and exits; the other ranks would roll back and go on without it, or
    each raise the same error and print the same traceback. So the first such record stops
    horovodrun (its workers go with it)."""
    timed_out, probing = "", False
    env = {**worker_environment(os.environ), **(extra_env or {})}
    with subprocess.Popen(argv, stderr=subprocess.PIPE, bufsize=1, text=True, errors="replace", env=env) as proc:
        failed = threading.Event()
        if job_errors is not None:
            threading.Thread(target=stop_on_job_error, args=(proc, job_errors, failed), name="job-errors",
                             daemon=True).start()
        try:
            for line in proc.stderr:
                if failed.is_set() and not WORKER_LINE.match(line):
                    continue  # horovodrun's own traceback about the stop we caused: the task's comes instead
                sys.stderr.write(line)
                probing = probing or INTERFACE_PROBE in line
                if CAPACITY_TIMEOUT in line and not timed_out:
                    timed_out = INTERFACES_TIMED_OUT if probing else CAPACITY_TIMED_OUT
        except KeyboardInterrupt:
            # Ctrl-C, or SIGTERM/SIGHUP through ending_signals. A terminal's Ctrl-C reaches
            # horovodrun too, but `kill` of the launcher alone does not: horovodrun would go on
            # without it, and its workers with it.
            stop_horovodrun(proc)
            raise
        sys.stderr.flush()
    return proc.returncode, STOPPED if failed.is_set() else timed_out


HOROVODRUN_STOP_SECONDS = 30  # for horovodrun to end its workers after SIGTERM, before SIGKILL


def stop_horovodrun(proc: subprocess.Popen) -> None:
    """SIGTERM horovodrun and wait until it has exited: its middlemen see it gone and end each
    worker's process group (remote workers go with their ssh). SIGKILL after
    HOROVODRUN_STOP_SECONDS. What it still prints passes through."""
    if proc.poll() is None:
        proc.terminate()
    try:
        _, rest = proc.communicate(timeout=HOROVODRUN_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        log.warning("horovodrun did not exit within %d s of SIGTERM; killing it", HOROVODRUN_STOP_SECONDS)
        proc.kill()
        _, rest = proc.communicate()
    sys.stderr.write(rest or "")
    sys.stderr.flush()


def stop_on_job_error(proc: subprocess.Popen, job_errors: Path, failed: threading.Event) -> None:
    """Stop horovodrun once a rank has recorded an error that stops the job (SIGTERM: horovodrun
    ends its workers, then reports their exit codes in a traceback of its own)."""
    while proc.poll() is None:
        if job_errors.exists() and job_errors.stat().st_size:
            failed.set()
            proc.terminate()
            return
        time.sleep(JOB_ERROR_POLL_SECONDS)


def first_job_error(job_errors: Path) -> str:
    """The first error a rank recorded: the task's traceback, if any, printed here, once; its sentence returned."""
    first = json.loads(job_errors.read_text().splitlines()[0])
    if first["traceback"]:
        print(f"transientvod: the task's traceback, from rank {first['rank']} ({first['host'] or 'this host'}):\n"
              f"{first['traceback'].rstrip()}", file=sys.stderr, flush=True)
    return f"{first['error']} (rank {first['rank']}); the job was stopped."
