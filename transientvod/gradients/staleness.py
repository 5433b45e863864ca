"""Everything bounded staleness s changes besides the exchange's own pipeline: when a step
starts being applied late (the synchronous warm-up), the momentum it leaves the optimizer, the
learning rate's 1/(1+s) (`exchange.stale_lr`), and the buckets' default size. Task mode
(worker/schedule.py) and library mode (library/optimizer.py) both read it from here. The
exchange (exchange.py) delays each gradient by `StalenessRule.delay(step)` steps, and bucket
tuning (bucket_tuning.py) starts from `default_bucket_elements`.
"""
from __future__ import annotations

import torch


def stale_lr_scale(staleness: int, stale_lr: bool) -> float:
    """The factor on a task's learning rates under staleness s: 1/(1+s) when `stale_lr` is on,
    else 1 (off by default: docs/exchange.md says what it cost and bought)."""
    return 1.0 / (1 + staleness) if stale_lr else 1.0


# Unless exchange.bucket_elements says otherwise, the buckets start as the staleness says
# (`default_bucket_elements`), and the training loop then times the other cut too and keeps
# the faster (bucket_tuning.py). At s = 0 the gradient goes in BACKWARD_BUCKETS buckets, whose
# exchanges start while backward is still on the layers before them: on the testbed three were
# faster than one, and six no faster than three (docs/results.md, "Buckets"). A count, not a size, since every bucket costs the
# same CPU on every rank whatever its size (benchmarks/codec_cpu.py). A bucket holds at least
# BUCKET_ELEMENTS (512 KB of fp32), so that a small model's compresses (exchange.py's
# MIN_COMPRESS_ELEMENTS). While stale (s >= 1) a step's exchange has s more steps to finish
# in, so starting it during backward hides little, and each extra bucket's CPU is a loss: the
# gradient goes in one bucket (docs/results.md, "Buckets").
BACKWARD_BUCKETS = 3
BUCKET_ELEMENTS = 1 << 17


def default_bucket_elements(numel: int, staleness: int) -> int:
    """The bucket size for a gradient of `numel` elements (the note above BACKWARD_BUCKETS):
    at staleness 0, a BACKWARD_BUCKETS-th of it, at least BUCKET_ELEMENTS; stale, all of it.
    Steps of a synchronous warm-up before the staleness begins keep the stale size."""
    if staleness > 0:
        return max(1, numel)
    return max(BUCKET_ELEMENTS, -(-numel // BACKWARD_BUCKETS))



class StalenessRule:
    """What bounded staleness s does to the optimizer, as a function of the step.

    A gradient applied s steps after it was computed acts like extra momentum: the parameters
    keep moving along old gradients for s steps before any correction arrives ("asynchrony
    begets momentum", Mitliagkas et al. 2016, about s / (s + 1) of it). On top of SGD's own
    momentum 0.9 that makes deep networks diverge: ResNet-32 on the digits, 4 workers, s = 2,
    blew up within 20 steps with momentum 0.9 and trained with 0.9 - 2/3. So while stale the
    optimizer's momentum is lowered by s / (s + 1), to no less than 0 (`stale_momentum`).
    The first steps, while the learning rate ramps up and the gradients are largest, run
    synchronously (`stale_from_step`, the warm-up by default): delayed, they overshoot before
    any feedback arrives. Every rank computes the same values from the step alone, so a rank
    that joins later or a job that resumes agrees with the others.
    """

    __slots__ = ("staleness", "momentum", "stale_momentum", "stale_from_step")

    def __init__(self, staleness: int, momentum: float, stale_momentum: bool = True, stale_from_step: int = 0):
        self.staleness = staleness
        self.momentum = momentum
        self.stale_momentum = stale_momentum
        self.stale_from_step = stale_from_step

    def delay(self, step: int) -> int:
        """The staleness at `step`: 0 before `stale_from_step`, then s."""
        return self.staleness if step >= self.stale_from_step else 0

    def momentum_at(self, step: int) -> float:
        return self.momentum_for(self.momentum, step)

    def momentum_for(self, momentum: float, step: int) -> float:
        """An optimizer's momentum at `step`: SGD's or RMSprop's `momentum`, or the Adam family's
        beta1 (schedule.py). Lowering beta1 alike won back part of what a delay of 2 costs AdamW
        (benchmarks/RESULTS.md, "AdamW under staleness"), not all of it."""
        if not self.stale_momentum or self.delay(step) == 0:
            return momentum
        return max(0.0, momentum - self.staleness / (self.staleness + 1))


class StaleMomentum:
    """Each param group's momentum under staleness (elastic.StalenessRule): SGD's or RMSprop's
    `momentum`, or the Adam family's beta1, which is its momentum (beta2, the scale of its steps,
    is kept), lowered from the value the group had when this was made. Task mode (below) and
    library mode (library/optimizer.py) set the groups through it once a step."""

    __slots__ = ("rule", "bases")

    def __init__(self, optimizer: torch.optim.Optimizer, rule: StalenessRule):
        self.rule = rule
        self.bases = [("momentum", group["momentum"]) if "momentum" in group else
                      ("betas", tuple(group["betas"])) if "betas" in group else None
                      for group in optimizer.param_groups]

    def apply(self, param_groups: list[dict], step: int) -> float | None:
        """Set every group for `step`; returns the first group's momentum (None: it has none)."""
        for group, base in zip(param_groups, self.bases):
            if base is None:
                continue
            key, value = base
            if key == "momentum":
                group["momentum"] = self.rule.momentum_for(value, step)
            else:
                group["betas"] = (self.rule.momentum_for(value[0], step), *value[1:])
        first = param_groups[0]
        return first["momentum"] if "momentum" in first else first["betas"][0] if "betas" in first else None
