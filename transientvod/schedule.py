"""The optimizer's hyperparameters at each step: the learning rate following the active
workers (elastic.LearningRateRule) and the momentum under staleness (elastic.StalenessRule),
applied to whatever optimizer the task built, group by group: SGD's and RMSprop's `momentum`,
and the Adam family's beta1 (its momentum; beta2 is kept).

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


class OptimizerSchedule:
    """Sets every param group's `lr` and momentum (StaleMomentum) before each step."""

    __slots__ = ("optimizer", "lr_rule", "staleness_rule", "base_lrs", "momentum")

    def __init__(self, optimizer: torch.optim.Optimizer, config: Config, source: str):
        ex, o = config.exchange, config.optimizer
        # Read before any checkpoint is loaded: a checkpoint's groups hold the last rates set.
        scale = 1.0 / (1 + ex.staleness) if ex.stale_lr else 1.0
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
