"""The Horovod side of every codec: async collectives, and the bytes this rank hands them.

A codec's protocol calls `Wire` instead of `horovod.torch` directly, so that the bytes each
rank sends per step are counted where they leave: from the tensors and splits given to
Horovod (what Gloo then moves; the testbed's link counters are the wire-level check). Each
method starts the op and returns its handle; nothing here waits.
"""
from __future__ import annotations

import torch

import horovod.torch as hvd


class Wire:
    """Starts Horovod's async ops and counts the bytes this rank sends to other ranks."""

    __slots__ = ("sent_bytes",)

    def __init__(self):
        self.sent_bytes = 0

    def allreduce_sum_(self, tensor: torch.Tensor, name: str):
        # Horovod's ring allreduce sends 2 (N - 1) / N of the tensor from every rank.
        world = hvd.size()
        self.sent_bytes += 2 * (world - 1) * _nbytes(tensor) // world
        return hvd.allreduce_async_(tensor, op=hvd.Sum, name=name)

    def alltoall(self, tensor: torch.Tensor, splits: list[int], name: str):
        """Rows splits[r] (along dim 0) go to rank r; this rank's own rows stay here."""
        row_bytes = _nbytes(tensor) // max(1, tensor.shape[0])
        self.sent_bytes += row_bytes * (sum(splits) - splits[hvd.rank()])
        # Splits are metadata Horovod reads on the host: an int32 CPU tensor whatever the device.
        return hvd.alltoall_async(tensor, splits=torch.tensor(splits, dtype=torch.int32), name=name)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
