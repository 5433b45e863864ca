"""Gradient codecs: one object per wire protocol, each owning both halves of it.

    codec = make_codec("int8", numel, device, block=512)
    transfer = Transfer(codec.start(bucket.grad, wire, name, world, rank))  # encode, first phase
    ...                                                                      # transfer.advance()
    flag = transfer.finish(bucket.grad)           # the average, decoded; its flag, a tensor not yet read

- `none` (fp32.py): Horovod's fp32 allreduce, no error feedback.
- `fp16`, `bf16`, `int8` (scatter_reduce.py): compressed scatter-reduce with error feedback
  at the sender and at the shard's owner; bytes per element constant in N.

`start` is a generator (transfer.py): it runs the sender's encode at once, and each later
phase when the exchange finds the one before it done. `wire.py` is the only place that
starts Horovod ops. The names a codec accepts, and the int8 block range, live in
`transientvod.config` (CODECS, INT8_BLOCK_MIN/MAX).
"""
from __future__ import annotations

import torch

from transientvod.config import CODECS, INT8_BLOCK_MAX, INT8_BLOCK_MIN
from transientvod.gradients.codecs.fp32 import Fp32Allreduce
from transientvod.gradients.codecs.scatter_reduce import FORMATS, ScatterReduce, ShardLayout
from transientvod.gradients.codecs.transfer import Transfer
from transientvod.gradients.codecs.wire import Wire

__all__ = ["Fp32Allreduce", "ScatterReduce", "ShardLayout", "Transfer", "Wire", "check_codec", "make_codec",
           "payload_bytes"]


def check_codec(name: str, block: int) -> None:
    """The ValueError, naming the config key, of a codec or block the exchange cannot use."""
    if name not in CODECS:
        raise ValueError(f"exchange.codec is {name!r}; it must be one of {', '.join(CODECS)}.")
    scaled = name in FORMATS and FORMATS[name].scaled
    if scaled and (isinstance(block, bool) or not isinstance(block, int)
                   or not INT8_BLOCK_MIN <= block <= INT8_BLOCK_MAX):
        raise ValueError(f"exchange.block is {block!r}; the int8 kernels take blocks of "
                         f"{INT8_BLOCK_MIN} to {INT8_BLOCK_MAX} elements.")


def payload_bytes(name: str) -> int:
    """Bytes per gradient element in what a codec sends, scales, flags and headers aside: what
    the benchmark's wire-time bound multiplies (`none` moves fp32, the others their payload)."""
    check_codec(name, INT8_BLOCK_MIN)
    return (torch.float32 if name == "none" else FORMATS[name].payload).itemsize


def make_codec(name: str, numel: int, device: torch.device, block: int = 512):
    check_codec(name, block)
    if name == "none":
        return Fp32Allreduce(numel, device)
    return ScatterReduce(FORMATS[name], numel, device, block)
