"""How the scatter-reduce protocol lays a bucket's shards into its two alltoalls, per format.

The protocol (scatter_reduce.py) needs four things of a framing: the buffer and splits that
send each owner its shard (`to_owners`), what an owner received (`at_owner`), the buffer that
sends the owner's reduced shard to every rank (`to_everyone`), and the whole bucket from the
owners' answers (`from_owners`). The flags handed in are the ops' own (int32, set where a
pass met a value that is not finite); what is received comes back as a `Received`: the
payload, its int8 scales, and the max of the non-finite flags that came with it (fp32), where
any did.

- `Bare` (fp16, bf16): the payload alone. A value that is not finite travels as itself (the
  encoders write Inf or NaN where x was not finite or overflowed), and every pass that reads
  it says so: the owner's pass (`reduce_compress_ef_`) makes a non-finite sum, so a
  non-finite re-encoded payload, and every rank's decode (`decompress_avg_`) sets its flag. So no flag
  needs to travel: the payload's own bytes go to the owners, an owner reads its N copies
  where they arrived, and the owners' shards arrive end to end as the whole bucket. Only the
  owner's copies for every rank are copied (one op).
- `Framed` (int8): a side row of fp32 scales and a flag before each payload segment
  (packing.py), since an int8 code cannot hold a NaN (it is sent as 0) and the scales must
  travel with their blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from transientvod.gradients.codecs.packing import SegmentLayout, pack_copies, pack_shards, unpack_rows, unpack_segments


@dataclass(frozen=True)
class Received:
    payload: torch.Tensor  # [N, shard] at an owner; the whole bucket from the owners
    scales: torch.Tensor | None  # int8: [N, shard's blocks] at an owner; all of them from the owners
    flag: torch.Tensor | None  # fp32 [1], the max of the flags that came with it; None where none did


def _refuse(received: int, expected: int) -> None:
    if received != expected:
        raise RuntimeError(f"gradient exchange: received {received} bytes where the layout says {expected}.")


class Bare:
    """fp16 / bf16: the payload's own bytes on the wire, shard r to rank r."""

    __slots__ = ("dtype", "world", "shard_bytes", "mine")

    def __init__(self, dtype: torch.dtype, elements: list[int], rank: int):
        self.dtype = dtype
        self.world = len(elements)
        self.shard_bytes = [n * dtype.itemsize for n in elements]
        self.mine = elements[rank]

    def to_owners(self, payload: torch.Tensor, scales: None, bad: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        return payload.view(torch.uint8), self.shard_bytes

    def at_owner(self, incoming: torch.Tensor) -> Received:
        _refuse(incoming.numel(), self.world * self.mine * self.dtype.itemsize)
        return Received(incoming.view(self.dtype).view(self.world, self.mine), None, None)

    def to_everyone(self, reduced: torch.Tensor, scales: None, bad: torch.Tensor, senders: Received
                    ) -> tuple[torch.Tensor, list[int]]:
        return reduced.view(torch.uint8).repeat(self.world), [reduced.numel() * self.dtype.itemsize] * self.world

    def from_owners(self, buffer: torch.Tensor) -> Received:
        _refuse(buffer.numel(), sum(self.shard_bytes))
        return Received(buffer.view(self.dtype), None, None)


class Framed:
    """int8: each segment a side row (fp32 scales, then the flag) and the payload (packing.py)."""

    __slots__ = ("dtype", "world", "mine", "my_scales", "shards", "copies")

    def __init__(self, dtype: torch.dtype, elements: list[int], scales: list[int], rank: int):
        self.dtype = dtype
        self.world = len(elements)
        self.mine, self.my_scales = elements[rank], scales[rank]
        # Segment r holds owner r's shard: to it in the first alltoall, from it in the second.
        self.shards = SegmentLayout(scales, elements, dtype.itemsize)
        self.copies = SegmentLayout([self.my_scales] * self.world, [self.mine] * self.world, dtype.itemsize)

    def to_owners(self, payload: torch.Tensor, scales: torch.Tensor, bad: torch.Tensor
                  ) -> tuple[torch.Tensor, list[int]]:
        return pack_shards(self.shards, scales, bad.float(), payload), self.shards.sizes

    def at_owner(self, incoming: torch.Tensor) -> Received:
        _refuse(incoming.numel(), self.copies.total)
        side, shards = unpack_rows(incoming, self.world, self.my_scales + 1, self.dtype, self.mine)
        return Received(shards, side[:, :self.my_scales].contiguous(), side[:, self.my_scales].max().reshape(1))

    def to_everyone(self, reduced: torch.Tensor, scales: torch.Tensor, bad: torch.Tensor, senders: Received
                    ) -> tuple[torch.Tensor, list[int]]:
        # What this owner sends on: its own flag or any sender's.
        flag = torch.maximum(bad.float(), senders.flag)
        return pack_copies(self.copies, scales, flag, reduced), self.copies.sizes

    def from_owners(self, buffer: torch.Tensor) -> Received:
        scales, flags, payload = unpack_segments(buffer, self.shards, self.dtype)
        return Received(payload, scales, flags.max().reshape(1))
