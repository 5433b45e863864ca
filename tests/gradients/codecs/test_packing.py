"""codecs/packing.py: side rows and payloads share one byte buffer per collective and come
back bit for bit, aligned, whatever the payload's width and length; a few copies pack any
number of ranks' segments."""
from __future__ import annotations

import pytest
import torch

from transientvod.gradients.codecs import ShardLayout
from transientvod.gradients.codecs.packing import (SegmentLayout, pack_copies, pack_shards, segment_bytes, unpack_rows,
                                         unpack_segments)

PAYLOADS = [torch.float16, torch.bfloat16, torch.int8]


def random_payload(dtype: torch.dtype, n: int, generator: torch.Generator) -> torch.Tensor:
    if dtype == torch.int8:
        return torch.randint(-127, 128, (n,), dtype=torch.int8, generator=generator)
    return torch.randn(n, generator=generator).to(dtype)


def segment_by_segment(scales: list[torch.Tensor], flag: torch.Tensor, payloads: list[torch.Tensor]) -> torch.Tensor:
    """The wire format written out one segment at a time, the plain way: the oracle."""
    parts = []
    for own_scales, payload in zip(scales, payloads):
        side = torch.cat((own_scales, flag)).view(torch.uint8)
        body = payload.view(torch.uint8)
        padding = torch.zeros(-body.numel() % 4, dtype=torch.uint8)
        parts += [side, body, padding]
    return torch.cat(parts)


@pytest.mark.parametrize("dtype", PAYLOADS)
def test_shards_of_different_shapes_come_back_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(1)
    scale_counts, elements = [3, 3, 0, 2, 2, 2], [5, 5, 0, 7, 7, 512]  # odd lengths need padding
    scales = [torch.randn(k, generator=generator) for k in scale_counts]
    payloads = [random_payload(dtype, n, generator) for n in elements]
    flag = torch.tensor([1.0])
    layout = SegmentLayout(scale_counts, elements, payloads[0].element_size())
    buffer = pack_shards(layout, torch.cat(scales), flag, torch.cat(payloads))
    assert torch.equal(buffer, segment_by_segment(scales, flag, payloads))
    assert layout.sizes == [segment_bytes(k + 1, n, payloads[0].element_size()) for k, n in zip(scale_counts, elements)]
    assert all(size % 4 == 0 for size in layout.sizes) and buffer.numel() == sum(layout.sizes)
    got_scales, got_flags, got_payload = unpack_segments(buffer, layout, dtype)
    assert torch.equal(got_scales, torch.cat(scales))
    assert torch.equal(got_flags, flag.expand(len(elements)))
    assert torch.equal(got_payload.view(torch.uint8), torch.cat(payloads).view(torch.uint8))


@pytest.mark.parametrize("dtype", PAYLOADS)
def test_an_owners_copies_come_back_as_two_matrices(dtype):
    generator = torch.Generator().manual_seed(2)
    rows, scale_count, elements = 3, 1, 9
    scales, payload = torch.randn(scale_count, generator=generator), random_payload(dtype, elements, generator)
    flag = torch.tensor([0.0])
    layout = SegmentLayout([scale_count] * rows, [elements] * rows, payload.element_size())
    buffer = pack_copies(layout, scales, flag, payload)
    assert torch.equal(buffer, segment_by_segment([scales] * rows, flag, [payload] * rows))
    side, got = unpack_rows(buffer, rows, scale_count + 1, dtype, elements)
    assert torch.equal(side, torch.cat((scales, flag)).expand(rows, -1))
    assert torch.equal(got.view(torch.uint8), payload.view(torch.uint8).expand(rows, -1))
    assert side.is_contiguous() and got.is_contiguous()


@pytest.mark.parametrize("world", [2, 3, 4, 7, 64, 300])
@pytest.mark.parametrize("scaled", [False, True])
def test_the_owners_shards_pack_in_at_most_three_runs_whatever_the_world(world, scaled):
    """One run per shape, a few copies each: packing does not grow with the number of ranks."""
    numel, block = 131_073, 512  # a short last int8 block
    shards = ShardLayout.of(numel, world, block, scaled)
    layout = SegmentLayout(shards.scales, shards.elements, 1 if scaled else 2)
    assert len(layout.runs) <= 3
    assert sum(run.count for run in layout.runs) == world
    assert sum(run.count * run.elements for run in layout.runs) == numel


def test_nan_and_negative_zero_side_values_keep_their_bits():
    scales, flag = torch.tensor([float("nan"), -0.0]), torch.tensor([float("inf")])
    layout = SegmentLayout([2], [1], 2)
    buffer = pack_shards(layout, scales, flag, torch.zeros(1, dtype=torch.float16))
    got_scales, got_flags, _ = unpack_segments(buffer, layout, torch.float16)
    assert torch.equal(got_scales.view(torch.int32), scales.view(torch.int32))
    assert torch.equal(got_flags.view(torch.int32), flag.view(torch.int32))


def test_a_buffer_that_does_not_match_the_layout_is_refused():
    buffer = pack_shards(SegmentLayout([0], [4], 2), None, torch.ones(1), torch.ones(4, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="received 12 bytes where the layout says 16"):
        unpack_segments(buffer, SegmentLayout([0], [6], 2), torch.float16)
