"""One job's MLflow run: opened by the launcher before `horovodrun` starts, closed by it when
the job ends (or by rank 0 of a job started by hand), with what the run is logged as (params,
tags, the configuration label, the final metrics).

- `open_run`: experiment, params, tags, the resolved config. A tracking store that cannot be
  reached or written is an error there, before any server is paid for. The run id travels
  to the workers in the resolved config (`tracking.run_id`), so whichever process is rank 0,
  after any number of revocations, logs into the same run (through sender.MetricSender).
- `close_run`: what rank 0 could not send (sender.resend_unsent), then the final metrics,
  the cost-versus-accuracy figure (figure.py), the summary, and the run status.

Which store, and its checks, are store.py's; names of params, tags and metrics are names.py's.
"""
from __future__ import annotations

import logging
import subprocess
import time
from importlib import resources

import yaml

from transientvod.config import Config, to_yaml
from transientvod.tracking.figure import log_figure
import transientvod.tracking.names as names
from transientvod.tracking.sender import UNSENT_FILE, resend_unsent
from transientvod.tracking.store import artifact_location, check_writable, client, redacted, store_uri, unreachable
from transientvod.version import __version__

log = logging.getLogger(__name__)


def tracking_uri(config: Config) -> str:
    """The job's store: tracking.uri, else $MLFLOW_TRACKING_URI, else <run.output_dir>/mlflow.db."""
    return store_uri(config.tracking.uri, config.run.output_dir)


# -- what a run is logged as -----------------------------------------------------------------

def configuration_label(config: Config) -> str:
    """A short name for the cluster configuration: what `compare` groups runs by."""
    c, x = config.cluster, config.exchange
    workers = str(c.max_np) if c.min_np == c.max_np else f"{c.min_np}-{c.max_np}"
    label = f"{workers} x {config.cost.instance_type} {config.cost.market}"
    if x.staleness or x.codec != "none":
        label += f", s={x.staleness} {x.codec}"
    return label


def run_params(config: Config) -> dict[str, str]:
    o = config.optimizer
    return {
        names.PARAM_MODEL: f"{config.model.name}-{config.model.depth}x{config.model.width}",
        names.PARAM_DATASET: config.data.dataset,
        names.PARAM_CLOUD: config.cost.cloud,
        names.PARAM_INSTANCE_TYPE: config.cost.instance_type,
        names.PARAM_MARKET: config.cost.market,
        names.PARAM_MIN_WORKERS: str(config.cluster.min_np),
        names.PARAM_MAX_WORKERS: str(config.cluster.max_np),
        names.PARAM_STALENESS: str(config.exchange.staleness),
        names.PARAM_CODEC: config.exchange.codec,
        names.PARAM_LR_RULE: f"{o.lr_scaling} x active workers, warm-up {o.warmup_steps}, {o.schedule}",
        names.PARAM_COMMIT_EVERY: str(config.train.commit_every),
        names.PARAM_CHECKPOINT_EVERY: str(config.train.checkpoint_every),
        names.PARAM_STEPS: str(config.train.steps),
        names.PARAM_BATCH_SIZE: str(config.data.batch_size),
    }


