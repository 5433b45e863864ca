"""Start an elastic training job: check what the user gave, then hand it to `horovodrun`.

Everything a user can get wrong (config, data, discovery script) is checked here first, so
the mistake is one sentence on the terminal, before Horovod starts workers and before any
checkpoint is written. The job itself runs as Horovod's own elastic driver and workers.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from transientvod.channel.protocol import JOB_ERRORS, LAUNCHER_ENV
from transientvod.config import Config, write_resolved
from transientvod.ending_signals import ending_signals
from transientvod.head.worker_env import worker_environment

HOST_LINE = re.compile(r"^[^\s:]+:\d+$")
HOST_COOLDOWN_MAX = 600  # seconds: the longest a failed host is kept out (cluster.host_cooldown)


class LaunchError(RuntimeError):
    """Something the user must fix before a job can start; one sentence."""


@dataclass
class JobResult:
    returncode: int
    wall_seconds: float
    summary: dict | None
    why: str = ""  # for a failed job: one sentence, when the launcher knows the cause


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
    # The task (the built-in one too) imported, its data and model built once here: a missing
    # file or a broken function is reported now, not by every worker at once. (Imported late:
    # torch is slow to import and not needed above.)
    from transientvod.tasks import TaskError
    from transientvod.tasks.check import check_task
    try:
        if script is None:
            check_task(config)
    except TaskError as e:
        raise LaunchError(str(e)) from None
    check_prices(config)
    check_budget_left(config)
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


SPOT_HOSTS_MODULE = "transientvod.launch.spot_hosts"  # launch/spot_hosts.py, shipped in the package


def spot_hosts_command(state_file: str | Path, stale_after: float | None = None) -> str:
    """The discovery command horovodrun runs every second: the installed package's spot_hosts
    module, with this launcher's Python (a checkout need not exist where the job runs)."""
    command = f"{shlex.quote(sys.executable)} -m {SPOT_HOSTS_MODULE} --state-file {shlex.quote(str(state_file))}"
    return command if stale_after is None else f"{command} --stale-after {stale_after:g}"


REPLAY_START_TIMEOUT = 120  # seconds to wait for a worker on every host before a replay starts
STATE_REFRESH_SECONDS = 5  # how often the first host state is rewritten while the replay waits
log = logging.getLogger(__name__)


def start_spot_watcher(config: Config) -> tuple[str, threading.Event]:
    """Start the watcher thread for `spot.provider`; returns the discovery command and the
    event that stops the watcher. The first host state is written before this returns, so
    discovery has an answer from Horovod's very first call."""
    from transientvod.spot.providers.from_config import provider_from_config
    from transientvod.spot.hosts import HostState, write_host_state
    from transientvod.spot.providers.provider import ProviderError
    from transientvod.spot.watch import wait_for_workers, watch
    from transientvod.spot.reach.gate import gate_for
    from transientvod.spot.reach.ssh import CONNECT_TIMEOUT_SECONDS

    state_file = config.host_state_file
    gate = gate_for(config.spot)
    try:
        provider = provider_from_config(config.spot, start_time=time.time())
        now = time.time()
        first_hosts = provider.poll(now)
        if gate is not None:
            first_hosts = gate.settle(first_hosts, timeout=CONNECT_TIMEOUT_SECONDS + 10)
        write_host_state(state_file, HostState(provider.name, now, first_hosts))
    except ProviderError as e:
        raise LaunchError(str(e)) from None
    stop = threading.Event()
    replay = config.spot.provider == "trace"

    def watch_job():
        nonlocal provider
        if replay:
            # The replay's clock starts when the job runs on every host, as the study's did.
            initial = [h.name for h in first_hosts if h.state == "usable"]
            deadline = time.monotonic() + REPLAY_START_TIMEOUT
            while not wait_for_workers(state_file, initial, STATE_REFRESH_SECONDS, stop):
                if stop.is_set():
                    return
                if time.monotonic() >= deadline:
                    log.warning("not every host had a worker after %d s; starting the replay anyway",
                                REPLAY_START_TIMEOUT)
                    break
                # Rewrite the first state while the workers start, or discovery would call
                # it stale (and the watcher stopped) on a cluster slower to start than that.
                write_host_state(state_file, HostState(provider.name, time.time(), first_hosts))
            provider = provider_from_config(config.spot, start_time=time.time())
        watch(provider, state_file, poll_seconds=config.spot.poll_seconds,
              revoke=revocation(config) if replay else None, stop=stop, gate=gate)
        if gate is not None:
            gate.close()

    threading.Thread(target=watch_job, name="spot-watcher", daemon=True).start()
    if config.spot.provider == "trace" and config.notices.source == "none":
        config.notices.source = "hoststate"  # a replayed notice reaches workers through the same file
    return spot_hosts_command(state_file, config.spot.stale_after), stop


