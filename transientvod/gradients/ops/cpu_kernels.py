"""The fused ops' numba kernels on CPU: one pass over memory each (cpu.py calls them). The
arithmetic is the float32 arithmetic of `reference.py`, operation for operation, so the
results are bit-identical to it.

numba has no float16 on CPU, so fp16 and bf16 payloads are seen as their uint16 bit patterns
(`payload.view(torch.uint16).numpy()`) and converted by integer operations on the float32 bit
pattern, written as small LLVM intrinsics on 32-bit lanes (`_half_round`, `_half_value`,
`_bf16_bits`, `_bf16_value`): round to nearest-even, subnormals, overflow to inf, NaN stays a
NaN. They were checked once against torch on all 2^32 float32 inputs (payload and residual);
the tests check every 16-bit pattern and the values around every rounding point. Nothing
branches on the data, so LLVM vectorizes the loops; fp16 compression is about 5 vector
instructions per element, which on a 2-core machine still leaves it bound by memory.

The int8 kernels run one block per prange iteration: pass 1 finds the block's max |x|, pass 2
quantizes, reading x again from L1 rather than keeping it anywhere (see the note above `_CHUNK`).

The first call of each kernel compiles it (seconds); `cache=True` keeps the machine code in
`__pycache__` next to this file, so later processes load it instead. That cache is why the
intrinsics and the kernels share this one file: numba checks a cached kernel against its own
source file only, so an intrinsic edited in another module would leave stale machine code.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

# float32 constants: a Python float literal in a numba kernel is float64 and would turn the
# float32 arithmetic into float64 arithmetic.
_ZERO = np.float32(0.0)
_INF = np.float32(np.inf)
_Q_MAX = np.float32(127.0)
_Q_MIN = np.float32(-127.0)


@intrinsic
def _bits(typingctx, x):
    """The bit pattern of a float32, as int32 (a bit cast)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def _float(typingctx, bits):
    """The float32 whose bit pattern is the low 32 bits of an integer (a bit cast)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = context.cast(builder, args[0], signature.args[0], types.int32)
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


# ---------------------------------------------------------------------------------------------
# float32 <-> fp16 / bf16 bit patterns (ints in 0..0xFFFF)


# Written as LLVM IR on 32-bit integers: numba widens integer arithmetic to 64 bits, which
# halves the lanes of the vectorized loops.

_I32, _F32 = ir.IntType(32), ir.FloatType()


def _i32(value: int) -> ir.Constant:
    return ir.Constant(_I32, value)


@intrinsic
def _half_round(typingctx, x):
    """float32 -> (fp16 bits, float32 value of those bits, whether it is finite): round to
    nearest-even as torch's x.to(torch.float16), subnormals, overflow to inf, NaN to torch's
    quiet NaN. The value comes from the rounding itself, not from decoding the bits again."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        u = builder.bitcast(args[0], _I32)
        a = builder.and_(u, _i32(0x7FFFFFFF))  # |x|
        sign = builder.and_(u, _i32(-0x80000000))
        # Normal fp16 (2^-14 <= |x| < 65520): round the 13 mantissa bits fp16 lacks to
        # nearest-even in the float32 pattern itself, then rebias the exponent by (15 - 127).
        odd = builder.and_(builder.lshr(a, _i32(13)), _i32(1))
        rounded = builder.and_(builder.add(builder.add(a, _i32(0xFFF)), odd), _i32(-0x2000))
        normal_bits = builder.lshr(builder.sub(rounded, _i32(0x38000000)), _i32(13))
        # Subnormal fp16 (|x| < 2^-14): adding 0.5 lines the 2^-24 steps up with float32's last
        # mantissa bit, so the FPU's own round-to-nearest-even does the rounding.
        shifted = builder.fadd(builder.bitcast(a, _F32), ir.Constant(_F32, 0.5))
        subnormal_bits = builder.sub(builder.bitcast(shifted, _I32), _i32(0x3F000000))
        subnormal = builder.bitcast(builder.fsub(shifted, ir.Constant(_F32, 0.5)), _I32)
        is_normal = builder.icmp_unsigned(">=", a, _i32(0x38800000))
        h = builder.select(is_normal, normal_bits, subnormal_bits)
        v = builder.select(is_normal, rounded, subnormal)
        # |x| >= 65520 rounds to inf; NaN stays NaN
        finite = builder.icmp_unsigned("<", a, _i32(0x477FF000))
        nan = builder.icmp_unsigned(">", a, _i32(0x7F800000))
        h = builder.select(finite, h, builder.select(nan, _i32(0x7E00), _i32(0x7C00)))
        v = builder.select(finite, v, builder.select(nan, _i32(0x7FC00000), _i32(0x7F800000)))
        h = builder.or_(h, builder.lshr(sign, _i32(16)))
        v = builder.bitcast(builder.or_(v, sign), _F32)
        return context.make_tuple(builder, signature.return_type, [h, v, finite])

    return types.Tuple([types.int32, types.float32, types.boolean])(types.float32), codegen


