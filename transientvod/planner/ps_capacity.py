"""The parameter server as a shared resource with a capacity: how fast P100 and V100 clusters go.

    fit = fit_capacity()                   # from the K80 on-demand runs of 1, 2, 4 and 8 workers
    model = ps_speed("v100", 14.45, fit)   # steps/s of k V100s behind the study's one PS
    print(markdown_table(predictions(fit)))  # the 2, 4 and 8 P100 / V100 predictions docs show
    python -m transientvod.planner.ps_capacity

The study trained asynchronously: each worker computes a gradient (its own speed, s steps/s),
then the one parameter server applies it and sends the parameters back. The PS serves one
update at a time, at most C a second. That is a closed queueing network: k workers that
"think" 1/s seconds, one FIFO server of rate C; Mean Value Analysis gives its exact
throughput X(k) (product form: exponential service assumed). X(k) grows like k s while
k s << C, and can never pass C: faster workers reach the capacity sooner.

Fit: the K80 on-demand runs (whole 64K-step jobs at 1, 2, 4 and 8 workers; the 1-PS curves of
other sizes time evaluations only, speed.py) fix C; s follows from the 1-worker run for every
C (X(1) = 1 / (1/s + 1/C)), and C minimises the squared log errors at 2, 4 and 8 workers,
searched on a grid of 10 to 100,000 steps/s. P100 and V100: s from the study's single-server
time (its published table), the same C (the same PS machine and model). Where it is least sure:
8 K80s make 35 steps/s, a few percent of the fitted C, so the K80s barely load the PS and the
capacity is an extrapolation well beyond anything measured; 4 P100s or V100s load it 1.5x as
hard as 8 K80s. Exponential service overstates queueing for a PS whose update time hardly
varies. Never imports torch or horovod.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transientvod.planner.speed import FULL_JOB_STEPS, MEASURED_SIZES, SpeedModel, calibrate_k80
from transientvod.planner.study_data import PlanError

CAPACITY_GRID = np.logspace(1, 5, 4001)  # steps/s the PS may serve: 10 .. 100,000


@dataclass(frozen=True)
class CapacityFit:
    capacity: float  # updates/s the one PS serves at most
    k80_worker: float  # steps/s one K80 computes with no PS wait
    measured: dict  # k -> measured K80 steps/s
    errors_pct: dict  # k -> model / measured - 1, in percent


def mva_throughput(worker: float, capacity: float, max_workers: int) -> np.ndarray:
    """X(k) for k = 0..max_workers: k workers of think time 1/worker, one FIFO PS of rate capacity."""
    throughput = np.zeros(max_workers + 1)
    queue = 0.0
    for k in range(1, max_workers + 1):
        response = (1.0 + queue) / capacity  # an arriving update waits for those queued (arrival theorem)
        throughput[k] = k / (1.0 / worker + response)
        queue = throughput[k] * response
    return throughput


def _worker_for(single: float, capacity: float) -> float | None:
    """The no-wait worker speed that makes one worker go `single` steps/s behind `capacity`."""
    think = 1.0 / single - 1.0 / capacity
    return 1.0 / think if think > 0 else None


def fit_capacity(k80: SpeedModel | None = None) -> CapacityFit:
    k80 = k80 if k80 is not None else calibrate_k80()
    measured = {k: float(k80.steps_per_second[k]) for k in MEASURED_SIZES}
    sizes = [k for k in MEASURED_SIZES if k > 1]
    best = None
    for capacity in CAPACITY_GRID:
        worker = _worker_for(measured[1], capacity)
        if worker is None:
            continue
        model = mva_throughput(worker, capacity, max(sizes))
        error = sum(np.log(model[k] / measured[k]) ** 2 for k in sizes)
        if best is None or error < best[0]:
            best = (error, capacity, worker, model)
    if best is None:
        raise PlanError("no parameter-server capacity fits the K80 on-demand runs; check their files.")
    _, capacity, worker, model = best
    return CapacityFit(float(capacity), float(worker), measured,
                       {k: 100.0 * (model[k] / measured[k] - 1) for k in MEASURED_SIZES})


def ps_speed(gpu: str, single: float, fit: CapacityFit, max_workers: int = 64) -> SpeedModel:
    """Steps/s of k servers of a type behind the study's PS, one of them making `single` steps/s."""
    worker = _worker_for(single, fit.capacity)
    if worker is None:
        raise PlanError(f"one {gpu} server at {single:g} steps/s is faster than the fitted parameter-server capacity "
                        f"({fit.capacity:.0f} updates/s); the capacity model cannot place it.")
    source = (f"{gpu.upper()} behind one parameter server (ps_capacity.py): capacity {fit.capacity:.0f} updates/s "
              f"fitted to the K80 on-demand runs (errors at k=1,2,4,8: "
              + ", ".join(f"{e:+.1f} %" for e in fit.errors_pct.values())
              + f"); one {gpu.upper()} computes {worker:.3f} steps/s without waiting, so that one server makes "
              f"{single:.4f}")
    return SpeedModel(gpu=gpu, steps_per_second=mva_throughput(worker, fit.capacity, max_workers), source=source)


@dataclass(frozen=True)
class Prediction:
    gpu: str
    workers: int
    steps_per_s: float
    hours: float  # 64K steps, training only
    linear_hours: float  # the same with no PS limit (k x one server)
    k80_shape_hours: float  # the planner's earlier rule: K80's scaling shape


def predictions(fit: CapacityFit | None = None, sizes=(2, 4, 8)) -> list[Prediction]:
    from transientvod.planner.study_tables import published_rows

    k80 = calibrate_k80()
    fit = fit or fit_capacity(k80)
    rows = []
    for gpu in ("p100", "v100"):
        single = FULL_JOB_STEPS / (published_rows()[f"1 {gpu.upper()} transient"].time_h * 3600.0)
        model = ps_speed(gpu, single, fit)
        for k in sizes:
            shape = k80.steps_per_second[k] / k80.steps_per_second[1]
            rows.append(Prediction(gpu, k, float(model.steps_per_second[k]),
                                   FULL_JOB_STEPS / model.steps_per_second[k] / 3600.0,
                                   FULL_JOB_STEPS / (k * single) / 3600.0, FULL_JOB_STEPS / (shape * single) / 3600.0))
    return rows


def markdown_table(rows: list[Prediction], fit: CapacityFit) -> str:
    lines = [f"Fitted capacity: {fit.capacity:.0f} updates/s; K80 errors at k = "
             + ", ".join(f"{k}: {e:+.1f} %" for k, e in fit.errors_pct.items()) + ".", "",
             "| cluster | steps/s | 64K steps, h | with no PS limit, h | with K80's shape, h |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row.workers} {row.gpu.upper()} | {row.steps_per_s:.2f} | {row.hours:.3f} | "
                     f"{row.linear_hours:.3f} | {row.k80_shape_hours:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    fitted = fit_capacity()
    print(markdown_table(predictions(fitted), fitted), end="")
