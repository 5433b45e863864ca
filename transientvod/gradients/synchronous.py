"""The synchronous path (codec `none` at s = 0): Horovod's own DistributedOptimizer behind the
exchange's interface, waited on without Horovod's spinning synchronize."""
from __future__ import annotations

import time

import torch

from transientvod.gradients.horovod_wait import wait_for_distributed_optimizer


class SynchronousStep:
    """hvd.DistributedOptimizer behind the exchange's interface, so that the loop has one step
    path: zero_grad, backward, step(step), drain at the end, reset after an elastic reset."""

    __slots__ = ("optimizer", "waited_seconds")

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.waited_seconds = 0.0  # in step(), for the allreduces: the communication not hidden

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self, step: int) -> bool:
        # The gradients' allreduces started during backward; wait for them without Horovod's
        # spinning synchronize (horovod_wait.py), then step() finds them done.
        began = time.perf_counter()
        wait_for_distributed_optimizer(self.optimizer)
        self.waited_seconds += time.perf_counter() - began
        self.optimizer.step()
        return True

    def drain(self) -> int:
        return 0  # nothing in flight between steps

    def reset(self) -> None:
        pass  # nothing in flight between steps