def git_commit() -> str:
    """transientvod's commit when the package runs from a git checkout of it (an editable
    install); 'unknown' for an installed wheel, which the version tag names. A repository the
    installed package merely sits in (a user's project with its venv inside) does not count:
    git must track the package's own files."""
    package = str(resources.files("transientvod"))
    try:
        tracked = subprocess.run(["git", "-C", package, "ls-files", "--error-unmatch", "__init__.py"],
                                 capture_output=True, text=True, timeout=10)
        if tracked.returncode != 0:
            return "unknown"
        done = subprocess.run(["git", "-C", package, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def run_tags(config: Config) -> dict[str, str]:
    trace = ""
    if config.spot.provider == "trace":
        trace = f"{config.spot.trace} run {config.spot.trace_run}"
    return {
        names.TAG_PROVIDER: config.spot.provider,
        names.TAG_TRACE: trace,
        names.TAG_GIT_COMMIT: git_commit(),
        names.TAG_VERSION: __version__,
        names.TAG_CONFIGURATION: configuration_label(config),
    }


# -- the launcher's part ---------------------------------------------------------------------

def open_run(config: Config) -> str:
    """Create the MLflow run (experiment, params, tags, config) and put its id and the
    store's URI into `config.tracking`, for the workers; returns the run id.

    A job restarted in the same run directory after it was killed (it resumes from its
    checkpoint) continues its unfinished MLflow run instead of starting a second one."""
    uri = tracking_uri(config)
    check_writable(uri)
    mlflow_client = client(uri)
    from mlflow.entities import Param, RunTag

    try:
        experiment = mlflow_client.get_experiment_by_name(config.tracking.experiment)
        if experiment is None:
            experiment_id = mlflow_client.create_experiment(
                config.tracking.experiment, artifact_location=artifact_location(uri, config.tracking.experiment))
        else:
            experiment_id = experiment.experiment_id
        run_id = _unfinished_run(mlflow_client, config, uri, experiment_id)
        if run_id:
            mlflow_client.update_run(run_id, status="RUNNING")
            log.info("continuing the unfinished MLflow run %s of %s", run_id, config.run_dir)
        else:
            run_id = mlflow_client.create_run(experiment_id, run_name=config.run.name).info.run_id
            mlflow_client.log_batch(run_id, params=[Param(k, v) for k, v in run_params(config).items()],
                                    tags=[RunTag(k, v) for k, v in run_tags(config).items()])
        config.tracking.uri, config.tracking.run_id = uri, run_id
        # The artifact is for reading: the store's password, if its URI has one, stays out.
        mlflow_client.log_text(run_id, redacted(to_yaml(config)), names.ARTIFACT_CONFIG)
    except Exception as e:  # MLflow wraps store and HTTP failures in several exception types
        raise unreachable(uri, e) from None
    log.info("MLflow run %s in experiment '%s' at %s", run_id, config.tracking.experiment, redacted(uri))
    return run_id


def _unfinished_run(mlflow_client, config: Config, uri: str, experiment_id: str) -> str:
    """The run id in the run directory's previous resolved config, if that run is in this
    store and experiment and did not finish; else ''."""
    previous = config.run_dir / "config.yaml"
    if not previous.exists():
        return ""
    try:
        tracking = (yaml.safe_load(previous.read_text()) or {}).get("tracking") or {}
    except yaml.YAMLError:
        return ""
    run_id = tracking.get("run_id") or ""
    if not run_id or tracking.get("uri") != uri:
        return ""
    from mlflow.exceptions import MlflowException
    try:
        run = mlflow_client.get_run(run_id)
    except MlflowException:
        return ""  # deleted, or another store
    if run.info.experiment_id != experiment_id or run.info.status == "FINISHED":
        return ""
    return run_id


def close_run(config: Config, summary: dict | None, succeeded: bool) -> None:
    """Send what rank 0 could not, then the final metrics, figure and summary; mark the run
    finished or failed, or killed when its budget stopped it (a run not finished: the next
    `train` with a larger budget continues it). Never raises: the job's results are on disk
    whatever MLflow says."""
    uri, run_id = tracking_uri(config), config.tracking.run_id
    try:
        mlflow_client = client(uri)
        resend_unsent(mlflow_client, run_id, config.run_dir / UNSENT_FILE)
        if summary is not None:
            final = final_metrics(summary)
            if final:
                from mlflow.entities import Metric

                now_ms = int(time.time() * 1000)
                mlflow_client.log_batch(run_id, metrics=[Metric(k, v, now_ms, summary["steps"])
                                                         for k, v in final.items()])
            mlflow_client.log_dict(run_id, summary, names.ARTIFACT_SUMMARY)
            log_figure(mlflow_client, run_id)
        status = "FINISHED" if succeeded else "FAILED"
        if succeeded and summary is not None and summary.get("budget_stop"):
            status = "KILLED"
        mlflow_client.set_terminated(run_id, status=status)
    except Exception as e:
        log.warning("%s The run's metrics stay in %s.", unreachable(uri, e),
                    config.run_dir / "metrics.jsonl")


def final_metrics(summary: dict) -> dict[str, float]:
    out = {}
    if "wall_seconds" in summary:
        out[names.METRIC_WALL_HOURS] = summary["wall_seconds"] / 3600.0
    cost = summary.get("cost")
    if cost:
        out[names.METRIC_COST] = cost["cost_usd"]
        out[names.METRIC_ON_DEMAND_COST] = cost["on_demand_usd"]
        out[names.METRIC_SAVINGS_PCT] = cost["savings_pct"]
        if summary.get("test_accuracy", 0) > 0:
            out[names.METRIC_USD_PER_POINT] = cost["cost_usd"] / (100.0 * summary["test_accuracy"])
    return out
