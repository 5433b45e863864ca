"""One byte buffer per collective: each destination's fp32 side row and its payload together.

A step of the scatter-reduce protocol used to start four collectives (the payload and its
side row of scales and flag, in each phase). On a shaped link each collective costs about
a round of latency whatever its size: the tiny side alltoall measured 100 ms of a 540 ms
step at 25 Mbit (Horovod timeline, 4 hosts). So each destination's part is one segment,

    [ side: fp32 scales..., flag | payload bytes | padding to 4 bytes ]

and one collective moves all of them. The side row comes first and every segment is a
multiple of 4 bytes long, so each side row lies on a 4-byte boundary and reads back as fp32.
"""
from __future__ import annotations

import torch

ALIGN = 4  # bytes: the side row is fp32


def segment_bytes(side_floats: int, payload_elements: int, payload_itemsize: int) -> int:
    payload = payload_elements * payload_itemsize
    return 4 * side_floats + -(-payload // ALIGN) * ALIGN


def pack(parts: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """One uint8 buffer of the (side fp32, payload) segments, end to end; their sizes."""
    sizes = [segment_bytes(side.numel(), payload.numel(), payload.element_size()) for side, payload in parts]
    buffer = torch.zeros(sum(sizes), dtype=torch.uint8, device=device)  # zeros: padding is defined
    at = 0
    for (side, payload), size in zip(parts, sizes):
        side_bytes = 4 * side.numel()
        buffer[at:at + side_bytes] = side.reshape(-1).view(torch.uint8)
        payload_bytes = payload.numel() * payload.element_size()
        buffer[at + side_bytes:at + side_bytes + payload_bytes] = payload.reshape(-1).view(torch.uint8)
        at += size
    return buffer, sizes


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


def unpack_segments(buffer: torch.Tensor, side_floats: list[int], payload_dtype: torch.dtype,
                    payload_elements: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Segments of different sizes end to end (the owners' phase: one from each owner): each one's
    side row (fp32), and all the payloads joined in order."""
    itemsize = payload_dtype.itemsize
    sides, payloads, at = [], [], 0
    for floats, elements in zip(side_floats, payload_elements):
        side_bytes, payload_bytes = 4 * floats, elements * itemsize
        sides.append(buffer[at:at + side_bytes].view(torch.float32))
        payloads.append(buffer[at + side_bytes:at + side_bytes + payload_bytes])
        at += segment_bytes(floats, elements, itemsize)
    if at != buffer.numel():
        raise RuntimeError(f"gradient exchange: received {buffer.numel()} bytes where the layout says {at}.")
    return sides, torch.cat(payloads).view(payload_dtype)
