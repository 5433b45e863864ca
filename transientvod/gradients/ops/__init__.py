"""The fused gradient-compression ops: one function per op, the backend chosen by the tensors' device.

    from transientvod.gradients import ops
    nonfinite = ops.compress_ef_(grad, residual, payload, weight)            # fp16 / bf16 payload
    nonfinite = ops.compress_ef_(grad, residual, q, weight, scales=s, block=512)  # int8 payload
    nonfinite = ops.decompress_avg_(summed, out, 1.0 / world_size, scales=s)
    nonfinite = ops.decompress_sum_(payloads, total, 1.0 / world_size, scales=s)  # [k, m]: k copies
    nonfinite = ops.reduce_compress_ef_(payloads, residual, out, 1.0 / world_size)  # decompress_sum_ + compress_ef_

Every op works on contiguous buckets (flat 1-D, or k rows of m for the owner's two), in place,
in one pass, and returns a Python bool: True if it saw a NaN or Inf (found in the same pass).
On a GPU that bool waits for the stream. Given `flag=` (an int32 tensor of one element on the
tensors' device, zeroed by the caller), an op instead ORs 1 into it and returns None, without
waiting: zero it once, run several ops, read it once.
`weight` and `inv_n` are rounded to float32 first. Every backend gives the same bits as
`reference.py` (NaN bit patterns aside).

Backends, by the tensors' device:

- CUDA tensors: "cuda" (the compiled extension) or "cupy" (csrc/cuda compiled at run time),
  both through `transientvod.gradients.ops.cuda`, when it imports and says it is available; else "torch".
- CPU tensors: "numba" (`cpu.py`) when numba imports; else "torch".
- "torch" is `reference.py`: plain PyTorch, any device, slower and allocating.

`TRANSIENTVOD_KERNELS=cuda|cupy|numba|torch` overrides the choice (read at every call); a
backend that cannot run the tensors at hand raises a one-sentence RuntimeError. For "cuda" and
"cupy" the variable is also what `transientvod.gradients.ops.cuda` reads to pick between its two.
`backend_for(device)` says which backend a device gets, and why (`transientvod doctor`).
"""
from __future__ import annotations

import os

import torch

from transientvod.gradients.ops import reference
from transientvod.gradients.ops.reference import (check_compress_ef, check_decompress_avg, check_decompress_sum,
                                                  check_reduce_compress_ef, reference_compress_ef_,
                                                  reference_decompress_avg_, reference_decompress_sum_,
                                                  reference_reduce_compress_ef_)

BACKENDS = ("cuda", "cupy", "numba", "torch")
KERNELS_ENV = "TRANSIENTVOD_KERNELS"

__all__ = ["BACKENDS", "KERNELS_ENV", "backend_for", "compress_ef_", "decompress_avg_", "decompress_sum_",
           "reduce_compress_ef_", "reference_compress_ef_", "reference_decompress_avg_", "reference_decompress_sum_",
           "reference_reduce_compress_ef_"]

_imported: dict[str, tuple[object, str]] = {}  # "numba" / "cuda" -> (module or None, why)


def _import(kind: str) -> tuple[object, str]:
    """The backend module and a few words on it, or (None, why it does not import); imported once."""
    if kind not in _imported:
        try:
            if kind == "numba":
                import numba

                from transientvod.gradients.ops import cpu as module
                _imported[kind] = (module, f"numba {numba.__version__} kernels")
            else:
                from transientvod.gradients.ops import cuda as module
                _imported[kind] = (module, "")
        except Exception as error:  # an absent or broken backend means "not available", with the reason
            _imported[kind] = (None, f"transientvod.gradients.ops.{'cpu' if kind == 'numba' else 'cuda'} does not import "
                                     f"({type(error).__name__}: {error})")
    return _imported[kind]


def _cuda_kernels() -> tuple[object, str]:
    """transientvod.gradients.ops.cuda if it imports and says it can run now (it reads KERNELS_ENV itself
    to pick "cuda" or "cupy", so its answer is asked at every call), else (None, why not)."""
    module, why = _import("cuda")
    if module is None:
        return None, why
    try:
        ok, why = module.available()
    except Exception as error:
        return None, f"transientvod.gradients.ops.cuda.available() failed ({type(error).__name__}: {error})"
    return (module if ok else None), why


