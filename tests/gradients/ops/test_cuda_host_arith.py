"""The CUDA kernels' arithmetic, run on the CPU: tests/gradients/ops/cuda_host/harness.cu compiles the element
functions of csrc/cuda/compress.cuh (encode, decode, the residual update, quantize_one, ...) for
the host with nvcc, and each op built from them must match the torch reference
(transientvod/gradients/ops/reference.py) bit for bit: payload bits, residual bits, scales, codes, the
non-finite flag, and NaN at the same positions (a NaN's own bits may differ, as the op contract
allows). Inputs: every fp16 and bf16 bit pattern, every rounding midpoint of both formats and
of int8 (and the float32 values one ulp either side), and random inputs with NaN/Inf.

What passing proves: the composition and the rounding order of the kernels' operations (which
products and sums, in which order, each rounded on its own; ties to even; what a non-finite
value turns into). What it cannot prove: the device's own conversion and arithmetic
instructions (on the host, cuda_fp16.h/cuda_bf16.h convert in software and mul_rn is the CPU's
multiply), and the CTA-level work (vector loads, the warp-shuffle block max, the flag's vote).
Those need a GPU: tests/gpu/run_checks.sh.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from transientvod.gradients.ops import reference

ROOT = Path(__file__).resolve().parents[3]
HARNESS_SOURCE = Path(__file__).resolve().parent / "cuda_host" / "harness.cu"
KERNEL_DIR = ROOT / "csrc" / "cuda"
CODEC_IDS = {torch.float16: 0, torch.bfloat16: 1}  # harness.cu's enum Codec
# The largest finite pattern, and the value the next pattern up would have if the format had
# one: values from the midpoint between them on round to infinity.
LARGEST_FINITE = {torch.float16: (0x7BFF, 2.0 ** 16), torch.bfloat16: (0x7F7F, 2.0 ** 128)}

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None,
    reason="nvcc is not on PATH, so the kernels' element functions cannot be built for the host "
           "(install the CUDA toolkit to run these tests)")

_vp, _f, _ll, _i = ctypes.c_void_p, ctypes.c_float, ctypes.c_longlong, ctypes.c_int
SIGNATURES = {
    "host_compress_ef_16bit": (_i, _vp, _vp, _vp, _f, _ll),
    "host_decompress_avg_16bit": (_i, _vp, _vp, _f, _ll),
    "host_decompress_avg_fp32": (_vp, _vp, _f, _ll),
    "host_compress_ef_i8": (_vp, _vp, _vp, _vp, _f, _ll, _i),
    "host_decompress_avg_i8": (_vp, _vp, _vp, _f, _ll, _i),
    "host_decompress_sum_16bit": (_i, _vp, _i, _ll, _vp, _f),
    "host_decompress_sum_i8": (_vp, _vp, _i, _ll, _vp, _f, _i),
    "host_reduce_compress_ef_16bit": (_i, _vp, _i, _ll, _vp, _vp, _f),
    "host_reduce_compress_ef_i8": (_vp, _vp, _i, _ll, _vp, _vp, _vp, _f, _i),
}


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> ctypes.CDLL:
    """The harness as a shared library, built once per session: host code only (--cudart none),
    -ffp-contract=off so that no host multiply and add fuse into an FMA."""
    library = tmp_path_factory.mktemp("cuda_host") / "harness.so"
    build = subprocess.run(
        ["nvcc", "-std=c++17", "-O2", "-shared",
         "-Xcompiler", "-fPIC,-ffp-contract=off,-Wall,-Wextra,-Werror",
         "-I", str(KERNEL_DIR), str(HARNESS_SOURCE), "-o", str(library)],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"nvcc could not build {HARNESS_SOURCE.name}:\n{build.stderr}"
    lib = ctypes.CDLL(str(library))
    for name, argtypes in SIGNATURES.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous
    return a.ctypes.data


# ---------------------------------------------------------------------------------------------
# Inputs


def pattern_values(dtype: torch.dtype) -> np.ndarray:
    """Every 16-bit pattern of dtype, as float32 values (NaN patterns included)."""
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    return bits.view(dtype).float().numpy()


def rounding_midpoints(dtype: torch.dtype) -> np.ndarray:
    """Each midpoint between neighbouring finite values of dtype (and between the largest and
    the next power of two, where rounding overflows), with the float32 values one ulp below and
    above it; both signs. Float32 holds every such midpoint exactly."""
    top, beyond = LARGEST_FINITE[dtype]
    values = pattern_values(dtype)[: top + 1].astype(np.float64)  # 0 .. largest, increasing
    upper = np.append(values[1:], beyond)
    mid64 = (values + upper) / 2
    mid = mid64.astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), mid64), "a midpoint is not a float32"
    inf = np.float32(np.inf)
    near = np.concatenate([mid, np.nextafter(mid, -inf), np.nextafter(mid, inf)])
    return np.concatenate([near, -near])


def random_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """Half spread over many magnitudes (1e-40 .. 1e40), half raw float32 bit patterns (NaN,
    Inf, subnormals and all)."""
    half = n // 2
    spread = rng.standard_normal(half) * 10.0 ** rng.uniform(-40, 40, half)
    with np.errstate(over="ignore"):
        spread = spread.astype(np.float32)
    raw = rng.integers(0, 2 ** 32, n - half, dtype=np.uint64).astype(np.uint32).view(np.float32)
    out = np.concatenate([spread, raw])
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------------------------------------
# Comparisons: exact bits, NaN only by position.


def assert_same_floats(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    wrong = (nan_got != nan_want) | (~nan_want & (got.view(np.uint32) != want.view(np.uint32)))
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        pytest.fail(f"{what}: {int(wrong.sum())} of {got.size} differ; first at {i}: "
                    f"harness {got[i]!r} (0x{got.view(np.uint32)[i]:08x}), "
                    f"reference {want[i]!r} (0x{want.view(np.uint32)[i]:08x})")


def assert_same_payload(got: np.ndarray, want: torch.Tensor, what: str) -> None:
    """16-bit payloads: the same bits, except that a NaN need only be a NaN."""
    want_bits = want.view(torch.int16).numpy().view(np.uint16)
    got_values = torch.from_numpy(got.view(np.int16)).view(want.dtype).float().numpy()
    nan_got, nan_want = np.isnan(got_values), torch.isnan(want.float()).numpy()
    wrong = (nan_got != nan_want) | (~nan_want & (got != want_bits))
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        pytest.fail(f"{what}: {int(wrong.sum())} of {got.size} payloads differ; first at {i}: "
                    f"harness 0x{got[i]:04x}, reference 0x{want_bits[i]:04x}")


def assert_same_ints(got: np.ndarray, want: np.ndarray, what: str) -> None:
    wrong = got != want
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        pytest.fail(f"{what}: {int(wrong.sum())} of {got.size} differ; first at {i}: "
                    f"harness {got[i]}, reference {want[i]}")


# ---------------------------------------------------------------------------------------------
# One op on both sides, compared


def check_compress_16bit(harness, dtype, grad, residual, weight, what) -> np.ndarray:
    """compress_ef_ on harness and reference; returns the residual after it."""
    grad, residual = np.ascontiguousarray(grad, np.float32), np.ascontiguousarray(residual, np.float32)
    n = grad.size
    h_residual, h_payload = residual.copy(), np.zeros(n, np.uint16)
    h_flag = harness.host_compress_ef_16bit(CODEC_IDS[dtype], _ptr(grad), _ptr(h_residual),
                                            _ptr(h_payload), weight, n)
    r_residual, r_payload = torch.from_numpy(residual.copy()), torch.zeros(n, dtype=dtype)
    r_flag = reference.reference_compress_ef_(torch.from_numpy(grad), r_residual, r_payload, weight)
    assert_same_payload(h_payload, r_payload, f"{what}: payload")
    assert_same_floats(h_residual, r_residual.numpy(), f"{what}: residual")
    assert bool(h_flag) == r_flag, f"{what}: non-finite flag {bool(h_flag)}, reference {r_flag}"
    return h_residual


def check_decompress(harness, payload: torch.Tensor, inv_n: float, what: str) -> None:
    n = payload.numel()
    h_out, r_out = np.zeros(n, np.float32), torch.zeros(n)
    if payload.dtype == torch.float32:
        h_flag = harness.host_decompress_avg_fp32(_ptr(payload.numpy()), _ptr(h_out), inv_n, n)
    else:
        bits = np.ascontiguousarray(payload.view(torch.int16).numpy())
        h_flag = harness.host_decompress_avg_16bit(CODEC_IDS[payload.dtype], _ptr(bits),
                                                   _ptr(h_out), inv_n, n)
    r_flag = reference.reference_decompress_avg_(payload, r_out, inv_n)
    assert_same_floats(h_out, r_out.numpy(), f"{what}: out")
    assert bool(h_flag) == r_flag, f"{what}: non-finite flag {bool(h_flag)}, reference {r_flag}"


def check_compress_int8(harness, grad, residual, weight, block, what):
    """compress_ef_ to int8 on both sides; returns the harness's (q, scales, residual)."""
    grad, residual = np.ascontiguousarray(grad, np.float32), np.ascontiguousarray(residual, np.float32)
    n, nb = grad.size, reference.nblocks(grad.size, block)
    h_residual, h_q, h_scales = residual.copy(), np.zeros(n, np.int8), np.zeros(nb, np.float32)
    h_flag = harness.host_compress_ef_i8(_ptr(grad), _ptr(h_residual), _ptr(h_q), _ptr(h_scales),
                                         weight, n, block)
    r_residual = torch.from_numpy(residual.copy())
    r_q, r_scales = torch.zeros(n, dtype=torch.int8), torch.zeros(nb)
    r_flag = reference.reference_compress_ef_(torch.from_numpy(grad), r_residual, r_q, weight,
                                              r_scales, block)
    assert_same_floats(h_scales, r_scales.numpy(), f"{what}: scales")
    assert_same_ints(h_q, r_q.numpy(), f"{what}: codes")
    assert_same_floats(h_residual, r_residual.numpy(), f"{what}: residual")
    assert bool(h_flag) == r_flag, f"{what}: non-finite flag {bool(h_flag)}, reference {r_flag}"
    return h_q, h_scales, h_residual