def revocation(config: Config):
    """What a replayed revocation does to its host (`spot.revoke`): kill its workers, or make a
    testbed host vanish from the network (`vanish:<testbed>`), as a revoked VM does."""
    from transientvod.spot.watch import workers_killer

    kind, _, testbed = config.spot.revoke.partition(":")
    if kind != "vanish":
        return workers_killer(config.host_state_file)
    from transientvod.testbed import cluster

    def vanish(host: str) -> str:
        cluster.vanish(testbed, host)
        return f"it vanished from testbed {testbed}'s network"
    return vanish


def check_script(path: str, args: list[str]) -> list[str]:
    """A library-mode script must exist; its absolute path and arguments, the workers' command
    after python (horovodrun starts remote workers in this directory, not the script's)."""
    if not os.path.isfile(path):
        raise LaunchError(f"the script {path} does not exist; check the path given to --script.")
    return [os.path.abspath(path), *args]


def script_environment(worker_config: str) -> dict[str, str]:
    """What a library-mode script's workers get besides the allow-listed environment: where the
    job's config is, and the collective timeout that the task loop sets before hvd.init() itself
    (state.bound_collective_waits), since the script calls hvd.init() on its own."""
    from transientvod.worker.state import COLLECTIVE_TIMEOUT_SECONDS
    from transientvod.library.job import JOB_CONFIG_ENV

    return {JOB_CONFIG_ENV: worker_config,
            "HOROVOD_GLOO_OP_TIMEOUT_SECONDS": os.environ.get("HOROVOD_GLOO_OP_TIMEOUT_SECONDS",
                                                              str(COLLECTIVE_TIMEOUT_SECONDS))}


def run_job(config: Config, discovery: str | None = None, script: list[str] | None = None) -> JobResult:
    """`script`: a library-mode script's path and arguments (horovodrun's workers run it), or
    None for the task loop."""
    # SIGTERM and SIGHUP take Ctrl-C's ending path (horovodrun and its workers stopped, the
    # finally blocks run): ending_signals.EndingSignal.
    with ending_signals("the launcher"):
        return _run_job(config, discovery, script)


def _run_job(config: Config, discovery: str | None, script: list[str] | None) -> JobResult:
    if script is not None:
        script = check_script(script[0], script[1:])
    stop_watcher = None
    if config.spot.provider != "none":
        if discovery:
            raise LaunchError("give either spot.provider or a discovery script, not both.")
        discovery, stop_watcher = start_spot_watcher(config)
    try:
        prepared = prepare(config, discovery, script)
        summary_path = config.run_dir / "summary.json"
        summary_path.unlink(missing_ok=True)
        with head_services(config, prepared) as services, job_instances_ended_at_exit(config):
            worker_config = services.worker_config if services else str(prepared.config_path)
            # Remote hosts get the channel's token file before discovery lists them (remote_hosts.py).
            discovery = services.discovery(prepared.discovery) if services else prepared.discovery
            argv = horovodrun_command(config, worker_config, discovery, script)
            print(f"transientvod: starting {' '.join(shlex.quote(a) for a in argv)}", flush=True)
            started = time.monotonic()
            job_errors = config.run_dir / JOB_ERRORS
            job_errors.unlink(missing_ok=True)
            returncode, timed_out = run_horovodrun(argv, {**(services.worker_env if services else {}),
                                                          **(script_environment(worker_config) if script else {}),
                                                          LAUNCHER_ENV: "1"}, job_errors)
            wall = time.monotonic() - started
    finally:
        if stop_watcher is not None:
            stop_watcher.set()
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if summary is not None and returncode != 0 and summary["steps"] == config.train.steps:
        # Horovod reports a worker that died after the job had finished (for example a
        # replayed revocation that came after the last step) as a failure of the whole job.
        # Rank 0 wrote the summary after the last step, so the training did finish.
        log.warning("horovodrun exited with %d after the job had finished all %d steps (a worker "
                    "ended after the end); the results stand", returncode, config.train.steps)
        returncode = 0
    why = ""
    c = config.cluster
    if timed_out == STOPPED:
        why, returncode = first_job_error(job_errors), STOPPED_EXIT
    elif returncode != 0 and timed_out == INTERFACES_TIMED_OUT and not c.network_interface:
        why = (f"Horovod waited cluster.elastic_timeout ({c.elastic_timeout} s) for two hosts to find their common "
               f"network interface and fewer were up; name it in cluster.network_interface (lo for a job on this "
               f"machine alone, else the hosts' own, for example eth0 or ens5) or start when two hosts are up.")
    elif returncode != 0 and timed_out:
        why = (f"the job had fewer than cluster.min_np ({c.min_np}) workers for cluster.elastic_timeout "
               f"({c.elastic_timeout} s) and stopped; start it again when servers are back and it resumes "
               f"from its last durable checkpoint in {config.checkpoint_dir}.")
    if summary is not None:
        summary["wall_seconds"] = round(wall, 1)
        if config.tracking.enabled:
            from transientvod.tracking.store import redacted

            # Printed, kept in summary.json and logged to MLflow: the store's password stays out.
            summary["mlflow"] = {"tracking_uri": redacted(config.tracking.uri), "run_id": config.tracking.run_id,
                                 "experiment": config.tracking.experiment}
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    if config.tracking.enabled:
        from transientvod.tracking.run import close_run
        close_run(config, summary, succeeded=returncode == 0)
    return JobResult(returncode, wall, summary, why)


