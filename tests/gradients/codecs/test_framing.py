"""codecs/framing.py: what each framing sends through the protocol's two alltoalls comes back
bit for bit, routed as Horovod's alltoall routes it, for every owner of N = 2, 3, 4 and 7;
fp16 and bf16 send the payload's own bytes, and their Inf and NaN arrive as themselves."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from transientvod.gradients.codecs import ShardLayout
from transientvod.gradients.codecs.framing import Bare, Framed, Received

BLOCK = 512
NUMEL = 3 * BLOCK + 77  # shards differ in size, and int8's last block is short
FORMATS = {"fp16": (torch.float16, False), "bf16": (torch.bfloat16, False), "int8": (torch.int8, True)}


def framings(name: str, world: int) -> tuple[ShardLayout, list]:
    dtype, scaled = FORMATS[name]
    layout = ShardLayout.of(NUMEL, world, BLOCK, scaled)
    made = [Framed(dtype, layout.elements, layout.scales, rank) if scaled else Bare(dtype, layout.elements, rank)
            for rank in range(world)]
    return layout, made


def alltoall(sent: list[tuple[torch.Tensor, list[int]]]) -> list[torch.Tensor]:
    """Horovod's alltoall on one machine: rank r receives split r of every rank's buffer, in rank order."""
    pieces = [torch.split(buffer, splits) for buffer, splits in sent]
    return [torch.cat([pieces[sender][r] for sender in range(len(sent))]) for r in range(len(sent))]


def random_payload(dtype: torch.dtype, n: int, generator: torch.Generator) -> torch.Tensor:
    if dtype == torch.int8:
        return torch.randint(-127, 128, (n,), dtype=torch.int8, generator=generator)
    return torch.randn(n, generator=generator).to(dtype)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


@pytest.mark.parametrize("world", [2, 3, 4, 7])
@pytest.mark.parametrize("name", FORMATS)
def test_shards_reach_their_owners_and_the_owners_shards_reach_everyone(name, world):
    dtype, scaled = FORMATS[name]
    layout, made = framings(name, world)
    generator = torch.Generator().manual_seed(world)
    payloads = [random_payload(dtype, NUMEL, generator) for _ in range(world)]
    scales = [torch.rand(sum(layout.scales), generator=generator) if scaled else None for _ in range(world)]
    flags = [torch.tensor([int(rank == 1)], dtype=torch.int32) for rank in range(world)]  # rank 1 saw a NaN

    received = alltoall([made[rank].to_owners(payloads[rank], scales[rank], flags[rank]) for rank in range(world)])
    senders = [made[owner].at_owner(received[owner]) for owner in range(world)]
    for owner in range(world):
        start, mine = layout.start[owner], layout.elements[owner]
        expected = torch.stack([payload[start:start + mine] for payload in payloads])
        assert torch.equal(bits(senders[owner].payload), bits(expected))
        if scaled:
            first = sum(layout.scales[:owner])
            assert torch.equal(senders[owner].scales,
                               torch.stack([s[first:first + layout.scales[owner]] for s in scales]))
            assert senders[owner].flag.tolist() == [1.0]  # the max of the senders' flags
        else:
            assert senders[owner].scales is None and senders[owner].flag is None

    reduced = [random_payload(dtype, layout.elements[owner], generator) for owner in range(world)]
    reduced_scales = [torch.rand(layout.scales[owner], generator=generator) if scaled else None
                      for owner in range(world)]

    def answer(owner_flags: list[int], received: list[Received]) -> list[Received]:
        bad = [torch.tensor([flag], dtype=torch.int32) for flag in owner_flags]
        answered = alltoall([made[owner].to_everyone(reduced[owner], reduced_scales[owner], bad[owner], received[owner])
                             for owner in range(world)])
        return [made[rank].from_owners(answered[rank]) for rank in range(world)]

    quiet = [replace(got, flag=torch.zeros(1)) if scaled else got for got in senders]  # no sender flagged
    last_owner_flagged = [int(owner == world - 1) for owner in range(world)]
    for owners_flags, received, expected_flag in (([0] * world, senders, 1.0),  # a sender's flag carried on
                                                  (last_owner_flagged, quiet, 1.0),  # an owner's own flag
                                                  ([0] * world, quiet, 0.0)):
        for owners in answer(owners_flags, received):
            assert torch.equal(bits(owners.payload), bits(torch.cat(reduced)))
            if scaled:
                assert torch.equal(owners.scales, torch.cat(reduced_scales))
                assert owners.flag.tolist() == [expected_flag]
            else:
                assert owners.scales is None and owners.flag is None


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_16_bit_payloads_travel_as_their_own_bytes_inf_and_nan_included(name):
    dtype, _ = FORMATS[name]
    world = 3
    layout, made = framings(name, world)
    payload = torch.randn(NUMEL).to(dtype)
    payload[5], payload[NUMEL - 1] = float("nan"), float("-inf")
    outgoing, splits = made[0].to_owners(payload, None, torch.zeros(1, dtype=torch.int32))
    assert outgoing.data_ptr() == payload.data_ptr()  # no copy: the encoder's output is the buffer
    assert splits == [n * dtype.itemsize for n in layout.elements]
    owners = made[0].from_owners(outgoing)
    assert owners.payload.data_ptr() == outgoing.data_ptr()  # decoded where it arrived
    assert torch.equal(bits(owners.payload), bits(payload))


@pytest.mark.parametrize("name", FORMATS)
def test_a_buffer_of_the_wrong_size_is_refused_in_one_sentence(name):
    layout, made = framings(name, 3)
    with pytest.raises(RuntimeError, match=r"^gradient exchange: received \d+ bytes where the layout says \d+\.$"):
        made[0].from_owners(torch.zeros(10, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"^gradient exchange: received \d+ bytes where the layout says \d+\.$"):
        made[0].at_owner(torch.zeros(10, dtype=torch.uint8))