def check_decompress_int8(harness, q, scales, inv_n, block, what) -> None:
    n = q.size
    h_out, r_out = np.zeros(n, np.float32), torch.zeros(n)
    h_flag = harness.host_decompress_avg_i8(_ptr(q), _ptr(scales), _ptr(h_out), inv_n, n, block)
    r_flag = reference.reference_decompress_avg_(torch.from_numpy(q), r_out, inv_n,
                                                 torch.from_numpy(scales), block)
    assert_same_floats(h_out, r_out.numpy(), f"{what}: out")
    assert bool(h_flag) == r_flag, f"{what}: non-finite flag {bool(h_flag)}, reference {r_flag}"


# ---------------------------------------------------------------------------------------------
# 16-bit codecs

CODECS = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])


@CODECS
@pytest.mark.parametrize("inv_n", [1.0, 0.25, 1 / 3, 1 / 7, 2.0 ** -130])
def test_every_16bit_pattern_decodes_and_averages_like_torch(harness, dtype, inv_n):
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    check_decompress(harness, bits.view(dtype), inv_n, f"{dtype} every pattern, inv_n={inv_n}")


@CODECS
@pytest.mark.parametrize("weight", [1.0, 0.5, 3.0])
def test_every_16bit_value_encodes_like_torch(harness, dtype, weight):
    # weight 1: each value must come back as its own pattern with residual 0 (NaN patterns
    # raise the flag); 0.5 and 3 move values across subnormals and overflow.
    values = pattern_values(dtype)
    check_compress_16bit(harness, dtype, values, np.zeros_like(values), weight,
                         f"{dtype} every pattern's value, weight={weight}")


