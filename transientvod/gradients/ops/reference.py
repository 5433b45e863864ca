"""The fused gradient-compression ops in plain PyTorch: the oracle every backend is tested against.

Each `reference_*` function computes exactly the float32 operations the kernels do, in the
same order, as separate PyTorch ops, so a correct kernel matches it bit for bit (payload,
residual, q, scales, out); the tests compare with no tolerance. What makes that possible:

- `weight` and `inv_n` are rounded to float32 first; every product and sum is one float32
  operation rounded to nearest-even, never a fused multiply-add (a CUDA kernel must use
  `__fmul_rn` / `__fadd_rn`, or nvcc contracts `g * w + r` into an FMA);
- fp16 / bf16 rounding is `Tensor.to`, which rounds to nearest-even with subnormals and
  overflow to inf; any NaN stays a NaN (its bits may differ between backends, nothing else may);
- int8 divides by the block's scale (a true division, never a multiply by the reciprocal:
  PyTorch on CUDA turns a division by a Python scalar into one, so the divisors here are tensors)
  and rounds half to even (`torch.round`).

The functions also hold the ops' contract: the `check_*` functions raise the one-sentence
`ValueError` every backend gives for a bad call; `transientvod.gradients.ops` calls them before dispatch.
Unlike the kernels, these functions allocate temporaries.
"""
from __future__ import annotations

import numpy as np
import torch

from transientvod.config import INT8_BLOCK_MAX, INT8_BLOCK_MIN

PAYLOAD_DTYPES = (torch.float16, torch.bfloat16, torch.int8)
# decompress_avg_ also takes a float32 payload: a sum already in float32, to average.
SUMMED_DTYPES = PAYLOAD_DTYPES + (torch.float32,)
INT8_MAX = 127.0


# ---------------------------------------------------------------------------------------------
# The contract: argument checks shared by every backend.


