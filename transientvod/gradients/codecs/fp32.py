"""`none`: the bucket in fp32, summed by Horovod's allreduce, averaged as Horovod does.

Horovod's own `op=Average` multiplies the fp32 sum by 1 / N rounded to fp32
(`ScaleBuffer` casts its double factor for fp32 buffers); the decode does the same, so that
staleness 0 gives the parameters of `hvd.DistributedOptimizer` bit for bit at any N (a
product in double, rounded once, differs at N = 3). No flag travels: every rank decodes the same sum, so a NaN or Inf in any
rank's gradient is non-finite in every rank's average.
"""
from __future__ import annotations

import torch

from transientvod.gradients.codecs.transfer import Protocol
from transientvod.gradients.codecs.wire import Wire


class Fp32Allreduce:
    __slots__ = ("numel", "device")

    name = "none"

    def __init__(self, numel: int, device: torch.device):
        self.numel = numel
        self.device = device

    def start(self, grad: torch.Tensor, wire: Wire, name: str, world: int, rank: int) -> Protocol:
        summed = grad.clone()  # its own buffer: the bucket's is refilled by the next backward
        results = yield [wire.allreduce_sum_(summed, name + ".sum")]
        del results  # in place: the sum is in `summed`

        def decode(out: torch.Tensor) -> torch.Tensor:
            torch.mul(summed, 1.0 / world, out=out)  # the scalar is rounded to fp32 first
            return torch.isfinite(out).all().logical_not()  # the flag, read by the exchange
        return decode

    def reset_residual(self) -> None:
        pass  # nothing is carried from step to step

    def carried_residual(self, world: int, rank: int) -> None:
        return None  # nothing to carry into new buckets either
