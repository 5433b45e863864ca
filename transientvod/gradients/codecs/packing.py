"""One byte buffer per collective: each destination's fp32 side row and its payload together.

A step of the scatter-reduce protocol used to start four collectives (the payload and its
side row of scales and flag, in each phase). On a shaped link each collective costs about
a round of latency whatever its size: the tiny side alltoall measured 100 ms of a 540 ms
step at 25 Mbit (Horovod timeline, 4 hosts). So each destination's part is one segment,

    [ side: fp32 scales..., flag | payload bytes | padding to 4 bytes ]

and one collective moves all of them. The side row comes first and every segment is a
multiple of 4 bytes long, so each side row lies on a 4-byte boundary and reads back as fp32.

Segments of one shape lie end to end, so a run of them is a [count, segment bytes] matrix
and one strided copy fills (or empties) a column of it for the whole run. The owners' shards
come in at most three shapes (ShardLayout: the larger shards, the smaller, a short last int8
block), so packing takes a few ops whatever the number of ranks, where a copy per segment
took two ops per rank and bucket (benchmarks/packing.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN = 4  # bytes: the side row is fp32
FLAG_BYTES = 4  # the side row's last fp32: the non-finite flag


def segment_bytes(side_floats: int, payload_elements: int, payload_itemsize: int) -> int:
    payload = payload_elements * payload_itemsize
    return 4 * side_floats + -(-payload // ALIGN) * ALIGN


@dataclass(frozen=True)
class Run:
    """`count` consecutive segments of one shape, the first at byte `at` of the buffer and at
    `scale_at` / `element_at` of the scales and payloads they carry, end to end."""
    count: int
    scales: int  # fp32 scales in each side row, before the flag
    elements: int  # payload elements in each
    segment: int  # bytes of each, padding included
    at: int
    scale_at: int
    element_at: int

    def columns(self, itemsize: int) -> tuple[int, int, int]:
        """Byte offsets in each segment: the flag's (after the scales), the payload's, and the
        payload's end (padding follows)."""
        flag_at = 4 * self.scales
        payload_at = flag_at + FLAG_BYTES
        return flag_at, payload_at, payload_at + self.elements * itemsize


class SegmentLayout:
    """Segments end to end: segment r holds scales[r] fp32 scales and a flag, then elements[r]
    payload elements of `itemsize` bytes; grouped into runs of equal shape."""

    __slots__ = ("itemsize", "sizes", "total", "runs", "segments")

    def __init__(self, scales: list[int], elements: list[int], itemsize: int):
        self.itemsize = itemsize
        self.segments = len(scales)
        self.sizes = [segment_bytes(count + 1, n, itemsize) for count, n in zip(scales, elements)]
        self.total = sum(self.sizes)
        self.runs: list[Run] = []
        at = scale_at = element_at = 0
        for count, n, size in zip(scales, elements, self.sizes):
            last = self.runs[-1] if self.runs else None
            if last is not None and (last.scales, last.elements) == (count, n):
                self.runs[-1] = Run(last.count + 1, count, n, size, last.at, last.scale_at, last.element_at)
            else:
                self.runs.append(Run(1, count, n, size, at, scale_at, element_at))
            at, scale_at, element_at = at + size, scale_at + count, element_at + n

    def rows(self, buffer: torch.Tensor, run: Run) -> torch.Tensor:
        """The run's segments in `buffer` as a [count, segment bytes] uint8 view."""
        return buffer[run.at:run.at + run.count * run.segment].view(run.count, run.segment)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def _rows(flat: torch.Tensor, first: int, count: int, width: int) -> torch.Tensor:
    """`count` rows of `width` bytes from byte `first` of a flat byte tensor, as a view."""
    return flat[first:first + count * width].view(count, width)


def _fill(rows: torch.Tensor, run: Run, itemsize: int, scales: torch.Tensor, flag: torch.Tensor,
          payload: torch.Tensor) -> None:
    """One run's columns from byte matrices: scales [count or 1, 4 * run.scales], flag [1, 4],
    payload [count or 1, elements * itemsize]; a single row is repeated down the run."""
    flag_at, payload_at, payload_end = run.columns(itemsize)
    if run.scales:
        rows[:, :flag_at] = scales
    rows[:, flag_at:payload_at] = flag
    if run.elements:
        rows[:, payload_at:payload_end] = payload
    if payload_end < run.segment:
        rows[:, payload_end:] = 0  # padding is defined, so equal inputs give equal bytes


