"""How fast a cluster trains with k active workers, fitted to the study's K80 measurements.

    model = calibrate_k80()                  # steps/s for k = 0..64 K80 workers, one PS
    model.time_for(64000, 4)                 # seconds for 64K steps on 4 workers
    print(model.source)                      # where every number came from
    v100 = scaled(model, "v100", 12.0)       # your own 1-V100 speed, K80's scaling shape
    p100 = study_speed("p100")               # the study's single-P100 time, behind the PS's capacity

The study measured training speed for every cluster size only on K80 servers (ResNet-32 on
CIFAR-10, batch 128, asynchronous training with one parameter server); P100 and V100 it
timed only as single servers (its published table: 1.50 h and 1.23 h for 64K steps), so
their clusters come from the parameter server's capacity that the K80 runs fix
(ps_capacity.py); a speed you give (--speed) borrows K80's shape.
Never imports torch or horovod.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from transientvod.planner.study_data import PlanError, gpu_type, ondemand_runs, ps_curve

FULL_JOB_STEPS = 64000  # every on-demand run trained ResNet-32 for 64K steps
MEASURED_SIZES = (1, 2, 4, 8)  # on-demand runs exist for these cluster sizes
CURVE_ONLY_SIZES = (3, 5, 6, 7)  # only a 1-PS accuracy curve exists for these


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no single truth value
class SpeedModel:
    """Global training steps per second with k active workers, k = 0..max_workers.

    `steps_per_second[k]` is the throughput of k workers (index 0 is 0.0: nobody trains);
    `source` says, one line per group of k, how each number was obtained.
    """

    gpu: str
    steps_per_second: np.ndarray
    source: str

    def __post_init__(self):
        speeds = np.array(self.steps_per_second, dtype=np.float64)
        if speeds.ndim != 1 or speeds.size < 2 or speeds[0] != 0.0:
            raise PlanError("steps_per_second must list k = 0..max_workers with 0.0 at k = 0 and at least k = 1.")
        if not (np.all(np.isfinite(speeds[1:])) and np.all(speeds[1:] > 0)):
            raise PlanError("steps_per_second must be positive and finite for k = 1 and more workers.")
        speeds.setflags(write=False)
        object.__setattr__(self, "steps_per_second", speeds)

    @property
    def max_workers(self) -> int:
        return self.steps_per_second.size - 1

    def throughput(self, k):
        """Steps per second with `k` active workers (an int, or an array of them)."""
        k = np.asarray(k)
        if k.dtype.kind not in "iu":
            if not (k.dtype.kind == "f" and np.all(np.isfinite(k)) and np.all(k == np.round(k))):
                raise PlanError(f"the number of workers {k.tolist()!r} must be whole numbers.")
            k = k.astype(np.int64)
        if np.any(k < 0) or np.any(k > self.max_workers):
            raise PlanError(f"this speed model covers 0 to {self.max_workers} workers, not {k.tolist()!r}; "
                            "calibrate it with a larger max_workers.")
        speed = self.steps_per_second[k]
        return float(speed) if speed.ndim == 0 else speed

    def time_for(self, steps, k):
        """Seconds `k` active workers need for `steps` steps: inf with no workers, 0 for no steps."""
        steps = np.asarray(steps, dtype=np.float64)
        speed = np.asarray(self.throughput(k))
        with np.errstate(divide="ignore", invalid="ignore"):
            seconds = np.where(steps == 0, 0.0, steps / speed)
        return float(seconds) if seconds.ndim == 0 else seconds


def calibrate_k80(max_workers: int = 64) -> SpeedModel:
    """K80 steps/s for k = 0..max_workers from the study's files (see `source` of the result).

    - k = 1, 2, 4, 8: 64K steps / the mean duration of the on-demand runs of that size. These
      are whole jobs timed from start to end, the planner's unit of work.
    - k = 3, 5, 6, 7: only a 1-PS accuracy curve (one run) was measured. A curve also spans
      64K steps, but its clock runs from the first to the last evaluation and leaves out the
      job's start-up and shutdown, so it reads 1.5-3.4 % faster than the whole runs. Its
      speed is therefore multiplied by the ratio (on-demand speed / curve speed), taken at
      the measured sizes either side and interpolated linearly in k.
    - k > 8: a power law a * k**b, least squares in log-log over k = 1..8. An extrapolation:
      one parameter server must saturate at some size the study did not reach.
    """
    if isinstance(max_workers, bool) or not isinstance(max_workers, (int, np.integer)) or max_workers < 1:
        raise PlanError(f"max_workers is {max_workers!r}; give a whole number of workers, 1 or more.")
    measured = {}
    lines = [f"K80 steps/s, ResNet-32 on CIFAR-10, batch 128, one parameter server, k = 1..{max_workers}:"]
    for k in MEASURED_SIZES:
        runs = ondemand_runs(k)
        measured[k] = FULL_JOB_STEPS / runs.mean_duration_s
        lines.append(f"  k={k}: {measured[k]:.4f} = {FULL_JOB_STEPS} steps / mean duration {runs.mean_duration_s:.1f} s "
                     f"of {runs.durations_s.size} on-demand runs")

    curve_speed = {k: ps_curve(k).steps_per_second for k in sorted(MEASURED_SIZES + CURVE_ONLY_SIZES)}
    ratios = [measured[k] / curve_speed[k] for k in MEASURED_SIZES]
    lines.append("  on-demand / curve speed at k=1,2,4,8: " + ", ".join(f"{r:.4f}" for r in ratios)
                 + " (curves time evaluations only, not start-up)")
    for k in CURVE_ONLY_SIZES:
        ratio = float(np.interp(k, MEASURED_SIZES, ratios))
        low = max(m for m in MEASURED_SIZES if m < k)
        high = min(m for m in MEASURED_SIZES if m > k)
        measured[k] = curve_speed[k] * ratio
        lines.append(f"  k={k}: {measured[k]:.4f} = 1-PS curve {curve_speed[k]:.4f} x ratio {ratio:.4f} "
                     f"(interpolated between k={low} and k={high})")

    ks = np.arange(1, 9)
    fitted_on = np.array([measured[k] for k in ks])
    b, log_a = np.polyfit(np.log(ks), np.log(fitted_on), 1)
    a = math.exp(log_a)
    max_error = float(np.max(np.abs(a * ks ** b / fitted_on - 1)))
    lines.append(f"  k>8: power law {a:.4f} * k**{b:.4f}, least squares in log-log over k=1..8 "
                 f"(max relative error on 1..8: {100 * max_error:.2f} %); an extrapolation: the one "
                 "parameter server will saturate at some size the study did not measure")

    speeds = np.zeros(max_workers + 1)
    for k in range(1, max_workers + 1):
        speeds[k] = measured[k] if k in measured else a * k ** b
    steps_up = np.diff(speeds)
    if np.any(steps_up <= 0):
        k = int(np.argmax(steps_up <= 0)) + 1
        raise PlanError(f"the calibrated K80 speed does not grow from {k} to {k + 1} workers; check the study's "
                        "on-demand and curve files in transientvod/spot/traces/gce-2019.")
    lines.append("  checked: steps/s grows with every added worker")
    return SpeedModel(gpu="k80", steps_per_second=speeds, source="\n".join(lines))


def scaled(model: SpeedModel, gpu: str, single_worker_steps_per_second: float) -> SpeedModel:
    """`model`'s speeds for another GPU type: every k multiplied by the same factor, so that
    one worker trains at `single_worker_steps_per_second`.

    The study timed training only on K80s, so this assumes the other type scales with k the
    way K80s did. Faster GPUs load the one parameter server harder, so the true curve
    probably bends sooner: read the result as optimistic for large k.
    """
    from transientvod.planner.rentals import server_type

    gpu = server_type(gpu)
    speed = single_worker_steps_per_second
    if isinstance(speed, bool) or not isinstance(speed, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(speed) and speed > 0):
        raise PlanError(f"single_worker_steps_per_second is {speed!r}; give the measured speed of one {gpu} worker, "
                        "a positive number of steps per second.")
    factor = float(speed) / float(model.steps_per_second[1])
    source = (f"{gpu.upper()} steps/s = the {model.gpu.upper()} model below x {factor:.4f}, so that 1 worker makes "
              f"{float(speed):.4f} steps/s. Assumption: {gpu.upper()} scales with k like {model.gpu.upper()} "
              "(the study measured training speed only on K80s); likely optimistic for large k.\n" + model.source)
    return SpeedModel(gpu=gpu, steps_per_second=model.steps_per_second * factor, source=source)


def study_speed(gpu: str, k80: SpeedModel | None = None) -> SpeedModel:
    """The study's speed of a GPU type: K80 calibrated for every size (calibrate_k80); P100 and
    V100 from the single-server time of the study's published table (64K steps over
    "1 P100 transient" 1.50 h and "1 V100 transient" 1.23 h, training time), and for more
    servers the parameter-server capacity model fitted to the K80 runs (ps_capacity.py)."""
    from transientvod.planner.study_tables import published_rows  # only P100/V100 need the README

    gpu = gpu_type(gpu)
    k80 = k80 if k80 is not None else calibrate_k80()
    if gpu == "k80":
        return k80
    row = published_rows().get(f"1 {gpu.upper()} transient")
    if row is None or row.time_h is None:
        raise PlanError(f"the study's data README has no time for '1 {gpu.upper()} transient'; pass "
                        f"--speed {gpu}=STEPS_PER_S.")
    speed = FULL_JOB_STEPS / (row.time_h * 3600.0)
    # More servers: behind the study's one parameter server, whose capacity the K80 runs fix
    # (ps_capacity.py); faster workers reach it sooner than K80's shape would say.
    from transientvod.planner.ps_capacity import fit_capacity, ps_speed

    model = ps_speed(gpu, speed, fit_capacity(k80), k80.max_workers)
    source = (f"{gpu.upper()}: 1 server = {FULL_JOB_STEPS} steps / {row.time_h} h (the study's published single-"
              f"{gpu.upper()} time) = {speed:.4f} steps/s\n" + model.source)
    return SpeedModel(gpu=gpu, steps_per_second=model.steps_per_second, source=source)
