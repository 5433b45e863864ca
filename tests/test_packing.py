"""codecs/packing.py: side rows and payloads share one byte buffer per collective and come
back bit for bit, aligned, whatever the payload's width and length."""
from __future__ import annotations

import pytest
import torch

from transientvod.codecs.packing import pack, segment_bytes, unpack_rows, unpack_segments

PAYLOADS = [torch.float16, torch.bfloat16, torch.int8]


def random_payload(dtype: torch.dtype, n: int, generator: torch.Generator) -> torch.Tensor:
    if dtype == torch.int8:
        return torch.randint(-127, 128, (n,), dtype=torch.int8, generator=generator)
    return torch.randn(n, generator=generator).to(dtype)


@pytest.mark.parametrize("dtype", PAYLOADS)
def test_segments_of_different_sizes_come_back_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(1)
    elements, side_floats = [5, 0, 7, 512], [3, 1, 2, 1]  # odd lengths need padding
    parts = [(torch.randn(k, generator=generator), random_payload(dtype, n, generator))
             for k, n in zip(side_floats, elements)]
    buffer, sizes = pack(parts, torch.device("cpu"))
    assert buffer.dtype == torch.uint8
    assert all(size % 4 == 0 for size in sizes)
    assert sizes == [segment_bytes(k, n, parts[0][1].element_size()) for k, n in zip(side_floats, elements)]
    assert buffer.numel() == sum(sizes)
    sides, payload = unpack_segments(buffer, side_floats, dtype, elements)
    for (side, _), got in zip(parts, sides):
        assert torch.equal(got, side)
    assert torch.equal(payload.view(torch.uint8), torch.cat([p for _, p in parts]).view(torch.uint8))


@pytest.mark.parametrize("dtype", PAYLOADS)
def test_equal_rows_come_back_as_two_matrices(dtype):
    generator = torch.Generator().manual_seed(2)
    rows, floats, elements = 3, 2, 9
    parts = [(torch.randn(floats, generator=generator), random_payload(dtype, elements, generator))
             for _ in range(rows)]
    buffer, _ = pack(parts, torch.device("cpu"))
    side, payload = unpack_rows(buffer, rows, floats, dtype, elements)
    assert torch.equal(side, torch.stack([s for s, _ in parts]))
    assert torch.equal(payload.view(torch.uint8), torch.stack([p for _, p in parts]).view(torch.uint8))
    assert side.is_contiguous() and payload.is_contiguous()


def test_nan_and_negative_zero_side_values_keep_their_bits():
    side = torch.tensor([float("nan"), -0.0, float("inf")])
    buffer, _ = pack([(side, torch.zeros(1, dtype=torch.float16))], torch.device("cpu"))
    (got,), _ = unpack_segments(buffer, [3], torch.float16, [1])
    assert torch.equal(got.view(torch.int32), side.view(torch.int32))


def test_a_buffer_that_does_not_match_the_layout_is_refused():
    buffer, _ = pack([(torch.ones(1), torch.ones(4, dtype=torch.float16))], torch.device("cpu"))
    with pytest.raises(RuntimeError, match="received 12 bytes where the layout says 16"):
        unpack_segments(buffer, [1], torch.float16, [6])
