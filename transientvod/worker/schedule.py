"""The optimizer's hyperparameters at each step: the learning rate following the active
workers (LearningRateRule, below) and the momentum under staleness (gradients/staleness.py),
applied to whatever optimizer the task built, group by group: SGD's and RMSprop's `momentum`,
and the Adam family's beta1 (its momentum; beta2 is kept).

Each param group keeps the proportions the task gave it: the rule's rate is the first
group's, and every other group's is its own base rate times the same factor. So a task that
builds AdamW at 1e-3 with a second group at 1e-4 trains at those rates on one worker, and at
n times both (linear scaling) on n.
"""
from __future__ import annotations

import math

import torch

from transientvod.config import Config
from transientvod.gradients.staleness import StaleMomentum, StalenessRule, stale_lr_scale
from transientvod.tasks import TaskError


class LearningRateRule:
    """The learning rate as a function of step and the number of active workers.

    Linear scaling (Goyal et al. 2017): with n workers averaging gradients, the global batch is
    n times larger, so the rate is n times one worker's rate. A jump to a larger rate is ramped
    linearly over `warmup_steps` (at the start, and whenever the cluster grows); a shrinking
    cluster drops to the smaller rate at once. On top, an optional cosine decay to 0 at `total_steps`.
    The ramp's position lives in `TransientState` (`lr_ramp`), so a rank that joins later
    computes the same rate as everyone else after Horovod's sync.
    """

    __slots__ = ("base_lr", "scaling", "warmup_steps", "schedule", "total_steps")

    def __init__(self, base_lr: float, scaling: str, warmup_steps: int, schedule: str, total_steps: int):
        if base_lr <= 0:
            raise ValueError(f"base_lr is {base_lr}; a learning rate must be positive.")
        if scaling not in ("linear", "none"):
            raise ValueError(f"scaling is {scaling!r}; it must be 'linear' or 'none'.")
        if schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule is {schedule!r}; it must be 'cosine' or 'constant'.")
        self.base_lr = base_lr
        self.scaling = scaling
        self.warmup_steps = warmup_steps
        self.schedule = schedule
        self.total_steps = total_steps

    def target_factor(self, world_size: int) -> float:
        return float(world_size) if self.scaling == "linear" else 1.0

    def start_ramp(self, world_size: int, step: int) -> tuple[float, float, int]:
        """The ramp at job start: from one worker's rate to the scaled one."""
        return (1.0, self.target_factor(world_size), step)

    def resize_ramp(self, ramp: tuple[float, float, int], world_size: int, step: int) -> tuple[float, float, int]:
        """The ramp after the cluster changed size at `step`."""
        now = self.factor(ramp, step)
        target = self.target_factor(world_size)
        if target > now:
            return (now, target, step)
        return (target, target, step)

    def factor(self, ramp: tuple[float, float, int], step: int) -> float:
        start_factor, target, ramp_start = ramp
        if self.warmup_steps == 0 or step >= ramp_start + self.warmup_steps:
            return target
        progress = max(0, step - ramp_start) / self.warmup_steps
        return start_factor + (target - start_factor) * progress

    def lr(self, ramp: tuple[float, float, int], step: int) -> float:
        decay = 1.0
        if self.schedule == "cosine":
            decay = 0.5 * (1.0 + math.cos(math.pi * min(step, self.total_steps) / self.total_steps))
        return self.base_lr * self.factor(ramp, step) * decay


class OptimizerSchedule:
    """Sets every param group's `lr` and momentum (StaleMomentum) before each step."""

    __slots__ = ("optimizer", "lr_rule", "staleness_rule", "base_lrs", "momentum")

    def __init__(self, optimizer: torch.optim.Optimizer, config: Config, source: str):
        ex, o = config.exchange, config.optimizer
        # Read before any checkpoint is loaded: a checkpoint's groups hold the last rates set.
        scale = stale_lr_scale(ex.staleness, ex.stale_lr)
        self.base_lrs = [float(group["lr"]) * scale for group in optimizer.param_groups]
        if self.base_lrs[0] <= 0:
            raise TaskError(f"the optimizer of the task {source} has a learning rate of {self.base_lrs[0]}; "
                            "give it a positive one.")
        self.optimizer = optimizer
        self.lr_rule = LearningRateRule(self.base_lrs[0], o.lr_scaling, o.warmup_steps, o.schedule, config.train.steps)
        self.staleness_rule = StalenessRule(ex.staleness, o.momentum, ex.stale_momentum,
                                            o.warmup_steps if ex.sync_warmup else 0)
        self.momentum = StaleMomentum(optimizer, self.staleness_rule)

    def apply(self, lr: float, step: int) -> float | None:
        """Set the groups for `step`, the first group at `lr`; returns its momentum (None: it has none)."""
        factor = lr / self.base_lrs[0]
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * factor
        return self.momentum.apply(self.optimizer.param_groups, step)
