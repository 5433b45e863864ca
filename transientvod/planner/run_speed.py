"""One server's training speed from a run this project logged in MLflow: calibrate the planner
with a short real job instead of the study's numbers.

    steps_per_s, why = speed_from_run("sqlite:///runs/mlflow.db", run_id, k80_shape)

The training loop logs `samples_per_s` (all workers together) and `active_workers` by step,
and the run's `batch_size` param (per worker). The planner counts steps of one worker's batch,
as the study did (each asynchronous worker's update is a step), so k workers' samples/s over
the batch is k workers' steps/s, and one server's speed is that over the scaling of k servers
(`shape[k]`, K80's measured curve; 1 for one worker). The median over the logged points
leaves out the first, slow steps of a short job. A job's --steps must then count batches of
that run's size. Never imports torch or horovod.
"""
from __future__ import annotations

import numpy as np

from transientvod.planner.study_data import PlanError
from transientvod.tracking.names import METRIC_THROUGHPUT, METRIC_WORKERS, PARAM_BATCH_SIZE
from transientvod.tracking.store import readable_client, reason


def speed_from_run(tracking_uri: str, run_id: str, shape) -> tuple[float, str]:
    """Steps/s of one server, and one line saying where it came from."""
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
                        "split per server.")
    shape = np.asarray(shape, dtype=np.float64)
    worker_steps = np.array([m.step for m in sorted(workers, key=lambda m: m.step)])
    worker_values = np.array([m.value for m in sorted(workers, key=lambda m: m.step)])
    per_server = []
    for point in throughput:
        at = np.searchsorted(worker_steps, point.step, side="right") - 1  # the count logged at or before
        k = int(worker_values[max(at, 0)])
        if not 1 <= k < shape.size:
            raise PlanError(f"run {run_id} logged {k} active workers; the planner's scaling covers 1 to "
                            f"{shape.size - 1}.")
        per_server.append(point.value / batch / shape[k])
    speed = float(np.median(per_server))
    if not speed > 0:
        raise PlanError(f"run {run_id} in {tracking_uri} logged no positive {METRIC_THROUGHPUT}.")
    return speed, (f"{speed:.4f} steps/s of one server = median over {len(per_server)} points of run {run_id}'s "
                   f"{METRIC_THROUGHPUT} / batch {batch} / K80's scaling at its active workers")