@CODECS
def test_every_rounding_midpoint_and_its_neighbours_encode_like_torch(harness, dtype):
    mids = rounding_midpoints(dtype)
    zeros = np.zeros_like(mids)
    check_compress_16bit(harness, dtype, mids, zeros, 1.0, f"{dtype} midpoints as gradients")
    # the same values arriving through the residual: x = 0 * w + r
    check_compress_16bit(harness, dtype, zeros, mids, 1.0, f"{dtype} midpoints as residuals")


@CODECS
@pytest.mark.parametrize("weight", [1.0, 0.3, 1 / 3, -2.5, 1e-30, 3e38])
def test_random_inputs_over_several_steps_compress_like_torch(harness, dtype, weight):
    # Three steps, each residual feeding the next, as the exchange uses the op: the product, the
    # sum, the rounding and the subtraction must compose in the reference's order.
    rng = np.random.default_rng(zlib.crc32(f"{dtype} {weight!r}".encode()))
    n = 20_000
    # a finite residual, subnormals included, as a previous step leaves it
    residual = (rng.standard_normal(n) * 10.0 ** rng.uniform(-45, 0, n)).astype(np.float32)
    for step in range(3):
        grad = random_floats(rng, n)
        residual = check_compress_16bit(harness, dtype, grad, residual, weight,
                                        f"{dtype} random step {step}, weight={weight}")


