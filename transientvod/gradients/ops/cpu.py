"""The fused ops on CPU: each public function here has the signature of its
`transientvod.gradients.ops` namesake, expects arguments `transientvod.gradients.ops` has
already checked, and runs one numba kernel of cpu_kernels.py on the tensors' memory (fp16 and
bf16 as their uint16 bit patterns: numba has no float16 on CPU).
"""
from __future__ import annotations

import numpy as np
import torch

from transientvod.gradients.ops.cpu_kernels import (_compress_16bit, _compress_int8, _decompress_16bit,
                                                    _decompress_fp32, _decompress_int8, _reduce_ef_16bit,
                                                    _reduce_ef_int8, _sum_16bit, _sum_int8)


def _array(t: torch.Tensor) -> np.ndarray:
    """The tensor's memory as a numpy array (no copy); fp16 / bf16 as their uint16 bit patterns."""
    t = t.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.uint16)
    return t.numpy()


def compress_ef_(grad: torch.Tensor, residual: torch.Tensor, payload: torch.Tensor, weight: float,
                 scales: torch.Tensor | None = None, block: int = 512) -> bool:
    """See `transientvod.gradients.ops.compress_ef_`."""
    g, r, p, w = _array(grad), _array(residual), _array(payload), np.float32(weight)
    if payload.dtype == torch.int8:
        return _compress_int8(g, r, p, _array(scales), w, block) > 0
    return _compress_16bit(g, r, p, w, payload.dtype == torch.bfloat16) > 0


def decompress_avg_(payload: torch.Tensor, out: torch.Tensor, inv_n: float,
                    scales: torch.Tensor | None = None, block: int = 512) -> bool:
    """See `transientvod.gradients.ops.decompress_avg_`."""
    p, o, inv = _array(payload), _array(out), np.float32(inv_n)
    if payload.dtype == torch.int8:
        return _decompress_int8(p, _array(scales), o, inv, block) > 0
    if payload.dtype == torch.float32:
        return _decompress_fp32(p, o, inv) > 0
    return _decompress_16bit(p, o, inv, payload.dtype == torch.bfloat16) > 0


def decompress_sum_(payloads: torch.Tensor, out: torch.Tensor, inv_n: float,
                    scales: torch.Tensor | None = None, block: int = 512) -> bool:
    """See `transientvod.gradients.ops.decompress_sum_`."""
    p, o, inv = _array(payloads), _array(out), np.float32(inv_n)
    if payloads.dtype == torch.int8:
        return _sum_int8(p, _array(scales), o, inv, block) > 0
    return _sum_16bit(p, o, inv, payloads.dtype == torch.bfloat16) > 0


def reduce_compress_ef_(payloads: torch.Tensor, residual: torch.Tensor, out_payload: torch.Tensor, weight: float,
                        in_scales: torch.Tensor | None = None, out_scales: torch.Tensor | None = None,
                        block: int = 512) -> bool:
    """See `transientvod.gradients.ops.reduce_compress_ef_`."""
    p, r, o, w = _array(payloads), _array(residual), _array(out_payload), np.float32(weight)
    if payloads.dtype == torch.int8:
        return _reduce_ef_int8(p, _array(in_scales), r, o, _array(out_scales), w, block) > 0
    return _reduce_ef_16bit(p, r, o, w, payloads.dtype == torch.bfloat16) > 0
