"""The optimizer's hyperparameters at each step: the learning rate following the active
workers (elastic.LearningRateRule) and the momentum under staleness (elastic.StalenessRule),
applied to whatever optimizer the task built, group by group.

Each param group keeps the proportions the task gave it: the rule's rate is the first
group's, and every other group's is its own base rate times the same factor. So a task that
builds AdamW at 1e-3 with a second group at 1e-4 trains at those rates on one worker, and at
n times both (linear scaling) on n.
"""
from __future__ import annotations

import torch

from transientvod.config import Config
from transientvod.elastic import LearningRateRule, StalenessRule
from transientvod.tasks import TaskError


class OptimizerSchedule:
    """Sets every param group's `lr` (and `momentum`, where it has one) before each step."""

    __slots__ = ("optimizer", "lr_rule", "staleness_rule", "base_lrs", "base_momentums")

    def __init__(self, optimizer: torch.optim.Optimizer, config: Config, source: str):
        ex, o = config.exchange, config.optimizer
        # Read before any checkpoint is loaded: a checkpoint's groups hold the last rates set.
        scale = 1.0 / (1 + ex.staleness) if ex.stale_lr else 1.0
        self.base_lrs = [float(group["lr"]) * scale for group in optimizer.param_groups]
        if self.base_lrs[0] <= 0:
            raise TaskError(f"the optimizer of the task {source} has a learning rate of {self.base_lrs[0]}; "
                            "give it a positive one.")
        self.base_momentums = [group.get("momentum") for group in optimizer.param_groups]
        self.optimizer = optimizer
        self.lr_rule = LearningRateRule(self.base_lrs[0], o.lr_scaling, o.warmup_steps, o.schedule, config.train.steps)
        self.staleness_rule = StalenessRule(ex.staleness, o.momentum, ex.stale_momentum,
                                            o.warmup_steps if ex.sync_warmup else 0)

    def apply(self, lr: float, step: int) -> float | None:
        """Set the groups for `step`, the first group at `lr`; returns its momentum (None: it has none)."""
        factor = lr / self.base_lrs[0]
        for group, base_lr, base_momentum in zip(self.optimizer.param_groups, self.base_lrs, self.base_momentums):
            group["lr"] = base_lr * factor
            if base_momentum is not None:
                group["momentum"] = self.staleness_rule.momentum_for(base_momentum, step)
        return self.optimizer.param_groups[0].get("momentum")
