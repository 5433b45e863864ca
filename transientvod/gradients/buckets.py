"""The exchange's unit of work: a bucket (a run of parameters whose gradients are views into one
flat fp32 buffer, with a codec per wire protocol), and one step's buckets in flight."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from transientvod.gradients.codecs import Transfer, make_codec


class Bucket:
    """A run of parameters whose gradients live in one flat fp32 buffer."""

    __slots__ = ("index", "params", "grad", "codecs")

    def __init__(self, index: int, params: list[torch.nn.Parameter]):
        self.index = index
        self.params = params
        numel = sum(p.numel() for p in params)
        self.grad = torch.zeros(numel, dtype=torch.float32, device=params[0].device)
        self.codecs: dict[str, object] = {}
        self.bind_grads()

    def bind_grads(self) -> None:
        """Make every parameter's .grad a view into the flat buffer again if something replaced
        it (Horovod's broadcast_optimizer_state gives a fresh optimizer new zero .grad tensors)."""
        offset = 0
        for p in self.params:
            view = self.grad[offset:offset + p.numel()]
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view.view_as(p)
            offset += p.numel()

    def codec(self, name: str, block: int):
        if name not in self.codecs:
            self.codecs[name] = make_codec(name, self.grad.numel(), self.grad.device, block)
        return self.codecs[name]


@dataclass
class InFlight:
    """One step's buckets on the wire, stamped with the ring they were started in; a bucket
    that backward has not started yet is None."""
    step: int
    world: int
    transfers: list[Transfer | None]