def test_fp32_payloads_average_like_torch(harness):
    payload = torch.from_numpy(random_floats(np.random.default_rng(1), 100_000))
    for inv_n in (1.0, 0.25, 1 / 3, 1e-38):
        check_decompress(harness, payload, inv_n, f"fp32 random, inv_n={inv_n}")


# ---------------------------------------------------------------------------------------------
# int8


def int8_midpoint_blocks(rng: np.random.Generator, block: int) -> np.ndarray:
    """Blocks whose first element is their amax, followed by every code midpoint (k + 1/2) times
    the block's scale and the float32 values one ulp either side: amax 127 (scale exactly 1, so
    the midpoints are exact ties) and random amaxes (x / scale lands next to a tie, where a
    multiply by the reciprocal would round differently)."""
    inf = np.float32(np.inf)
    blocks = []
    for amax in [np.float32(127.0)] + list(rng.uniform(1e-6, 1e6, 15).astype(np.float32)):
        scale = amax / np.float32(127.0)
        mids = ((np.arange(-127, 127) + 0.5) * np.float64(scale)).astype(np.float32)
        near = np.concatenate([mids, np.nextafter(mids, -inf), np.nextafter(mids, inf)])
        near = near[np.abs(near) <= amax]
        values = np.zeros(block, np.float32)
        values[0] = amax
        values[1:1 + near.size] = rng.permutation(near)[: block - 1]
        blocks.append(values)
    return np.concatenate(blocks)


@pytest.mark.parametrize("block", [256, 300, 1024])
def test_int8_rounding_midpoints_quantize_like_torch(harness, block):
    rng = np.random.default_rng(block)
    values = int8_midpoint_blocks(rng, block)
    q, scales, _ = check_compress_int8(harness, values, np.zeros_like(values), 1.0, block,
                                       f"int8 midpoints, block={block}")
    check_decompress_int8(harness, q, scales, 0.25, block, f"int8 midpoints, block={block}")


@pytest.mark.parametrize("block", [256, 300, 1024])
@pytest.mark.parametrize("weight", [1.0, 0.3, 1e-30])
def test_int8_random_inputs_over_several_steps_quantize_like_torch(harness, block, weight):
    rng = np.random.default_rng([block, zlib.crc32(repr(weight).encode())])
    n = 20 * block + block // 3  # a short last block
    residual = np.zeros(n, np.float32)
    for step in range(3):
        grad = (rng.standard_normal(n) * 10.0 ** rng.uniform(-20, 20, n)).astype(np.float32)
        grad[rng.integers(0, n, 5)] = [np.nan, np.inf, -np.inf, np.nan, 0.0]
        grad[2 * block: 3 * block] = 0.0  # an all-zero block: scale 0, codes 0
        q, scales, residual = check_compress_int8(
            harness, grad, residual, weight, block,
            f"int8 random step {step}, block={block}, weight={weight}")
        for inv_n in (1.0, 1 / 3):
            check_decompress_int8(harness, q, scales, inv_n, block,
                                  f"int8 random step {step}, block={block}, inv_n={inv_n}")