def pack_shards(layout: SegmentLayout, scales: torch.Tensor | None, flag: torch.Tensor, payload: torch.Tensor
                ) -> torch.Tensor:
    """One uint8 buffer whose segment r carries its own scales and payload elements (the next
    ones of `scales` and `payload`, in order) and the same fp32 `flag` [1]."""
    buffer = torch.empty(layout.total, dtype=torch.uint8, device=payload.device)
    scale_bytes, payload_bytes, flag_bytes = _bytes(scales if scales is not None else flag[:0]), _bytes(payload), \
        _bytes(flag).view(1, FLAG_BYTES)
    itemsize = layout.itemsize
    for run in layout.runs:
        flag_at, payload_at, payload_end = run.columns(itemsize)
        _fill(layout.rows(buffer, run), run, itemsize,
              _rows(scale_bytes, 4 * run.scale_at, run.count, flag_at), flag_bytes,
              _rows(payload_bytes, run.element_at * itemsize, run.count, payload_end - payload_at))
    return buffer


def pack_copies(layout: SegmentLayout, scales: torch.Tensor | None, flag: torch.Tensor, payload: torch.Tensor
                ) -> torch.Tensor:
    """One uint8 buffer whose segments all carry the same scales, fp32 `flag` [1] and payload
    (the owner's reduced shard, one copy for every rank)."""
    buffer = torch.empty(layout.total, dtype=torch.uint8, device=payload.device)
    scale_bytes = _bytes(scales if scales is not None else flag[:0]).view(1, -1)
    flag_bytes, payload_bytes = _bytes(flag).view(1, FLAG_BYTES), _bytes(payload).view(1, -1)
    for run in layout.runs:
        _fill(layout.rows(buffer, run), run, layout.itemsize, scale_bytes, flag_bytes, payload_bytes)
    return buffer


def unpack_rows(buffer: torch.Tensor, rows: int, side_floats: int, payload_dtype: torch.dtype,
                payload_elements: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` equal segments (an owner's alltoall: one from each rank): side [rows, k] fp32
    and payload [rows, elements], each a contiguous copy."""
    segments = buffer.view(rows, -1)
    side_bytes = 4 * side_floats
    payload_bytes = payload_elements * payload_dtype.itemsize
    side = segments[:, :side_bytes].contiguous().view(torch.float32)
    payload = segments[:, side_bytes:side_bytes + payload_bytes].contiguous().view(payload_dtype)
    return side, payload


def unpack_segments(buffer: torch.Tensor, layout: SegmentLayout, payload_dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Segments of the layout's shapes end to end (the owners' phase: one from each owner):
    every segment's scales joined in order (fp32), their flags (fp32, one per segment) and
    their payloads joined in order."""
    if buffer.numel() != layout.total:
        raise RuntimeError(f"gradient exchange: received {buffer.numel()} bytes where the layout says "
                           f"{layout.total}.")
    itemsize = layout.itemsize
    device = buffer.device
    scale_count = sum(run.count * run.scales for run in layout.runs)
    element_count = sum(run.count * run.elements for run in layout.runs)
    scales = torch.empty(scale_count, dtype=torch.float32, device=device)
    flags = torch.empty(layout.segments, dtype=torch.float32, device=device)
    payload = torch.empty(element_count, dtype=payload_dtype, device=device)
    scale_bytes, flag_bytes, payload_bytes = _bytes(scales), _bytes(flags), _bytes(payload)
    segment = 0
    for run in layout.runs:
        rows = layout.rows(buffer, run)
        flag_at, payload_at, payload_end = run.columns(itemsize)
        if run.scales:
            _rows(scale_bytes, 4 * run.scale_at, run.count, flag_at).copy_(rows[:, :flag_at])
        _rows(flag_bytes, FLAG_BYTES * segment, run.count, FLAG_BYTES).copy_(rows[:, flag_at:payload_at])
        if run.elements:
            _rows(payload_bytes, run.element_at * itemsize, run.count, payload_end - payload_at) \
                .copy_(rows[:, payload_at:payload_end])
        segment += run.count
    return scales, flags, payload