@intrinsic
def _half_value(typingctx, h):
    """fp16 bits (an integer) -> float32, exact."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        h = context.cast(builder, args[0], signature.args[0], types.int32)
        magnitude = builder.shl(builder.and_(h, _i32(0x7FFF)), _i32(13))
        exponent = builder.and_(h, _i32(0x7C00))
        # normal: exponent + (127 - 15); inf and NaN: exponent 255; zero and subnormal: as a
        # normal with the implicit bit at 2^-14, minus that bit
        normal = builder.add(magnitude, _i32(0x38000000))
        special = builder.add(magnitude, _i32(0x70000000))
        tiny = builder.fsub(builder.bitcast(builder.add(magnitude, _i32(0x38800000)), _F32),
                            ir.Constant(_F32, 2.0 ** -14))
        v = builder.select(builder.icmp_unsigned("==", exponent, _i32(0x7C00)), special, normal)
        v = builder.select(builder.icmp_unsigned("==", exponent, _i32(0)), builder.bitcast(tiny, _I32), v)
        sign = builder.shl(builder.and_(h, _i32(0x8000)), _i32(16))
        return builder.bitcast(builder.or_(v, sign), _F32)

    return types.float32(h), codegen


@intrinsic
def _bf16_bits(typingctx, x):
    """float32 -> bf16 bits: the upper 16 bits rounded to nearest-even; NaN stays a quiet NaN."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        u = builder.bitcast(args[0], _I32)
        odd = builder.and_(builder.lshr(u, _i32(16)), _i32(1))
        rounded = builder.lshr(builder.add(builder.add(u, _i32(0x7FFF)), odd), _i32(16))
        quiet = builder.or_(builder.lshr(u, _i32(16)), _i32(0x40))
        nan = builder.icmp_unsigned(">", builder.and_(u, _i32(0x7FFFFFFF)), _i32(0x7F800000))
        return builder.select(nan, quiet, rounded)

    return types.int32(types.float32), codegen