# ---------------------------------------------------------------------------------------------
# decompress_sum_: k ranks' copies decoded and summed in row order


def check_decompress_sum(harness, payloads: torch.Tensor, scales, inv_n, block, what) -> np.ndarray:
    """decompress_sum_ on harness and reference; returns the harness's out."""
    k, m = payloads.shape
    h_out, r_out = np.zeros(m, np.float32), torch.zeros(m)
    if payloads.dtype == torch.int8:
        h_flag = harness.host_decompress_sum_i8(_ptr(payloads.numpy()), _ptr(scales.numpy()), k, m,
                                                _ptr(h_out), inv_n, block)
    else:
        bits = np.ascontiguousarray(payloads.view(torch.int16).numpy())
        h_flag = harness.host_decompress_sum_16bit(CODEC_IDS[payloads.dtype], _ptr(bits), k, m,
                                                   _ptr(h_out), inv_n)
    r_flag = reference.reference_decompress_sum_(payloads, r_out, inv_n, scales, block)
    assert_same_floats(h_out, r_out.numpy(), f"{what}: out")
    assert bool(h_flag) == r_flag, f"{what}: non-finite flag {bool(h_flag)}, reference {r_flag}"
    return h_out


def composed_sum(payloads: torch.Tensor, scales, block: int) -> np.ndarray:
    """What decompress_sum_ with inv_n = 1 replaces: zeros, then decompress_avg_ of each row
    (inv_n = 1) added in row order."""
    k, m = payloads.shape
    total, copy = torch.zeros(m), torch.zeros(m)
    for row in range(k):
        reference.reference_decompress_avg_(payloads[row], copy, 1.0,
                                            None if scales is None else scales[row], block)
        total.add_(copy)
    return total.numpy()


@CODECS
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_16bit_pattern_sums_like_torch(harness, dtype, k):
    # Each row holds every pattern (NaN, Inf, -0.0 and subnormals included) in its own order,
    # so each pattern meets many others, in every row position.
    rng = np.random.default_rng(k)
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    payloads = torch.stack([bits[torch.from_numpy(rng.permutation(65536))] for _ in range(k)]).view(dtype)
    out = check_decompress_sum(harness, payloads, None, 1.0, 512, f"{dtype} every pattern, k={k}")
    assert_same_floats(out, composed_sum(payloads, None, 512), f"{dtype} k={k}: vs decompress_avg_ + add")
    check_decompress_sum(harness, payloads, None, 1 / 3, 512, f"{dtype} every pattern, k={k}, inv_n=1/3")


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("block", [256, 300, 1024])
def test_int8_copies_sum_like_torch(harness, k, block):
    rng = np.random.default_rng(k * 1000 + block)
    m = 9 * block + 17  # a short last block
    nb = reference.nblocks(m, block)
    q = torch.from_numpy(rng.integers(-127, 128, (k, m), dtype=np.int8))
    scales = torch.from_numpy((rng.random((k, nb)) * 10.0 ** rng.uniform(-30, 30, (k, nb))).astype(np.float32))
    scales[0, 1] = np.inf  # a non-finite copy: flag raised
    scales[k - 1, 3] = 3e38  # large finite scales: the sum overflows to Inf where k > 1
    scales[:, 4] = 3e38
    q[:, 2 * block: 3 * block] = 0  # an all-zero block
    scales[:, 2] = 0.0
    what = f"int8 sum k={k} block={block}"
    out = check_decompress_sum(harness, q, scales, 1.0, block, what)
    assert not np.isfinite(out).all(), f"{what}: the Inf scale should give a non-finite sum"
    assert_same_floats(out, composed_sum(q, scales, block), f"{what}: vs decompress_avg_ + add")
    check_decompress_sum(harness, q, scales, 0.25, block, f"{what}, inv_n=1/4")


