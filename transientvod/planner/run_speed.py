"""Training speed per world size from a run this project logged in MLflow: calibrate the planner
with a short real job instead of the study's numbers.

    uri, run_id = run_in_directory("runs/calib")              # its resolved config names both
    measured, why = speeds_by_size(uri, run_id)               # {1: 9.8, 2: 19.1}: steps/s of k workers
    model = measured_model("k80", measured, k80_shape, why)   # every size, k = 0..64

The training loop logs `samples_per_s` (all workers together) and `active_workers` by step,
and the run's `batch_size` param (per worker). The planner counts steps of one worker's batch,
as the study did (each asynchronous worker's update is a step), so k workers' samples/s over
the batch is k workers' steps/s. Each world size the run trained at gets the median of its
logged points, which leaves out the odd slow interval (the first steps, a re-formed ring); a
size needs MIN_POINTS of them, or its number would be one interval's noise. Sizes the run did
not train at follow the K80's measured scaling from the nearest size it did (the study's
curve: the only one measured for every size). A job's --steps must then count batches of that
run's size. Never imports torch or horovod.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from transientvod.planner.speed import SpeedModel
from transientvod.planner.study_data import PlanError
from transientvod.tracking.names import METRIC_THROUGHPUT, METRIC_WORKERS, PARAM_BATCH_SIZE
from transientvod.tracking.store import readable_client, reason

MIN_POINTS = 3  # logged samples_per_s points a world size needs before its median counts
RUN_CONFIG = "config.yaml"  # the resolved config the launcher writes into the run directory


def run_in_directory(path) -> tuple[str, str]:
    """(tracking URI, MLflow run id) of the job whose run directory is `path` (runs/NAME): the
    launcher writes both into the resolved config there."""
    path = Path(path)
    config_path = path / RUN_CONFIG
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise PlanError(f"{path} is not a transientvod run directory (it has no {RUN_CONFIG}); give runs/NAME of a "
                        "job that ran, or an MLflow run id.") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise PlanError(f"cannot read {config_path} ({getattr(e, 'strerror', None) or e}).") from None
    tracking = config.get("tracking") if isinstance(config, dict) else None
    uri, run_id = (tracking.get("uri"), tracking.get("run_id")) if isinstance(tracking, dict) else (None, None)
    if not uri or not run_id:
        raise PlanError(f"the run in {path} logged no metrics to MLflow (its {RUN_CONFIG} names no tracking run); "
                        "calibrate with a job that ran with tracking on.")
    return str(uri), str(run_id)


def speeds_by_size(tracking_uri: str, run_id: str) -> tuple[dict[int, float], str]:
    """{world size: steps/s of that many workers}, and one line per size saying where it came from."""
    from mlflow.exceptions import MlflowException

    client = readable_client(tracking_uri)
    try:
        run = client.get_run(run_id)
        throughput = client.get_metric_history(run_id, METRIC_THROUGHPUT)
        workers = client.get_metric_history(run_id, METRIC_WORKERS)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise PlanError(f"run {run_id} does not exist in {tracking_uri}; list runs with "
                            "`transientvod compare --experiment NAME`.") from None
        raise PlanError(f"cannot read run {run_id} from {tracking_uri} ({reason(e)}).") from None
    if not throughput:
        raise PlanError(f"run {run_id} in {tracking_uri} logged no {METRIC_THROUGHPUT}; calibrate with a run that "
                        "trained for at least one logging interval.")
    try:
        batch = int(run.data.params[PARAM_BATCH_SIZE])
    except (KeyError, ValueError):
        raise PlanError(f"run {run_id} in {tracking_uri} has no whole-number {PARAM_BATCH_SIZE} param; it was not "
                        "logged by transientvod.") from None
    if not workers:
        raise PlanError(f"run {run_id} in {tracking_uri} logged no {METRIC_WORKERS}, so its samples/s cannot be "
                        "split by world size.")
    by_step = sorted(workers, key=lambda m: m.step)
    worker_steps = np.array([m.step for m in by_step])
    worker_values = np.array([m.value for m in by_step])
    points: dict[int, list[float]] = {}
    for point in throughput:
        at = np.searchsorted(worker_steps, point.step, side="right") - 1  # the count logged at or before
        k = int(worker_values[max(at, 0)])
        if k < 1:
            raise PlanError(f"run {run_id} logged {k} active workers at step {point.step}; it was not logged by "
                            "transientvod.")
        points.setdefault(k, []).append(point.value / batch)
    few = {k: len(v) for k, v in points.items() if len(v) < MIN_POINTS}
    if few:
        k, count = min(few.items())
        raise PlanError(f"run {run_id} trained too few steps with {k} workers ({count} logged {METRIC_THROUGHPUT} "
                        f"point{'s' if count != 1 else ''}, {MIN_POINTS} needed); run it longer at that size or "
                        "calibrate with a run that did not pass through it.")
    measured = {k: float(np.median(v)) for k, v in sorted(points.items())}
    bad = [k for k, speed in measured.items() if not speed > 0]
    if bad:
        raise PlanError(f"run {run_id} in {tracking_uri} logged no positive {METRIC_THROUGHPUT} with {bad[0]} workers.")
    lines = [f"  k={k}: {speed:.4f} steps/s = median over {len(points[k])} points of run {run_id}'s "
             f"{METRIC_THROUGHPUT} / batch {batch}" for k, speed in measured.items()]
    return measured, "\n".join(lines)


def measured_model(gpu: str, measured: dict[int, float], shape, source: str) -> SpeedModel:
    """A SpeedModel for k = 0..len(shape)-1: the measured sizes as measured, every other size
    from the nearest measured one (the smaller on a tie) times the K80 scaling `shape` between
    them."""
    shape = np.asarray(shape, dtype=np.float64)
    top = shape.size - 1
    beyond = [k for k in measured if k > top]
    if beyond:
        raise PlanError(f"the run trained with {beyond[0]} workers; the planner's scaling covers 1 to {top}.")
    sizes = sorted(measured)
    speeds = np.zeros(top + 1)
    for k in range(1, top + 1):
        nearest = min(sizes, key=lambda m: (abs(m - k), m))
        speeds[k] = measured[nearest] * shape[k] / shape[nearest]
    lines = [f"{gpu.upper()} steps/s from a run (others: the nearest measured size x K80's scaling):", source]
    return SpeedModel(gpu=gpu, steps_per_second=speeds, source="\n".join(lines))