@intrinsic
def _bf16_value(typingctx, h):
    """bf16 bits (an integer) -> float32, exact."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        h = context.cast(builder, args[0], signature.args[0], types.int32)
        return builder.bitcast(builder.shl(h, _i32(16)), _F32)

    return types.float32(h), codegen


# ---------------------------------------------------------------------------------------------
# Kernels. Each returns the number of non-finite elements it saw (a prange reduction). They run
# one chunk (int8: one block) of elements per prange iteration and hand it to plain loops over
# slices of it: indices that start at 0 are provably non-negative, so numba's wraparound check
# for negative indices folds away and LLVM vectorizes the loop (with range(start, stop) it
# gathers instead, at a sixth of the speed). A chunk of fp32 (8 KB) stays in L1.
_CHUNK = 2048


@njit(cache=True)
def _ef_16bit(grad, residual, payload, weight, bf16):
    """compress_ef_ of one chunk into fp16 (bf16 False) or bf16 bits; the branch is per chunk."""
    bad = 0
    if bf16:
        for i in range(grad.shape[0]):
            x = grad[i] * weight + residual[i]
            h = _bf16_bits(x)
            sent = _bf16_value(h)
            finite = abs(sent) < _INF
            payload[i] = h
            residual[i] = x - sent if finite else _ZERO
            bad += 0 if finite else 1
    else:
        for i in range(grad.shape[0]):
            x = grad[i] * weight + residual[i]
            h, sent, finite = _half_round(x)
            payload[i] = h
            residual[i] = x - sent if finite else _ZERO
            bad += 0 if finite else 1
    return bad


@njit(parallel=True, cache=True)
def _compress_16bit(grad, residual, payload, weight, bf16):
    n = grad.shape[0]
    bad = 0
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        start, stop = c * _CHUNK, min(c * _CHUNK + _CHUNK, n)
        bad += _ef_16bit(grad[start:stop], residual[start:stop], payload[start:stop], weight, bf16)
    return bad


@njit(cache=True)
def _quantize(x, scale):
    """The int8 rule for one finite x and a block scale > 0: round-half-even(x / scale)
    clamped to +-127, as a float32."""
    q = np.rint(x / scale)
    q = _Q_MAX if q > _Q_MAX else q
    return _Q_MIN if q < _Q_MIN else q


@njit(cache=True)
def _ef_block_amax(grad, residual, weight):
    """(largest finite |x| as a float32 bit pattern, number of non-finite x) over one block.
    For non-negative floats the integer order of the bit patterns is the float order."""
    amax = 0
    nonfinite = 0
    for i in range(grad.shape[0]):
        a = _bits(grad[i] * weight + residual[i]) & 0x7FFFFFFF
        finite = a < 0x7F800000
        amax = max(amax, a if finite else 0)
        nonfinite += 0 if finite else 1
    return amax, nonfinite


@njit(cache=True)
def _ef_block_quantize(grad, residual, payload, weight, scale):
    """q and the new residual of one block; x is recomputed rather than kept (no buffer)."""
    if scale == _ZERO:
        for i in range(grad.shape[0]):
            x = grad[i] * weight + residual[i]
            payload[i] = 0
            residual[i] = x if abs(x) < _INF else _ZERO
    else:
        for i in range(grad.shape[0]):
            x = grad[i] * weight + residual[i]
            x = x if abs(x) < _INF else _ZERO
            q = _quantize(x, scale)
            payload[i] = np.int8(q)
            residual[i] = x - q * scale


@njit(cache=True)
def _ef_block(grad, residual, payload, weight):
    """compress_ef_ of one int8 block: q and the new residual; returns (scale, non-finite x)."""
    amax, nonfinite = _ef_block_amax(grad, residual, weight)
    scale = _float(amax) / _Q_MAX
    _ef_block_quantize(grad, residual, payload, weight, scale)
    return scale, nonfinite


@njit(parallel=True, cache=True)
def _compress_int8(grad, residual, payload, scales, weight, block):
    n = grad.shape[0]
    bad = 0
    for b in prange(scales.shape[0]):
        start, stop = b * block, min(b * block + block, n)
        scales[b], nonfinite = _ef_block(grad[start:stop], residual[start:stop], payload[start:stop], weight)
        bad += nonfinite
    return bad


@njit(parallel=True, cache=True)
def _decompress_16bit(payload, out, inv_n, bf16):
    bad = 0
    for i in prange(payload.shape[0]):  # bf16 is loop-invariant: LLVM unswitches the loop
        v = (_bf16_value(payload[i]) if bf16 else _half_value(payload[i])) * inv_n
        out[i] = v
        bad += 0 if abs(v) < _INF else 1
    return bad


@njit(parallel=True, cache=True)
def _decompress_fp32(payload, out, inv_n):
    bad = 0
    for i in prange(payload.shape[0]):
        v = payload[i] * inv_n
        out[i] = v
        bad += 0 if abs(v) < _INF else 1
    return bad


@njit(cache=True)
def _dequant_block(payload, out, scale, inv_n):
    nonfinite = 0
    for i in range(payload.shape[0]):
        v = (np.float32(payload[i]) * scale) * inv_n
        out[i] = v
        nonfinite += 0 if abs(v) < _INF else 1
    return nonfinite


@njit(parallel=True, cache=True)
def _decompress_int8(payload, scales, out, inv_n, block):
    n = payload.shape[0]
    bad = 0
    for b in prange(scales.shape[0]):
        start, stop = b * block, min(b * block + block, n)
        bad += _dequant_block(payload[start:stop], out[start:stop], scales[b], inv_n)
    return bad


# The owner's ops add the k rows one after another into a chunk's running sum, from 0.0 (0 + -0.0
# is +0.0, as in the zeros + copies that decompress_sum_ replaced), one float32 add per row.
# decompress_sum_ sums in its chunk of out; reduce_compress_ef_ in a chunk-sized buffer (int8
# needs a block's whole x for its scale), then runs compress_ef_'s loops with it as the grad:
# the bits of decompress_sum_(.., 1.0) then compress_ef_ (a sum times 1.0 is the sum).


@njit(cache=True)
def _add_16bit_row(total, row, bf16):
    """Add one row of fp16 (bf16 False) or bf16 bit patterns; the branch is per row, not per element."""
    if bf16:
        for i in range(total.shape[0]):
            total[i] = total[i] + _bf16_value(row[i])
    else:
        for i in range(total.shape[0]):
            total[i] = total[i] + _half_value(row[i])


@njit(cache=True)
def _add_int8_row(total, q, scale):
    """The row's decode is decompress_avg_'s with inv_n = 1: float32(q) * scale, then the add."""
    for i in range(total.shape[0]):
        total[i] = total[i] + np.float32(q[i]) * scale


@njit(cache=True)
def _average_chunk(total, inv_n):
    """total *= inv_n; returns how many results are not finite."""
    nonfinite = 0
    for i in range(total.shape[0]):
        v = total[i] * inv_n
        total[i] = v
        nonfinite += 0 if abs(v) < _INF else 1
    return nonfinite


@njit(parallel=True, cache=True)
def _sum_16bit(payloads, out, inv_n, bf16):
    """fp16 or bf16 rows (uint16 bit patterns: numba has no float16 on CPU), chunk by chunk."""
    k, m = payloads.shape
    bad = 0
    for c in prange((m + _CHUNK - 1) // _CHUNK):
        start, stop = c * _CHUNK, min(c * _CHUNK + _CHUNK, m)
        total = out[start:stop]
        total[:] = _ZERO
        for row in range(k):
            _add_16bit_row(total, payloads[row, start:stop], bf16)
        bad += _average_chunk(total, inv_n)
    return bad


@njit(parallel=True, cache=True)
def _sum_int8(payloads, scales, out, inv_n, block):
    """One quantization block per prange iteration: each row's slice of it has one scale."""
    k, m = payloads.shape
    bad = 0
    for b in prange(scales.shape[1]):
        start, stop = b * block, min(b * block + block, m)
        total = out[start:stop]
        total[:] = _ZERO
        for row in range(k):
            _add_int8_row(total, payloads[row, start:stop], scales[row, b])
        bad += _average_chunk(total, inv_n)
    return bad


@njit(parallel=True, cache=True)
def _reduce_ef_16bit(payloads, residual, out, weight, bf16):
    k, m = payloads.shape
    bad = 0
    for c in prange((m + _CHUNK - 1) // _CHUNK):
        start, stop = c * _CHUNK, min(c * _CHUNK + _CHUNK, m)
        total = np.zeros(stop - start, np.float32)
        for row in range(k):
            _add_16bit_row(total, payloads[row, start:stop], bf16)
        bad += _ef_16bit(total, residual[start:stop], out[start:stop], weight, bf16)
    return bad


@njit(parallel=True, cache=True)
def _reduce_ef_int8(payloads, in_scales, residual, out, out_scales, weight, block):
    k, m = payloads.shape
    bad = 0
    for b in prange(out_scales.shape[0]):
        start, stop = b * block, min(b * block + block, m)
        total = np.zeros(stop - start, np.float32)
        for row in range(k):
            _add_int8_row(total, payloads[row, start:stop], in_scales[row, b])
        out_scales[b], nonfinite = _ef_block(total, residual[start:stop], out[start:stop], weight)
        bad += nonfinite
    return bad
