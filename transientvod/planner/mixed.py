"""How fast a cluster of servers with different speeds trains, for every set of them still up.

    speeds = [4.55, 4.55, 11.85, 11.85]          # steps/s of one server alone: k80, k80, p100, p100
    rates = rate_by_set(speeds, shape, "sum")    # the study's asynchronous PS
    rates = rate_by_set(speeds, shape, "slowest")  # synchronous training (and bounded staleness)
    rates[0b0101]                                # steps/s with slots 0 and 2 up

`shape[k]` is how k servers of one type scale against one (K80's measured curve, one PS:
k = 2 gives 1.96, k = 4 gives 3.93), so a cluster of one type gets exactly its calibrated speed.
- "sum" (the study's asynchronous parameter server): every worker pushes its own gradients at
  its own pace, so the steps/s add up: sum of speeds x shape[k] / k (the PS's efficiency at k).
- "slowest" (synchronous data parallelism): every step waits for the slowest worker, so k
  workers make shape[k] x the slowest one's speed.
Bounded staleness s (this project's exchange) is "slowest" too for servers whose speeds
differ steadily: a step still needs every rank's gradients, a fast rank may run at most s
steps ahead, and once it is s ahead it waits for the slow one at every step. Staleness
helps when speeds fluctuate step to step (then the rate tracks the mean step time rather than
the worst); `staleness_rate` plays that protocol on given step times, and the measured
fluctuation gain enters the planner as `staleness_speedup` (1.32 here at s=2 with a straggler).
Never imports torch or horovod.
"""
from __future__ import annotations

import numpy as np

from transientvod.planner.study_data import PlanError

RULES = ("sum", "slowest")


def rate_by_set(speeds, shape, rule: str) -> np.ndarray:
    """Steps/s for every set of up slots, indexed by its bit mask (slot w = bit w)."""
    speeds = np.asarray(speeds, dtype=np.float64)
    slots = speeds.size
    if rule not in RULES:
        raise PlanError(f"combination rule {rule!r} is not one of {', '.join(RULES)}.")
    if slots > 20:
        raise PlanError(f"a mixed cluster of {slots} servers is too large to tabulate (20 at most).")
    masks = np.arange(2 ** slots)
    members = (masks[:, None] >> np.arange(slots)) & 1 == 1  # [sets, slots]
    k = members.sum(axis=1)
    scale = np.asarray(shape, dtype=np.float64)[k]
    if rule == "sum":
        total = (members * speeds).sum(axis=1)
        rates = np.where(k > 0, total * scale / np.maximum(k, 1), 0.0)
    else:
        slowest = np.where(members, speeds, np.inf).min(axis=1)
        rates = np.where(k > 0, scale * np.where(np.isfinite(slowest), slowest, 0.0), 0.0)
    return rates


def staleness_rate(step_seconds, staleness: int) -> float:
    """Global steps/s of ranks with bounded staleness: rank w's step i takes step_seconds[w, i];
    it may start once it finished step i - 1 and every rank finished step i - 1 - staleness
    (staleness 0: synchronous). The job holds step i when every rank finished it."""
    times = np.asarray(step_seconds, dtype=np.float64)
    if times.ndim != 2 or times.shape[1] == 0 or not (np.all(np.isfinite(times)) and np.all(times > 0)):
        raise PlanError("step_seconds must be positive seconds, one row per rank and one column per step.")
    if not isinstance(staleness, int) or staleness < 0:
        raise PlanError(f"staleness is {staleness!r}; give a whole number of steps, 0 or more.")
    ranks, steps = times.shape
    finished = np.zeros((ranks, steps))
    for i in range(steps):
        own = finished[:, i - 1] if i > 0 else np.zeros(ranks)
        gate = finished[:, i - 1 - staleness].max() if i - 1 - staleness >= 0 else 0.0
        finished[:, i] = np.maximum(own, gate) + times[:, i]
    return steps / finished[:, -1].max()
