"""MLflow: every run's params, metrics by step, cost, figures and summary, for comparison in
MLflow's UI and with `transientvod compare`.

Who does what:

- The launcher opens the run before `horovodrun` starts (`open_run`): experiment, params,
  tags, the resolved config. A tracking store that cannot be reached or written is an error
  there, before any server is paid for. The run id travels to the workers in the resolved
  config (`tracking.run_id`), so whichever process is rank 0, after any number of
  revocations, logs into the same run.
- Rank 0 logs metrics by step through a `MetricSender`: a background thread, so a slow or
  unreachable tracking server never stalls training. While the server is away metrics wait
  in memory (one warning); when it answers again they go out in order. What is still unsent
  when the worker ends goes to `<run dir>/mlflow-unsent.jsonl`.
- The launcher closes the run (`close_run`): it sends that file if the server answers again,
  then the final metrics, the cost-versus-accuracy figure, the summary, and the run status.

The default store is `sqlite:///<run.output_dir>/mlflow.db`: one store for all the runs in an
output directory, so that MLflow's UI can put them side by side (MLflow refuses its old file
store). Names of params, tags and metrics live in `tracking_names.py`.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import threading
import time
import typing
from pathlib import Path

import yaml

from transientvod import tracking_names as names
from transientvod.config import Config, to_yaml

log = logging.getLogger(__name__)

RETRY_SECONDS = float(os.environ.get("TRANSIENTVOD_MLFLOW_RETRY_SECONDS", "2"))
# How long a finishing worker, and the launcher, wait for buffered metrics to go out.
FLUSH_SECONDS = float(os.environ.get("TRANSIENTVOD_MLFLOW_FLUSH_SECONDS", "20"))
UNSENT_FILE = "mlflow-unsent.jsonl"
BATCH_LIMIT = 1000  # MLflow's log_batch accepts at most 1000 metrics per call
REPO_ROOT = Path(__file__).resolve().parents[1]


class TrackingError(RuntimeError):
    """The tracking store cannot be used (unreachable, unwritable, unknown run); one sentence."""


def tracking_uri(config: Config) -> str:
    """The configured URI, else $MLFLOW_TRACKING_URI, else the output directory's SQLite store."""
    uri = config.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri:
        return uri
    return "sqlite:///" + str((Path(config.run.output_dir) / "mlflow.db").resolve())


def _client(uri: str):
    # Fail fast instead of MLflow's default seven retries with exponential backoff (minutes):
    # the sender retries on its own schedule, and the launcher wants an answer now.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def check_store(uri: str) -> None:
    """A SQLite store's directory must be writable (created if missing); other stores are
    checked by talking to them in `open_run`."""
    path = _sqlite_path(uri)
    if path is None:
        return
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-check-"):
            pass
    except OSError as e:
        raise TrackingError(f"the MLflow store directory {directory} is not writable ({e.strerror}); set "
                            "tracking.uri or MLFLOW_TRACKING_URI to a writable place.") from None


def _unreachable(uri: str, error: Exception) -> TrackingError:
    text = str(error)
    if "Connection refused" in text or "Max retries exceeded" in text or "NewConnectionError" in text:
        why = "no server listens there"
    elif "timed out" in text.lower():
        why = "it timed out"
    else:
        why = (text.strip().splitlines() or [type(error).__name__])[0][:160]
    return TrackingError(f"the MLflow tracking store {uri} does not answer ({why}); start it, or set "
                         "tracking.uri / MLFLOW_TRACKING_URI to one that runs, or tracking.enabled=false.")


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
    """The project's commit, when it runs from a git checkout; 'unknown' otherwise."""
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
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
        names.TAG_CONFIGURATION: configuration_label(config),
    }


# -- the launcher's part ---------------------------------------------------------------------