# ---------------------------------------------------------------------------------------------
# reduce_compress_ef_: the copies' sum re-encoded with the owner's residual, in one pass


def check_reduce_compress_ef(harness, payloads: torch.Tensor, scales, residual: np.ndarray, weight: float,
                             block: int, what: str) -> bool:
    """reduce_compress_ef_ on harness and reference (which is decompress_sum_ then
    compress_ef_): payload, residual, scales and flag; returns the flag."""
    (k, m), dtype = payloads.shape, payloads.dtype
    h_residual = np.ascontiguousarray(residual, np.float32).copy()
    r_residual = torch.from_numpy(h_residual.copy())
    r_out = torch.empty(m, dtype=dtype)
    r_scales = torch.empty(reference.nblocks(m, block)) if dtype == torch.int8 else None
    r_flag = reference.reference_reduce_compress_ef_(payloads, r_residual, r_out, weight, scales, r_scales, block)
    if dtype == torch.int8:
        h_out, h_scales = np.zeros(m, np.int8), np.zeros(r_scales.numel(), np.float32)
        h_flag = harness.host_reduce_compress_ef_i8(_ptr(payloads.numpy()), _ptr(scales.numpy()), k, m,
                                                    _ptr(h_residual), _ptr(h_out), _ptr(h_scales), weight, block)
        assert_same_ints(h_out, r_out.numpy(), f"{what}: codes")
        assert_same_floats(h_scales, r_scales.numpy(), f"{what}: scales")
    else:
        bits, h_out = np.ascontiguousarray(payloads.view(torch.int16).numpy()), np.zeros(m, np.uint16)
        h_flag = harness.host_reduce_compress_ef_16bit(CODEC_IDS[dtype], _ptr(bits), k, m, _ptr(h_residual),
                                                       _ptr(h_out), weight)
        assert_same_payload(h_out, r_out, f"{what}: payload")
    assert_same_floats(h_residual, r_residual.numpy(), f"{what}: residual")
    assert bool(h_flag) == r_flag, f"{what}: non-finite flag {bool(h_flag)}, reference {r_flag}"
    return r_flag


@CODECS
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("weight", [1.0, 1 / 3, 0.75])
def test_every_16bit_pattern_sums_and_reencodes_like_torch(harness, dtype, k, weight):
    # every pattern in every row (as in the sum test), with a finite residual that has subnormals
    rng = np.random.default_rng(k * 10 + int(weight * 4))
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    payloads = torch.stack([bits[torch.from_numpy(rng.permutation(65536))] for _ in range(k)]).view(dtype)
    residual = (rng.standard_normal(65536) * 10.0 ** rng.uniform(-45, 0, 65536)).astype(np.float32)
    assert check_reduce_compress_ef(harness, payloads, None, residual, weight, 512, f"{dtype} k={k} w={weight}")


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("block", [256, 300, 1024])
def test_int8_copies_sum_and_reencode_like_torch(harness, k, block):
    rng = np.random.default_rng(k * 1000 + block + 1)
    m = 9 * block + 17  # a short last block
    nb = reference.nblocks(m, block)
    q = torch.from_numpy(rng.integers(-127, 128, (k, m), dtype=np.int8))
    scales = torch.from_numpy((rng.random((k, nb)) * 10.0 ** rng.uniform(-30, 30, (k, nb))).astype(np.float32))
    scales[0, 1] = np.inf  # a non-finite copy: flag raised
    scales[:, 4] = 3e38  # a sum past float32 where k > 1
    q[:, 2 * block: 3 * block] = 0  # an all-zero block (with a zero residual there)
    scales[:, 2] = 0.0
    scales[:, 5] = 1e-40  # subnormal scales
    residual = (rng.standard_normal(m) * 10.0 ** rng.uniform(-45, 0, m)).astype(np.float32)
    residual[2 * block: 3 * block] = 0.0
    for weight in (1.0 / k, 1.0):
        assert check_reduce_compress_ef(harness, q, scales, residual, weight, block, f"int8 k={k} block={block}")