def nblocks(n: int, block: int) -> int:
    """How many int8 scales a bucket of n elements has: ceil(n / block)."""
    return -(-n // block)


def as_float32(name: str, value) -> float:
    """A Python number as the float32 value the kernels use (a Python float that float32 holds)."""
    try:
        return float(np.float32(float(value)))
    except (TypeError, ValueError):
        raise ValueError(f"{name} is {value!r}; it must be a real number.") from None


def _tensor(name: str, t, dtypes: tuple, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} is a {type(t).__name__}; it must be a torch.Tensor.")
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{name} is {t.dtype}; it must be {allowed}.")
    if t.dim() != dim:
        shape = "a flat 1-D bucket" if dim == 1 else "a 2-D [ranks, elements] tensor"
        raise ValueError(f"{name} has shape {tuple(t.shape)}; it must be {shape}.")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; the ops take contiguous buckets (call .contiguous()).")


def _same_device(named: dict) -> None:
    devices = {name: t.device for name, t in named.items() if t is not None}
    first_name, first = next(iter(devices.items()))
    for name, device in devices.items():
        if device != first:
            raise ValueError(f"{name} is on {device} but {first_name} is on {first}; "
                             f"all tensors of one call must be on one device.")


def _same_numel(name: str, t: torch.Tensor, other: str, n: int) -> None:
    if t.numel() != n:
        raise ValueError(f"{name} has {t.numel()} elements but {other} has {n}; they must match.")


def _block(block) -> None:
    if isinstance(block, bool) or not isinstance(block, int) or not INT8_BLOCK_MIN <= block <= INT8_BLOCK_MAX:
        raise ValueError(f"block is {block!r}; an int8 block holds {INT8_BLOCK_MIN} to {INT8_BLOCK_MAX} elements.")


def _scales(name: str, scales, payload_dtype: torch.dtype, n: int, block, dim: int = 1, ranks: int = 1) -> None:
    if payload_dtype != torch.int8:
        if scales is not None:
            raise ValueError(f"{name} is given but the payload is {payload_dtype}; "
                             f"scales belong to int8 payloads only.")
        return
    _block(block)
    nb = nblocks(n, block)
    if scales is None:
        raise ValueError(f"an int8 payload needs {name}: a float32 tensor of ceil(n / block) = {nb} elements.")
    _tensor(name, scales, (torch.float32,), dim)
    want = (nb,) if dim == 1 else (ranks, nb)
    if tuple(scales.shape) != want:
        raise ValueError(f"{name} has shape {tuple(scales.shape)}; {n} elements in blocks of {block} "
                         f"need shape {want}.")


def _flag(flag) -> None:
    # flag= (transientvod.gradients.ops): one int32 the ops OR into, on the tensors' device (_same_device).
    if flag is None:
        return
    _tensor("flag", flag, (torch.int32,), 1)
    if flag.numel() != 1:
        raise ValueError(f"flag has {flag.numel()} elements; it must be one int32, zeroed by the caller.")


def check_compress_ef(grad, residual, payload, weight, scales, block, flag=None) -> None:
    """Raises the ValueError of a bad compress_ef_ call."""
    _tensor("grad", grad, (torch.float32,), 1)
    _tensor("residual", residual, (torch.float32,), 1)
    _tensor("payload", payload, PAYLOAD_DTYPES, 1)
    _flag(flag)
    _same_device({"grad": grad, "residual": residual, "payload": payload, "scales": scales, "flag": flag})
    n = grad.numel()
    _same_numel("residual", residual, "grad", n)
    _same_numel("payload", payload, "grad", n)
    _scales("scales", scales, payload.dtype, n, block)
    as_float32("weight", weight)


def check_decompress_avg(payload, out, inv_n, scales, block, flag=None) -> None:
    """Raises the ValueError of a bad decompress_avg_ call."""
    _tensor("payload", payload, SUMMED_DTYPES, 1)
    _tensor("out", out, (torch.float32,), 1)
    _flag(flag)
    _same_device({"payload": payload, "out": out, "scales": scales, "flag": flag})
    _same_numel("out", out, "payload", payload.numel())
    _scales("scales", scales, payload.dtype, payload.numel(), block)
    as_float32("inv_n", inv_n)


def check_decompress_sum(payloads, out, inv_n, scales, block, flag=None) -> None:
    """Raises the ValueError of a bad decompress_sum_ call."""
    _tensor("payloads", payloads, PAYLOAD_DTYPES, 2)
    if payloads.shape[0] < 1:
        raise ValueError(f"payloads has shape {tuple(payloads.shape)}; it must hold at least one rank's copy.")
    _tensor("out", out, (torch.float32,), 1)
    _flag(flag)
    _same_device({"payloads": payloads, "out": out, "scales": scales, "flag": flag})
    k, m = payloads.shape
    _same_numel("out", out, "each row of payloads", m)
    _scales("scales", scales, payloads.dtype, m, block, dim=2, ranks=k)
    as_float32("inv_n", inv_n)


def check_reduce_compress_ef(payloads, residual, out_payload, weight, in_scales, out_scales, block,
                             flag=None) -> None:
    """Raises the ValueError of a bad reduce_compress_ef_ call."""
    _tensor("payloads", payloads, PAYLOAD_DTYPES, 2)
    if payloads.shape[0] < 1:
        raise ValueError(f"payloads has shape {tuple(payloads.shape)}; it must hold at least one rank's copy.")
    _tensor("residual", residual, (torch.float32,), 1)
    _tensor("out_payload", out_payload, PAYLOAD_DTYPES, 1)
    if out_payload.dtype != payloads.dtype:
        raise ValueError(f"out_payload is {out_payload.dtype} but payloads is {payloads.dtype}; "
                         f"the owner re-encodes in the format it received.")
    _flag(flag)
    _same_device({"payloads": payloads, "residual": residual, "out_payload": out_payload,
                  "in_scales": in_scales, "out_scales": out_scales, "flag": flag})
    k, m = payloads.shape
    _same_numel("residual", residual, "each row of payloads", m)
    _same_numel("out_payload", out_payload, "each row of payloads", m)
    _scales("in_scales", in_scales, payloads.dtype, m, block, dim=2, ranks=k)
    _scales("out_scales", out_scales, payloads.dtype, m, block)
    as_float32("weight", weight)


# ---------------------------------------------------------------------------------------------
# The math.


def _per_element(scales: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """Each element's block scale: scales repeated block times, cut to n."""
    return scales.repeat_interleave(block)[:n]


def _quantize_int8(x: torch.Tensor, block: int):
    """The int8 rule. Returns (xs, q, scale_per_element, scales, finite): xs is x with its
    non-finite elements set to 0 (they count as 0 in the block max and quantize to 0)."""
    n = x.numel()
    finite = torch.isfinite(x)
    xs = torch.where(finite, x, torch.zeros_like(x))
    padded = x.new_zeros(nblocks(n, block) * block)
    padded[:n] = xs
    amax = padded.view(-1, block).abs().amax(dim=1)
    scales = amax / torch.full_like(amax, INT8_MAX)  # exactly 0 for an all-zero block
    per = _per_element(scales, n, block)
    nonzero = per != 0
    q = torch.round(xs / torch.where(nonzero, per, torch.ones_like(per)))  # half to even
    q = torch.where(nonzero, q.clamp(-INT8_MAX, INT8_MAX), torch.zeros_like(q))
    return xs, q, per, scales, finite


def reference_compress_ef_(grad: torch.Tensor, residual: torch.Tensor, payload: torch.Tensor, weight: float,
                           scales: torch.Tensor | None = None, block: int = 512) -> bool:
    """x = grad * weight + residual; payload = quantize(x); residual = x - dequantize(payload).

    Returns True if any element of the payload is not finite: x was NaN/Inf, or (fp16, bf16)
    a finite x overflowed to inf. The residual is 0 at those elements: what cannot be
    represented is dropped, not carried into the next step.
    """
    check_compress_ef(grad, residual, payload, weight, scales, block)
    w = as_float32("weight", weight)
    x = grad * w + residual  # two float32 roundings, never an FMA
    if payload.dtype == torch.int8:
        xs, q, per, new_scales, finite = _quantize_int8(x, block)
        payload.copy_(q)
        scales.copy_(new_scales)
        residual.copy_(xs - q * per)
        return not bool(finite.all())
    payload.copy_(x)  # round to nearest-even: subnormals, overflow to inf, NaN stays NaN
    back = payload.float()
    finite = torch.isfinite(back)
    residual.copy_(torch.where(finite, x - back, torch.zeros_like(x)))
    return not bool(finite.all())


def reference_decompress_avg_(payload: torch.Tensor, out: torch.Tensor, inv_n: float,
                              scales: torch.Tensor | None = None, block: int = 512) -> bool:
    """out = float32(payload) * inv_n (int8: q * scale * inv_n, in that order).

    Returns True if any element of out is not finite (a summed fp16 payload that overflowed).
    """
    check_decompress_avg(payload, out, inv_n, scales, block)
    inv = as_float32("inv_n", inv_n)
    values = payload.float()
    if payload.dtype == torch.int8:
        values = values * _per_element(scales, payload.numel(), block)
    torch.mul(values, inv, out=out)
    return not bool(torch.isfinite(out).all())


def reference_decompress_sum_(payloads: torch.Tensor, out: torch.Tensor, inv_n: float,
                              scales: torch.Tensor | None = None, block: int = 512) -> bool:
    """out = (decode(payloads[0]) + decode(payloads[1]) + ...) * inv_n, in float32.

    decode is float32(payload) (int8: q * scale, the row's block scale): what decompress_avg_
    gives with inv_n = 1. The sum starts from 0.0 and adds the rows in order, one rounding per
    row, as `total = zeros; total.add_(row)` does (so a -0.0 sums to +0.0, as there); then one
    multiply by inv_n. Returns True if any element of out is not finite.
    """
    check_decompress_sum(payloads, out, inv_n, scales, block)
    inv = as_float32("inv_n", inv_n)
    k, m = payloads.shape
    total = torch.zeros(m, dtype=torch.float32, device=payloads.device)
    for row in range(k):
        values = payloads[row].float()
        if payloads.dtype == torch.int8:
            values = values * _per_element(scales[row], m, block)
        total = total + values
    torch.mul(total, inv, out=out)
    return not bool(torch.isfinite(out).all())


def reference_reduce_compress_ef_(payloads: torch.Tensor, residual: torch.Tensor, out_payload: torch.Tensor,
                                  weight: float, in_scales: torch.Tensor | None = None,
                                  out_scales: torch.Tensor | None = None, block: int = 512) -> bool:
    """The shard owner's step, defined as the two ops it fuses: decompress_sum_(payloads, total,
    1.0, in_scales), then compress_ef_(total, residual, out_payload, weight, out_scales).

    Returns True if either found a value that is not finite (the first one's also makes the
    second's payload non-finite, so this is compress_ef_'s answer).
    """
    check_reduce_compress_ef(payloads, residual, out_payload, weight, in_scales, out_scales, block)
    total = torch.empty(payloads.shape[1], dtype=torch.float32, device=payloads.device)
    summed_bad = reference_decompress_sum_(payloads, total, 1.0, scales=in_scales, block=block)
    encoded_bad = reference_compress_ef_(total, residual, out_payload, weight, scales=out_scales, block=block)
    return summed_bad or encoded_bad