def open_run(config: Config) -> str:
    """Create the MLflow run (experiment, params, tags, config) and put its id and the
    store's URI into `config.tracking`, for the workers; returns the run id.

    A job restarted in the same run directory after it was killed (it resumes from its
    checkpoint) continues its unfinished MLflow run instead of starting a second one."""
    from mlflow.entities import Param, RunTag

    uri = tracking_uri(config)
    check_store(uri)
    client = _client(uri)
    try:
        experiment = client.get_experiment_by_name(config.tracking.experiment)
        if experiment is None:
            experiment_id = client.create_experiment(config.tracking.experiment,
                                                     artifact_location=_artifact_location(uri, config))
        else:
            experiment_id = experiment.experiment_id
        run_id = _unfinished_run(client, config, uri, experiment_id)
        if run_id:
            client.update_run(run_id, status="RUNNING")
            log.info("continuing the unfinished MLflow run %s of %s", run_id, config.run_dir)
        else:
            run_id = client.create_run(experiment_id, run_name=config.run.name).info.run_id
            client.log_batch(run_id, params=[Param(k, v) for k, v in run_params(config).items()],
                             tags=[RunTag(k, v) for k, v in run_tags(config).items()])
        config.tracking.uri, config.tracking.run_id = uri, run_id
        client.log_text(run_id, to_yaml(config), names.ARTIFACT_CONFIG)
    except Exception as e:  # MLflow wraps store and HTTP failures in several exception types
        raise _unreachable(uri, e) from None
    log.info("MLflow run %s in experiment '%s' at %s", run_id, config.tracking.experiment, uri)
    return run_id


def _unfinished_run(client, config: Config, uri: str, experiment_id: str) -> str:
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
        run = client.get_run(run_id)
    except MlflowException:
        return ""  # deleted, or another store
    if run.info.experiment_id != experiment_id or run.info.status == "FINISHED":
        return ""
    return run_id


def _artifact_location(uri: str, config: Config) -> str | None:
    # With a SQLite store MLflow would put artifacts in ./mlruns of whatever directory the
    # job started from; keep them next to the database instead. A server decides for itself.
    path = _sqlite_path(uri)
    if path is None:
        return None
    return (path.parent / "mlartifacts" / config.tracking.experiment).resolve().as_uri()


