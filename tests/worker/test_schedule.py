"""The optimizer's hyperparameters each step (transientvod/worker/schedule.py), for any torch optimizer:
every group's rate keeps its proportion to the first's, and the momentum under staleness is
SGD's `momentum` or the Adam family's beta1, lowered by s/(s+1) once the synchronous warm-up ends."""
from __future__ import annotations

import pytest
import torch

from transientvod.config import load_config
from transientvod.worker.schedule import OptimizerSchedule

STALE = ["exchange.staleness=2", "optimizer.warmup_steps=10", "optimizer.schedule=constant",
         "optimizer.lr_scaling=none"]


def two_groups(kind: str) -> torch.optim.Optimizer:
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    groups = [{"params": a.parameters()}, {"params": b.parameters(), "lr": 1e-4}]
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95))
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=1e-3, momentum=0.9)
    return torch.optim.Adagrad(groups, lr=1e-3)  # neither momentum nor betas


@pytest.mark.parametrize("kind", ["adamw", "sgd", "adagrad"])
def test_momentum_is_lowered_while_stale_and_each_group_keeps_its_rate(kind):
    optimizer = two_groups(kind)
    schedule = OptimizerSchedule(optimizer, load_config(None, STALE), "test")
    first, second = optimizer.param_groups
    warm = schedule.apply(2e-3, step=5)  # the synchronous warm-up: momentum as built
    assert (first["lr"], second["lr"]) == pytest.approx((2e-3, 2e-4))
    stale = schedule.apply(2e-3, step=10)
    if kind == "adagrad":
        assert warm is None and stale is None and "momentum" not in first and "betas" not in first
    elif kind == "sgd":
        assert warm == 0.9 and stale == pytest.approx(0.9 - 2 / 3) == second["momentum"]
    else:
        assert warm == 0.9 and stale == pytest.approx(0.9 - 2 / 3)
        assert first["betas"] == second["betas"] == pytest.approx((0.9 - 2 / 3, 0.95)), "beta2 is kept"
    schedule.apply(2e-3, step=5)  # a rollback into the warm-up gives the momentum back
    if kind != "adagrad":
        assert (first["momentum"] if kind == "sgd" else first["betas"][0]) == 0.9


def test_stale_momentum_off_and_stale_lr_on():
    optimizer = two_groups("adamw")
    config = load_config(None, STALE + ["exchange.stale_momentum=false", "exchange.stale_lr=true"])
    schedule = OptimizerSchedule(optimizer, config, "test")
    assert schedule.apply(schedule.lr_rule.lr((1.0, 1.0, 0), 20), step=20) == 0.9
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 / 3)
    assert optimizer.param_groups[1]["lr"] == pytest.approx(1e-4 / 3)