@contextlib.contextmanager
def job_instances_ended_at_exit(config: Config):
    """Once the job has started: at its end, however it ends (finished, failed, Ctrl-C), every
    instance of an AWS job is terminated, and its fleet stops (spot/job_instances.py, the same
    function `transientvod down` calls), unless spot.end_instances_at_exit is false. A job that
    fails its checks before it starts leaves them running, to be fixed and started again."""
    if config.spot.provider != "aws" or not config.spot.end_instances_at_exit:
        yield
        return
    try:
        yield
    finally:
        end_job_instances(config)


def end_job_instances(config: Config) -> list:
    """Terminates every instance of the AWS job of `config` and prints what it ended; an AWS
    error is one sentence naming what to end by hand, never a traceback over the job's own end."""
    from transientvod.spot.provisioning.job_instances import JobInstances, describe_ended
    from transientvod.spot.providers.provider import ProviderError

    spot = config.spot
    try:
        job = JobInstances(spot.job_tag, spot.region or None, spot.endpoint_url or None, whose="the launcher's")
        ended = job.end_all(by="launcher")
    except ProviderError as e:
        print(f"transientvod: could not end the instances of job {spot.job_tag} ({e}); run 'transientvod down "
              f"--job-tag {spot.job_tag}'.", file=sys.stderr, flush=True)
        return []
    print(f"transientvod: the job ended; {describe_ended(spot.job_tag, ended, 'the launcher')}", flush=True)
    return ended


@contextlib.contextmanager
def head_services(config: Config, prepared: Prepared):
    """For a job with remote hosts, the launcher's channel and store server (remote_hosts.py)
    while the job runs; None for a job on this machine alone."""
    if not prepared.remote_job:
        yield None
        return
    from transientvod.channel.protocol import ChannelError
    from transientvod.head.remote_hosts import HeadServices, RemoteHostsError
    from transientvod.tracking.store import TrackingError
    try:
        services = HeadServices(config, prepared.remote_hosts)
    except (ChannelError, RemoteHostsError, TrackingError) as e:
        raise LaunchError(str(e)) from None
    with services:
        yield services


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


def format_summary(summary: dict) -> str:
    rows = [
        ("steps", summary["steps"]),
        ("wall time", f"{summary['wall_seconds']:.1f} s"),
        ("world sizes seen", " -> ".join(str(n) for n in summary["world_sizes_seen"])),
        ("revocations survived", summary["revocations_survived"]),
        ("steps lost", summary["steps_lost"]),
    ]
    for name, value in summary.get("test_metrics", {"test_accuracy": summary.get("test_accuracy", 0.0)}).items():
        rows.append((name.replace("_", " "), f"{100 * value:.2f} %" if name == "test_accuracy" else f"{value:.4f}"))
    cost = summary.get("cost")
    if cost:
        rows.append(("cost", f"${cost['cost_usd']:.4f} (on-demand ${cost['on_demand_usd']:.4f}, "
                             f"{cost['savings_pct']:.1f} % saved)"))
    rows.append(("checkpoint", summary["checkpoint"]))
    mlflow = summary.get("mlflow")
    if mlflow:
        rows.append(("MLflow run", f"{mlflow['run_id']} in {mlflow['tracking_uri']}"))
        rows.append(("see it with", f"mlflow ui --backend-store-uri {mlflow['tracking_uri']}"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)