def _usable(backend: str, device: torch.device) -> tuple[object, str]:
    """(module, why) if backend can run tensors on device, else (None, why not)."""
    if backend == "torch":
        return reference, "plain PyTorch (reference.py)"
    if backend == "numba":
        if device.type != "cpu":
            return None, f"numba kernels run on CPU tensors, and these are on {device}"
        return _import("numba")
    if not torch.cuda.is_available():
        return None, f"CUDA is not available to torch {torch.__version__} on this machine"
    if device.type != "cuda":
        return None, f"the {backend} kernels run on CUDA tensors, and these are on {device}"
    return _cuda_kernels()


def _choose(device: torch.device) -> tuple[str, object, str]:
    override = os.environ.get(KERNELS_ENV, "").strip().lower()
    if override:
        if override not in BACKENDS:
            raise RuntimeError(f"{KERNELS_ENV}={override!r} names no kernel backend; "
                               f"use one of {', '.join(BACKENDS)} or leave it unset.")
        module, why = _usable(override, device)
        if module is None:
            raise RuntimeError(f"{KERNELS_ENV}={override} cannot be used: {why}.")
        return override, module, f"{KERNELS_ENV}={override}: {why}"
    if device.type == "cuda":
        module, why = _usable("cuda", device)
        if module is not None:
            # The module reports which of its two ways it compiled ("cuda" or "cupy").
            name = getattr(module, "BACKEND", "cuda")
            return name if name in ("cuda", "cupy") else "cuda", module, f"CUDA tensors: {why}"
        return "torch", reference, f"CUDA tensors, but no CUDA kernels ({why}): plain PyTorch"
    if device.type == "cpu":
        module, why = _usable("numba", device)
        if module is not None:
            return "numba", module, f"CPU tensors: {why}"
        return "torch", reference, f"CPU tensors, but no numba ({why}): plain PyTorch"
    return "torch", reference, f"{device.type} tensors have no kernels: plain PyTorch"


def backend_for(device: torch.device | str) -> tuple[str, str]:
    """(backend, why) for tensors on device, as the ops would choose now; for `transientvod doctor`."""
    backend, _, why = _choose(torch.device(device))
    return backend, why


def _run(device: torch.device, name: str, flag: torch.Tensor | None, *args, **kwargs) -> bool | None:
    """The op on the backend the device gets: its bool, or (given flag) None, the flag ORed."""
    backend, module, _ = _choose(device)
    op = getattr(module, f"reference_{name}" if module is reference else name)
    if flag is None:
        return bool(op(*args, **kwargs))
    if backend in ("cuda", "cupy"):
        op(*args, **kwargs, flag=flag)  # the kernels OR into it on the device
    elif op(*args, **kwargs):  # the CPU backends and reference.py answer at once
        flag.fill_(1)
    return None


def compress_ef_(grad: torch.Tensor, residual: torch.Tensor, payload: torch.Tensor, weight: float,
                 scales: torch.Tensor | None = None, block: int = 512,
                 flag: torch.Tensor | None = None) -> bool | None:
    """Error-feedback compression of one bucket, in place, in one pass.

    x = grad * weight + residual (float32, two roundings, no FMA). Then by payload dtype:

    - float16 / bfloat16: payload = x rounded to nearest-even (bit-identical to `x.to(dtype)`,
      subnormals, overflow to inf); residual = x - float32(payload).
    - int8 (needs scales, float32 [ceil(n / block)], block 256..1024): per block,
      scale = max |x| / 127 over its finite elements (0 for an all-zero block);
      q = round-half-even(x / scale) clamped to +-127 (0 where scale is 0);
      residual = x - q * scale, so |residual| <= scale / 2.

    Returns True if any payload element is not finite (x was NaN/Inf, or overflowed fp16 /
    bf16); there the residual is 0 (and an int8 q is 0): nothing non-finite is carried on.
    With flag= it ORs that into the flag instead and returns None (module docstring).
    grad, residual: float32 [n]; payload: float16, bfloat16 or int8 [n]; all on one device.
    """
    check_compress_ef(grad, residual, payload, weight, scales, block, flag)
    return _run(grad.device, "compress_ef_", flag, grad, residual, payload, weight, scales=scales, block=block)