def close_run(config: Config, summary: dict | None, succeeded: bool) -> None:
    """Send what rank 0 could not, then the final metrics, figure and summary; mark the run
    finished or failed. Never raises: the job's results are on disk whatever MLflow says."""
    uri, run_id = tracking_uri(config), config.tracking.run_id
    try:
        client = _client(uri)
        resend_unsent(client, run_id, config.run_dir / UNSENT_FILE)
        if summary is not None:
            final = final_metrics(summary)
            if final:
                from mlflow.entities import Metric

                now_ms = int(time.time() * 1000)
                client.log_batch(run_id, metrics=[Metric(k, v, now_ms, summary["steps"]) for k, v in final.items()])
            client.log_dict(run_id, summary, names.ARTIFACT_SUMMARY)
            _log_figure(client, run_id)
        client.set_terminated(run_id, status="FINISHED" if succeeded else "FAILED")
    except Exception as e:
        log.warning("%s The run's metrics stay in %s.", _unreachable(uri, e),
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


def resend_unsent(client, run_id: str, path: Path) -> int:
    """Send the metrics a worker could not, then remove the file; returns how many."""
    if not path.exists():
        return 0
    from mlflow.entities import Metric

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    metrics = [Metric(r["key"], r["value"], r["timestamp"], r["step"]) for r in rows]
    for start in range(0, len(metrics), BATCH_LIMIT):
        client.log_batch(run_id, metrics=metrics[start:start + BATCH_LIMIT])
    path.unlink()
    log.info("sent %d metrics that waited in %s", len(metrics), path)
    return len(metrics)


def _log_figure(client, run_id: str) -> None:
    from transientvod.cost_figure import cost_accuracy_figure

    def history(key):
        return {m.step: m for m in client.get_metric_history(run_id, key)}

    accuracy, cost, on_demand = (history(k) for k in (names.METRIC_ACCURACY, names.METRIC_COST,
                                                      names.METRIC_ON_DEMAND_COST))
    started_ms = client.get_run(run_id).info.start_time
    points = [(accuracy[s].value, cost[s].value, on_demand[s].value, (accuracy[s].timestamp - started_ms) / 3.6e6)
              for s in sorted(accuracy) if s in cost and s in on_demand]
    if not points:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / names.ARTIFACT_FIGURE
        cost_accuracy_figure(points, path)
        client.log_artifact(run_id, str(path))


# -- rank 0's part ---------------------------------------------------------------------------

class _Point(typing.NamedTuple):
    """One metric value as MLflow stores it (mlflow.entities.Metric, without importing MLflow)."""
    key: str
    value: float
    timestamp: int  # milliseconds since the epoch
    step: int


class MetricSender:
    """Sends metrics to one MLflow run from a background thread.

    Neither the constructor nor `log()` imports MLflow or waits for the tracking server:
    `log()` only appends to a list, and the thread imports MLflow (seconds on a loaded
    machine) and sends. Rank 0 runs this inside the training loop, where every other rank
    waits for it at the next collective: a stall there is a stall of the whole ring, with the
    steps since the last commit at risk if a server goes meanwhile. The thread sends in
    batches, in order; when a send fails it warns once, keeps everything, and tries again
    every RETRY_SECONDS. `close()` waits up to FLUSH_SECONDS for the rest and writes
    whatever is still unsent to `unsent_path` for the launcher to send.
    """

    def __init__(self, uri: str, run_id: str, unsent_path: Path, retry_seconds: float = RETRY_SECONDS):
        self.uri = uri
        self.run_id = run_id
        self.unsent_path = Path(unsent_path)
        self.retry_seconds = retry_seconds
        self._client = None  # made by the thread
        self._pending: list[_Point] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._failing_since: float | None = None
        self._thread = threading.Thread(target=self._send_loop, name="mlflow-sender", daemon=True)
        self._thread.start()

    def log(self, metrics: dict[str, float], step: int, at: float | None = None) -> None:
        timestamp = int((time.time() if at is None else at) * 1000)
        with self._lock:
            self._pending.extend(_Point(k, float(v), timestamp, step) for k, v in metrics.items())
        self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self, timeout: float = FLUSH_SECONDS) -> int:
        """Flush, then stop; returns how many metrics were left for the launcher to send."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        with self._lock:
            left, self._pending = self._pending, []
        if left:
            with open(self.unsent_path, "a") as f:
                for m in left:
                    f.write(json.dumps({"key": m.key, "value": m.value, "timestamp": m.timestamp,
                                        "step": m.step}) + "\n")
            log.warning("MLflow at %s did not take %d metrics before the worker ended; they are in %s "
                        "and the launcher sends them when the store answers", self.uri, len(left), self.unsent_path)
        return len(left)

    def _send_loop(self) -> None:
        try:
            self._ready_client()  # import MLflow before the first metric arrives, off the training loop's path
        except Exception:
            pass  # _send tries again, and says what is wrong
        while True:
            # Sleep until there is something to send, or until the next retry while failing.
            self._wake.wait(self.retry_seconds if self._failing_since is not None else None)
            self._wake.clear()
            while True:
                with self._lock:
                    batch = list(self._pending[:BATCH_LIMIT])
                if not batch or not self._send(batch):
                    break
                with self._lock:
                    del self._pending[:len(batch)]
            # Closing: leave once all is sent; while failing, retry until close() stops waiting.
            if self._closing and not self.pending():
                return

    def _ready_client(self):
        if self._client is None:
            self._client = _client(self.uri)
        return self._client

    def _send(self, batch: list[_Point]) -> bool:
        try:
            from mlflow.entities import Metric

            self._ready_client().log_batch(self.run_id, metrics=[Metric(*point) for point in batch])
        except Exception as e:  # an unreachable server shows up as several exception types
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning("%s Training goes on; metrics wait in memory until it answers.",
                            _unreachable(self.uri, e))
            return False
        if self._failing_since is not None:
            log.info("MLflow at %s answers again after %.0f s; sending %d buffered metrics", self.uri,
                     time.monotonic() - self._failing_since, self.pending())
            self._failing_since = None
        return True
