"""Start an elastic training job: check what the user gave, then hand it to `horovodrun`.

Everything a user can get wrong (config, data, discovery script) is checked here first, so
the mistake is one sentence on the terminal, before Horovod starts workers and before any
checkpoint is written (preflight.py). The job itself runs as Horovod's own elastic driver and
workers (horovodrun.py), fed by discovery (spot_watcher.py for a spot provider).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import time
from dataclasses import dataclass

from transientvod.channel.protocol import JOB_ERRORS, LAUNCHER_ENV
from transientvod.config import Config
from transientvod.ending_signals import ending_signals
from transientvod.head.horovodrun import (INTERFACES_TIMED_OUT, STOPPED, STOPPED_EXIT, first_job_error,
                                          horovodrun_command, run_horovodrun)
from transientvod.head.preflight import LaunchError, Prepared, check_script, prepare
from transientvod.head.spot_watcher import job_instances_ended_at_exit, start_spot_watcher


@dataclass
class JobResult:
    returncode: int
    wall_seconds: float
    summary: dict | None
    why: str = ""  # for a failed job: one sentence, when the launcher knows the cause


log = logging.getLogger(__name__)


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