def decompress_avg_(payload: torch.Tensor, out: torch.Tensor, inv_n: float,
                    scales: torch.Tensor | None = None, block: int = 512,
                    flag: torch.Tensor | None = None) -> bool | None:
    """out = float32(payload) * inv_n, in place (int8: q * scale * inv_n, its block's scale).

    payload: float16, bfloat16, int8 (with scales) or float32 [n] (bf16 payloads summed in
    float32); out: float32 [n]. Returns True if any element of out is not finite (e.g. an fp16
    sum that overflowed to inf); with flag=, ORs that into the flag and returns None.
    """
    check_decompress_avg(payload, out, inv_n, scales, block, flag)
    return _run(payload.device, "decompress_avg_", flag, payload, out, inv_n, scales=scales, block=block)


def decompress_sum_(payloads: torch.Tensor, out: torch.Tensor, inv_n: float,
                    scales: torch.Tensor | None = None, block: int = 512,
                    flag: torch.Tensor | None = None) -> bool | None:
    """The shard owner's step: decode k ranks' copies of the same m elements and sum them, in one pass.

    out[i] = (decode(payloads[0, i]) + ... + decode(payloads[k-1, i])) * inv_n in float32: the
    sum starts from 0.0 and adds the rows in row order, one rounding each, never an FMA; decode
    is what `decompress_avg_` does with inv_n = 1 (float32(payload); int8: q * scale, the
    row's block scale). So decompress_sum_(P, out, 1.0, S) has the bits of zeroing a total and
    adding decompress_avg_(P[r], copy, 1.0, S[r]) for r = 0 .. k-1.

    payloads: float16, bfloat16 or int8 [k, m], k >= 1, contiguous; scales (int8 only): float32
    [k, ceil(m / block)], one row per rank; out: float32 [m]. Returns True if any element of
    out is not finite; with flag=, ORs that into the flag and returns None.
    """
    check_decompress_sum(payloads, out, inv_n, scales, block, flag)
    return _run(payloads.device, "decompress_sum_", flag, payloads, out, inv_n, scales=scales, block=block)


def reduce_compress_ef_(payloads: torch.Tensor, residual: torch.Tensor, out_payload: torch.Tensor, weight: float,
                        in_scales: torch.Tensor | None = None, out_scales: torch.Tensor | None = None,
                        block: int = 512, flag: torch.Tensor | None = None) -> bool | None:
    """The shard owner's whole step in one pass: sum k ranks' copies, re-encode with error feedback.

    The bits of decompress_sum_(payloads, total, 1.0, in_scales) followed by
    compress_ef_(total, residual, out_payload, weight, out_scales) (reference.py defines it so),
    without the float32 total in memory: the copies are read once, the residual read and
    written once, out_payload (and out_scales) written once. An int8 block's sum is made in a
    small buffer, since its scale needs the block's max |x| before any element is quantized.

    payloads: float16, bfloat16 or int8 [k, m], k >= 1, contiguous; in_scales (int8 only):
    float32 [k, ceil(m / block)]; residual: float32 [m]; out_payload: [m], the payloads' dtype;
    out_scales (int8 only): float32 [ceil(m / block)]. Returns True if a sum or x is not finite, or (fp16 / bf16)
    overflowed: compress_ef_'s answer, its payload and residual following compress_ef_'s rules
    there; with flag=, ORs that into the flag and returns None.
    """
    check_reduce_compress_ef(payloads, residual, out_payload, weight, in_scales, out_scales, block, flag)
    return _run(payloads.device, "reduce_compress_ef_", flag, payloads, residual, out_payload, weight,
                in_scales=in_scales, out_scales=out_scales, block=block)
