"""Everything a user can get wrong, checked before horovodrun starts: the discovery script's
output, SSH to the remote hosts, a shared checkpoint directory, the task (imported, its data and
model built once), the prices and the budget left. Each mistake is one sentence (LaunchError),
before Horovod starts workers and before any checkpoint is written; `prepare` ends with the
resolved config on disk."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from transientvod.config import Config, write_resolved


HOST_LINE = re.compile(r"^[^\s:]+:\d+$")


class LaunchError(RuntimeError):
    """Something the user must fix before a job can start; one sentence."""


def check_discovery_script(command: str) -> list[str]:
    """Run the discovery command once: it must be runnable and print `host:slots` lines."""
    if not command.strip():
        raise LaunchError("no host discovery script; set cluster.discovery_script or pass --discovery.")
    argv = shlex.split(command)
    program = argv[0]
    if os.sep in program or os.path.exists(program):
        if not os.path.exists(program):
            raise LaunchError(f"the discovery script {program} does not exist; check the path.")
        if not os.access(program, os.X_OK):
            raise LaunchError(f"the discovery script {program} is not executable; run 'chmod +x {program}' "
                              f"or call it through its interpreter (for example 'python {program}').")
    elif shutil.which(program) is None:
        raise LaunchError(f"the discovery command '{program}' is not on PATH; give its full path.")
    for arg in argv[1:]:
        if arg.endswith(".py") and not os.path.exists(arg):
            raise LaunchError(f"the discovery script {arg} does not exist; check the path.")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"the discovery script '{command}' did not answer within 30 s; Horovod calls it "
                          "every second, so it must return quickly.") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise LaunchError(f"the discovery script '{command}' exited with {done.returncode} ({why}); fix it first.")
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    bad = [line for line in lines if not HOST_LINE.match(line)]
    if bad:
        raise LaunchError(f"the discovery script '{command}' printed {bad[0]!r}; it must print only host:slots lines.")
    return lines


@dataclass
class Prepared:
    discovery: str
    config_path: Path  # the resolved config, in the run directory
    remote_hosts: list[str]  # the hosts discovery listed that are other machines
    remote_job: bool  # hosts are other machines: those listed, or a cloud's, listed or not yet


def prepare(config: Config, discovery: str | None = None, script: list[str] | None = None) -> Prepared:
    """All checks, then the resolved config on disk. A library-mode `script` brings its own
    model and data: no task is tried."""
    from transientvod.checkpoint.shared_disk import SharedDiskError, check_checkpoint_reach
    from transientvod.spot.reach.ssh import remote_hosts

    discovery = discovery or config.cluster.discovery_script
    remote = remote_hosts([line.rsplit(":", 1)[0] for line in check_discovery_script(discovery)])
    check_ssh_reach(remote)
    try:
        check_checkpoint_reach(config, remote)
    except SharedDiskError as e:
        raise LaunchError(str(e)) from None
    check_prices(config)
    check_budget_left(config)
    # The task (the built-in one too) imported, its data and model built once here: a missing
    # file or a broken function is reported now, not by every worker at once. After the checks
    # of the config alone: importing torch and building an optimizer take seconds (4 s of a
    # 5 s `train` with a mistyped instance type, before this came after them).
    from transientvod.tasks import TaskError
    from transientvod.tasks.check import check_task
    try:
        if script is None:
            check_task(config)
    except TaskError as e:
        raise LaunchError(str(e)) from None
    config.cluster.discovery_script = discovery
    if config.tracking.enabled:
        # Last of the checks, so that a job that cannot start leaves no empty run behind.
        from transientvod.tracking.run import open_run
        from transientvod.tracking.store import TrackingError
        try:
            open_run(config)
        except TrackingError as e:
            raise LaunchError(str(e)) from None
    try:
        config_path = write_resolved(config, config.run_dir)
    except OSError as e:
        raise LaunchError(f"cannot write to the run directory {config.run_dir} ({e.strerror}); "
                          "choose another run.output_dir.") from None
    from transientvod.spot.reach.gate import CLOUD_PROVIDERS
    return Prepared(discovery, config_path, remote, bool(remote) or config.spot.provider in CLOUD_PROVIDERS)


def check_ssh_reach(hosts: list[str]) -> None:
    """Every remote host discovery lists takes the launcher's SSH login: horovodrun would stop
    the whole job on one that does not."""
    from transientvod.spot.reach.ssh import UnreachableHosts, check_reach
    try:
        check_reach(hosts)
    except UnreachableHosts as e:
        raise LaunchError(str(e)) from None


def check_prices(config: Config) -> None:
    """Every price the job's bill needs exists: an unknown type is an error now, not a $0 bill."""
    from transientvod.billing.job import check_prices as check
    from transientvod.billing.prices import PriceError
    try:
        check(config)
    except PriceError as e:
        raise LaunchError(str(e)) from None


def check_budget_left(config: Config) -> None:
    """A job whose latest durable checkpoint says it has spent cost.budget_usd already (the
    ledger its cost meter keeps there, billed up to the moment it was saved) is refused before
    anything starts, in one sentence: it would stop again at its first vote."""
    budget = config.cost.budget_usd
    if budget is None:
        return
    from transientvod.billing.budget import spent_at_start
    from transientvod.billing.job import JobBill
    from transientvod.checkpoint import CheckpointError, open_store

    where = config.checkpoint_dir
    if "://" not in where and not Path(where).is_dir():
        return  # a first run: nothing spent, and no directory made here
    try:
        checkpoint = open_store(where, keep_last=config.checkpoint.keep_last).load_latest()
    except CheckpointError as e:
        raise LaunchError(str(e)) from None
    progress = (checkpoint.state.get("progress") or {}) if checkpoint is not None else {}
    if not progress.get("cost_ledger"):
        return
    now = time.time()
    spent = JobBill(config, progress["cost_ledger"], now).spent_until(progress.get("ledger_saved_at") or now)
    if spent_at_start(spent, budget):
        raise LaunchError(f"the job's checkpoint of step {progress.get('step', '?')} in {where} says it has spent "
                          f"${spent:.2f} already, its whole budget (cost.budget_usd) of ${budget:.2f} or more; run "
                          "train again with a larger cost.budget_usd to resume.")


def check_script(path: str, args: list[str]) -> list[str]:
    """A library-mode script must exist; its absolute path and arguments, the workers' command
    after python (horovodrun starts remote workers in this directory, not the script's)."""
    if not os.path.isfile(path):
        raise LaunchError(f"the script {path} does not exist; check the path given to --script.")
    return [os.path.abspath(path), *args]
