"""fp16, bf16 and int8: compressed scatter-reduce, error feedback at both ends (1-bit Adam, Bagua).

The bucket is cut into N contiguous shards, shard r owned by rank r (whole int8 blocks, so
an owner's scales are its own). One step of one bucket, on every rank:

1. encode: payload = encode(grad + residual) in one fused pass (`ops.compress_ef_`), the
   residual keeping what rounding dropped; then alltoall: shard r of the payload to rank r.
   int8 sends its scales and this rank's non-finite flag with it (the "side" row, fp32), in
   one byte buffer (`packing.py`: one collective per phase, not two, since on a slow link
   each costs a round of latency); fp16 and bf16 send the payload alone, whose Inf and NaN
   say for themselves what a flag would (`framing.py`);
2. own: the owner decodes the N copies of its shard it received, sums them in fp32 (so
   nothing is added in fp16 or bf16 and nothing overflows there) and re-encodes the average
   with *its own* residual, all in one fused pass (`ops.reduce_compress_ef_`: the bits of
   `decompress_sum_` then `compress_ef_`, without the fp32 sum in memory): what the second
   rounding drops is sent at the next step, not lost (without it, int8 delivered 4 % of a
   small steady gradient: tests/gradients/test_exchange.py). An int8 owner's flag is the max of those it
   received and its own; alltoall again: the owner's shard (with its scales and flag, int8),
   one copy to every rank. Not an allgather,
   which moves the same bytes: Gloo's allgather is a ring of N - 1 rounds, each waiting for
   the round before it on every link, where its alltoall sends to every peer at once. At
   25mbit/400ms on 4 testbed hosts that made fp16 at s = 0 1.47, 1.50, 1.41 steps/s against
   1.38, 1.30, 1.27, and int8 at s = 2 3.28, 3.25 against 3.04, 3.05 (benchmarks/RESULTS.md);
3. decode: everyone decodes the whole bucket (the shards arrive in rank order, end to end),
   and skips the step if its decode met a value that is not finite or any owner's flag is
   set: every rank decodes the same bytes, so all ranks skip together.

Each rank sends (N - 1) / N of the bucket in each of the two collectives: 2 (N - 1) / N · b bytes per
element for a b-byte payload (int8: plus its scales, N flags and at most 3 bytes of padding
per segment), whatever N is. Payloads travel as bytes (Horovod 0.28.1 has no bfloat16 type
anyway): nothing on the wire does arithmetic on them (the owner sums in fp32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from transientvod.gradients import ops
from transientvod.gradients.codecs.framing import Bare, Framed
from transientvod.gradients.codecs.transfer import Protocol
from transientvod.gradients.codecs.wire import Wire


@dataclass(frozen=True)
class Format:
    name: str
    payload: torch.dtype  # what the ops write; Horovod moves its bytes (codecs/packing.py)
    scaled: bool  # int8: one fp32 scale per block of elements


FORMATS = {
    "fp16": Format("fp16", torch.float16, scaled=False),
    "bf16": Format("bf16", torch.bfloat16, scaled=False),
    "int8": Format("int8", torch.int8, scaled=True),
}


@dataclass(frozen=True)
class ShardLayout:
    """Where each owner's shard lies: elements[r] from start[r]; scales[r] of them (int8)."""
    elements: list[int]
    start: list[int]
    scales: list[int]

    @classmethod
    def of(cls, numel: int, world: int, block: int, scaled: bool) -> "ShardLayout":
        unit = block if scaled else 1  # int8 shards hold whole blocks; the last may be short
        units = -(-numel // unit)
        base, extra = divmod(units, world)
        counts = [base + (1 if r < extra else 0) for r in range(world)]
        elements, start, at = [], [], 0
        for count in counts:
            end = min(numel, at + count * unit)
            start.append(at)
            elements.append(end - at)
            at = end
        return cls(elements, start, counts if scaled else [0] * world)


def _no_nonfinite_yet(device: torch.device) -> torch.Tensor:
    """A zeroed flag for the ops' flag=: they OR 1 into it on the device when they see NaN/Inf."""
    return torch.zeros(1, dtype=torch.int32, device=device)


class ScatterReduce:
    """One bucket's codec: the sender's residual (whole bucket) and the owner's (its shard)."""

    __slots__ = ("format", "numel", "device", "block", "residual", "owner_residual", "_layouts", "_framings")

    def __init__(self, fmt: Format, numel: int, device: torch.device, block: int):
        self.format = fmt
        self.numel = numel
        self.device = device
        self.block = block
        self.residual = torch.zeros(numel, dtype=torch.float32, device=device)
        self.owner_residual = torch.zeros(0, dtype=torch.float32, device=device)  # sized by the ring
        self._layouts: dict[int, ShardLayout] = {}
        self._framings: dict[tuple[int, int], Bare | Framed] = {}

    @property
    def name(self) -> str:
        return self.format.name

    def layout(self, world: int) -> ShardLayout:
        if world not in self._layouts:
            self._layouts[world] = ShardLayout.of(self.numel, world, self.block, self.format.scaled)
        return self._layouts[world]

    def framing(self, world: int, rank: int) -> Bare | Framed:
        """How the two alltoalls carry this rank's shards (framing.py): int8's scales and flag
        need a side row; fp16's and bf16's Inf and NaN travel as themselves."""
        if (world, rank) not in self._framings:
            layout, dtype = self.layout(world), self.format.payload
            self._framings[(world, rank)] = (Framed(dtype, layout.elements, layout.scales, rank) if self.format.scaled
                                             else Bare(dtype, layout.elements, rank))
        return self._framings[(world, rank)]

    def reset_residual(self) -> None:
        self.residual.zero_()
        self.owner_residual.zero_()

    def carried_residual(self, world: int, rank: int) -> torch.Tensor:
        """What this rank still owes the ring for this bucket, as one sender's residual, for
        buckets cut afresh (GradientExchange.rebucket): its own residual plus its owner's,
        times `world`, since the owner's is on the average's scale and the ring averages what
        senders send."""
        carried = self.residual.clone()
        layout = self.layout(world)
        start, mine = layout.start[rank], layout.elements[rank]
        if mine and self.owner_residual.numel() == mine:  # else none yet in this ring (a reset zeroed it)
            carried[start:start + mine].add_(self.owner_residual, alpha=world)
        return carried

    def load_residual(self, residual: torch.Tensor) -> None:
        """Take a carried residual (above) as this bucket's; the owner's starts from zero."""
        self.residual.copy_(residual)
        self.owner_residual = torch.zeros(0, dtype=torch.float32, device=self.device)

    def start(self, grad: torch.Tensor, wire: Wire, name: str, world: int, rank: int) -> Protocol:
        fmt, block, device = self.format, self.block, self.device
        layout, framing = self.layout(world), self.framing(world, rank)

        # -- phase 1: encode with the sender's residual; each shard to its owner ---------------
        # The non-finite flags stay on the device (ops' flag=) until the exchange reads a step's
        # once: on a GPU each read waits for the stream, which would hold the next step's launches back.
        payload = torch.empty(self.numel, dtype=fmt.payload, device=device)
        scales = torch.empty(sum(layout.scales), dtype=torch.float32, device=device) if fmt.scaled else None
        bad = _no_nonfinite_yet(device)
        if self.numel > 0:
            ops.compress_ef_(grad, self.residual, payload, 1.0, scales=scales, block=block, flag=bad)
        outgoing, splits = framing.to_owners(payload, scales, bad)
        (incoming, _), = yield [wire.alltoall(outgoing, splits, name + ".shards")]

        # -- phase 2: the owner sums in fp32 and re-encodes with its own residual ---------------
        senders = framing.at_owner(incoming)
        mine, my_scales = layout.elements[rank], layout.scales[rank]
        reduced = torch.empty(mine, dtype=fmt.payload, device=device)
        reduced_scales = torch.empty(my_scales, dtype=torch.float32, device=device) if fmt.scaled else None
        owner_bad = _no_nonfinite_yet(device)
        if mine:
            # One pass: the N copies decoded and added in fp32, in rank order, so every owner adds
            # alike, then re-encoded; a non-finite sum makes the re-encoded payload non-finite.
            ops.reduce_compress_ef_(senders.payload, self._owner_residual(mine), reduced, 1.0 / world,
                                    in_scales=senders.scales, out_scales=reduced_scales, block=block,
                                    flag=owner_bad)
        outgoing, splits = framing.to_everyone(reduced, reduced_scales, owner_bad, senders)
        (from_owners, _), = yield [wire.alltoall(outgoing, splits, name + ".owners")]

        # -- phase 3 (when the optimizer wants it): decode the whole bucket ----------------------
        owners = framing.from_owners(from_owners)

        def decode(out: torch.Tensor) -> torch.Tensor:
            bad = _no_nonfinite_yet(device)
            if self.numel > 0:
                ops.decompress_avg_(owners.payload, out, 1.0, scales=owners.scales, block=block, flag=bad)
            flag = bad.float()  # read by the exchange, once a step
            return flag if owners.flag is None else torch.maximum(flag, owners.flag)
        return decode

    def _owner_residual(self, mine: int) -> torch.Tensor:
        # Sized to this rank's shard in this ring; a reset (new ring) zeroes it anyway.
        if self.owner_residual.numel() != mine:
            self.owner_residual = torch.zeros(mine, dtype=torch.float32, device=self.device)
        return self.owner_residual
