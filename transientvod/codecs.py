"""Gradient codecs with error feedback: none, fp16, bf16, int8 (one fp32 scale per block).

A codec owns the buffers one gradient bucket needs on the wire and turns a bucket into a
payload and back with the fused ops in `transientvod.ops` (one pass each way):

- compress: x = grad * weight + residual; payload = quantize(x); residual = x - dequantize(payload)
  (error feedback: what rounding dropped this step is sent with the next one);
- decompress: out = dequantize(summed payload) / n.

`none` and `fp16` are summable: Horovod's ring adds payloads as they are (op=Sum) and the 1/n
goes into the decompress. `bf16` is summable in principle, but Horovod 0.28.1 has no bfloat16
type, so its payloads travel by allgather and are summed in fp32 after. `int8` is not
summable (each rank has its own scales): shards go by alltoall, each rank dequantizes,
reduces and requantizes its shard, and the shards come back by allgather.
This module knows nothing of Horovod; `exchange.py` moves the payloads.
"""
from __future__ import annotations

import torch

from transientvod import ops
from transientvod.config import CODECS, INT8_BLOCK_MAX, INT8_BLOCK_MIN

PAYLOAD_DTYPES = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}


class Codec:
    """One bucket's codec: its error-feedback residual, and payload buffers made on request
    (the exchange keeps one per step in flight; the residual is shared by all of them)."""

    __slots__ = ("name", "numel", "block", "residual")

    def __init__(self, name: str, numel: int, device: torch.device, block: int = 512):
        if name not in CODECS:
            raise ValueError(f"codec {name!r} is unknown; it must be one of {', '.join(CODECS)}.")
        if name == "int8" and not INT8_BLOCK_MIN <= block <= INT8_BLOCK_MAX:
            raise ValueError(f"block is {block}; an int8 block holds {INT8_BLOCK_MIN} to {INT8_BLOCK_MAX} elements.")
        self.name = name
        self.numel = numel
        self.block = block
        self.residual = torch.zeros(numel, dtype=torch.float32, device=device) if name != "none" else None

    def new_payload(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = self.residual.device if self.residual is not None else None
        payload = torch.empty(self.numel, dtype=PAYLOAD_DTYPES[self.name], device=device)
        scales = (torch.empty(-(-self.numel // self.block), dtype=torch.float32, device=device)
                  if self.name == "int8" else None)
        return payload, scales

    def compress(self, grad: torch.Tensor, payload: torch.Tensor, scales: torch.Tensor | None,
                 weight: float = 1.0) -> bool:
        """Fill `payload` from a flat fp32 gradient; True if it held NaN or Inf."""
        if self.name == "none":
            payload.copy_(grad)
            if weight != 1.0:
                payload.mul_(weight)
            return not bool(torch.isfinite(payload).all())
        return ops.compress_ef_(grad, self.residual, payload, weight, scales=scales, block=self.block)

    def decompress_average(self, summed_payload: torch.Tensor, scales: torch.Tensor | None, out: torch.Tensor,
                           world_size: int) -> bool:
        """out = dequantize(summed_payload) / world_size; True if the result is not finite."""
        if self.name == "none":
            torch.mul(summed_payload, 1.0 / world_size, out=out)
            return not bool(torch.isfinite(out).all())
        return ops.decompress_avg_(summed_payload, out, 1.0 / world_size, scales=scales, block=self.block)

    def reset_residual(self) -> None:
        if self.residual is not None:
            self.residual.zero_()
