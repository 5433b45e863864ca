"""The fused compression ops (`transientvod.gradients.ops`) against their plain-PyTorch oracle.

    .venv/bin/python -m pytest -q tests/gradients/ops/test_ops.py

Every property is one `_test_*` function that takes a device; the parametrized tests run it
for each backend: "torch" (the reference itself) and "numba" on CPU, and on a machine with a
GPU, the CUDA kernels (that case is skipped where `torch.cuda.is_available()` is False). The
expected values are always computed by `reference.py` on CPU copies of the inputs, and the
backends must match them bit for bit: payloads, residuals, q, scales and outputs (NaN bit
patterns aside). Sizes sit at block boundaries; NaN and Inf are injected at random positions.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from transientvod.gradients import ops
from transientvod.gradients.ops import reference as ref

HAS_NUMBA = importlib.util.find_spec("numba") is not None
HAS_CUDA = torch.cuda.is_available()

# (device, backend): backend None lets the ops choose, which on CUDA must be "cuda" or "cupy".
BACKENDS = [
    pytest.param(("cpu", "torch"), id="cpu-torch"),
    pytest.param(("cpu", "numba"), id="cpu-numba", marks=pytest.mark.skipif(not HAS_NUMBA, reason="numba is absent")),
    pytest.param(("cuda", None), id="cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")),
]
SIZES = [1, 255, 256, 257, 2**16 + 1]
BIG = 2**20 + 3  # for a few tests only: the reference takes a while on it
HALVES = [torch.float16, torch.bfloat16]
PAYLOADS = [torch.float16, torch.bfloat16, torch.int8]
BLOCKS = [256, 512, 1024]
WEIGHT = 0.7  # not a float32 value: every backend must round it to float32 first
EPS32 = 2.0**-24  # float32 unit roundoff


@pytest.fixture
def backend(request, monkeypatch):
    """Parametrized with (device, backend): forces the backend by the environment and returns the device."""
    device, name = request.param
    if name is None:
        monkeypatch.delenv(ops.KERNELS_ENV, raising=False)
        chosen, why = ops.backend_for(device)
        assert chosen in ("cuda", "cupy"), f"CUDA tensors would run on {chosen!r}, not the CUDA kernels: {why}"
    else:
        monkeypatch.setenv(ops.KERNELS_ENV, name)
        assert ops.backend_for(device)[0] == name
    return torch.device(device)


def backends_param(test):
    """Runs a test once per backend of BACKENDS; the `backend` fixture hands it the device."""
    return pytest.mark.parametrize("backend", BACKENDS, indirect=True)(test)


# ---------------------------------------------------------------------------------------------
# Helpers


def bucket(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A gradient with magnitudes from 2^-30 to 2^12 (fp16 subnormals to large, no fp16 overflow
    after weighting) and a small residual, on CPU."""
    gen = torch.Generator().manual_seed(seed)
    grad = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-30, 12, (n,), generator=gen).float())
    residual = torch.randn(n, generator=gen) * 2.0**-12
    return grad, residual


def inject_nonfinite(t: torch.Tensor, seed: int, count: int = 3) -> torch.Tensor:
    """NaN, +Inf and -Inf at random positions of t (in place); returns the positions."""
    gen = torch.Generator().manual_seed(seed)
    where = torch.randint(0, t.numel(), (count,), generator=gen)
    t[where] = torch.tensor([float("nan"), float("inf"), float("-inf")] * count)[:count]
    return where


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    if t.is_floating_point():
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit-identical, except that a NaN need only be a NaN."""
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    if actual.is_floating_point():
        nan = torch.isnan(expected)
        assert torch.equal(torch.isnan(actual), nan), f"{what}: NaN at other positions than the reference"
        actual, expected = actual.masked_fill(nan, 0), expected.masked_fill(nan, 0)
    torch.testing.assert_close(bits(actual), bits(expected), rtol=0, atol=0,
                               msg=lambda m: f"{what} differs from the reference bits:\n{m}")


def x_of(grad: torch.Tensor, residual: torch.Tensor, weight: float) -> torch.Tensor:
    """The x every backend quantizes: float32(float32(grad * w32) + residual), on CPU."""
    return grad.cpu() * ref.as_float32("weight", weight) + residual.cpu()


def per_element(scales: torch.Tensor, n: int, block: int) -> torch.Tensor:
    return scales.cpu().repeat_interleave(block)[:n]


# ---------------------------------------------------------------------------------------------
# compress_ef_


def _test_compress_ef(device: torch.device, dtype: torch.dtype, n: int, block: int = 512,
                      nonfinite: bool = False, zero_block: bool = False, seed: int = 0) -> None:
    grad, residual = bucket(n, seed)
    if zero_block:  # the second block (or the only one) all zero: scale 0, never NaN
        lo = block if n > block else 0
        grad[lo:lo + block] = 0
        residual[lo:lo + block] = 0
    bad = inject_nonfinite(grad, seed) if nonfinite else torch.tensor([], dtype=torch.long)
    x = x_of(grad, residual, WEIGHT)
    old_residual = residual.clone()
    nb = ref.nblocks(n, block) if dtype == torch.int8 else 0

    exp_residual, exp_payload = residual.clone(), torch.empty(n, dtype=dtype)
    exp_scales = torch.empty(nb) if dtype == torch.int8 else None
    exp_flag = ref.reference_compress_ef_(grad.clone(), exp_residual, exp_payload, WEIGHT, scales=exp_scales,
                                          block=block)

    g, r = grad.clone().to(device), residual.clone().to(device)
    payload = torch.empty(n, dtype=dtype, device=device)
    scales = torch.empty(nb, device=device) if dtype == torch.int8 else None
    flag = ops.compress_ef_(g, r, payload, WEIGHT, scales=scales, block=block)

    assert flag is nonfinite is exp_flag, f"the non-finite flag is {flag}, the data has NaN/Inf: {nonfinite}"
    assert torch.equal(bits(g), bits(grad)), "compress_ef_ changed grad"
    assert_same(payload, exp_payload, "payload")
    assert_same(r, exp_residual, "residual")
    r = r.cpu()
    finite = torch.isfinite(x)
    assert torch.equal(~finite, torch.isin(torch.arange(n), bad))
    assert torch.all(r[~finite] == 0), "the residual is not 0 where x is not finite"
    if dtype == torch.int8:
        assert_same(scales, exp_scales, "scales")
        q, s = payload.cpu(), per_element(scales, n, block)
        assert torch.all(q[~finite] == 0) and torch.all(q.abs() <= 127)
        assert torch.isfinite(scales.cpu()).all() and (scales.cpu() >= 0).all()
        # |x - q * scale| <= scale / 2, plus float32 rounding of x / scale and of q * scale
        err = (x.double() - q.double() * s.double()).abs()
        assert torch.all(err[finite] <= s.double()[finite] * (0.5 + 1e-5)), "int8 error above half a scale"
        if zero_block:
            lo = block if n > block else 0
            assert scales.cpu()[lo // block] == 0 and torch.all(q[lo:lo + block] == 0)
        dequant = q.float() * s  # what decompress_avg_ gives with inv_n = 1
    else:
        dequant = payload.cpu().float()
        torch.testing.assert_close(bits(payload[finite.to(device)]), bits(x[finite].to(dtype)), rtol=0, atol=0)
        assert torch.all(torch.isinf(dequant[torch.isinf(x)])) and torch.all(torch.isnan(dequant[torch.isnan(x)]))
    # Error feedback: what was sent plus what is kept is exactly x (both differences are exact in float32) ...
    torch.testing.assert_close(dequant.double()[finite] + r.double()[finite], x.double()[finite], rtol=0, atol=0)
    # ... and x is grad * weight + residual up to its two float32 roundings.
    w = ref.as_float32("weight", WEIGHT)
    product = grad.double() * w
    exact = product + old_residual.double()
    assert torch.all((x.double() - exact).abs()[finite] <= EPS32 * (product.abs() + x.double().abs())[finite] * 1.01)


@backends_param
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", PAYLOADS, ids=str)
def test_compress_ef(backend, dtype, n):
    _test_compress_ef(backend, dtype, n)


@backends_param
@pytest.mark.parametrize("dtype", [torch.float16, torch.int8], ids=str)
def test_compress_ef_big_bucket(backend, dtype):
    _test_compress_ef(backend, dtype, BIG, nonfinite=True, seed=3)


@backends_param
@pytest.mark.parametrize("n", [1, 255, 256, 257, 1024, 1025, 5 * 1024 + 17])
@pytest.mark.parametrize("block", BLOCKS)
def test_compress_int8_blocks(backend, block, n):
    _test_compress_ef(backend, torch.int8, n, block=block, zero_block=True, seed=n + block)


@backends_param
@pytest.mark.parametrize("n", [1, 257, 2**16 + 1])
@pytest.mark.parametrize("dtype", PAYLOADS, ids=str)
def test_compress_ef_flags_nan_and_inf(backend, dtype, n):
    _test_compress_ef(backend, dtype, n, nonfinite=True, seed=n)


def ties_bucket(blocks: int, block: int, seed: int) -> torch.Tensor:
    """int8 blocks whose values sit on and next to the rounding points: block b's largest value
    is 127 * c_b, so its scale is exactly c_b, and the others are (j + 1/2) * c_b, j = -127..126,
    and their float32 neighbours. Half the blocks have a c_b of 16 significant bits (the ties are
    exact: half to even decides), half a c_b of 24 (x / scale lands next to the tie, where a
    multiply by the reciprocal instead of the division gives another q)."""
    gen = torch.Generator().manual_seed(seed)
    mantissa = torch.randint(2**15, 2**16, (blocks,), generator=gen).double() / 2**16
    mantissa[1::2] = torch.randint(2**23, 2**24, (blocks // 2,), generator=gen).double() / 2**24
    c = (mantissa * torch.exp2(torch.randint(-20, 20, (blocks,), generator=gen).double())).float()
    j = torch.arange(-127, 127, dtype=torch.float32) + 0.5
    values = []
    for cb in c:
        ties = j[torch.randint(0, j.numel(), (block - 1,), generator=gen)] * cb
        ties = torch.where(torch.arange(block - 1) % 3 == 1, torch.nextafter(ties, torch.tensor(0.0)), ties)
        values.append(torch.cat([(cb * 127).reshape(1), ties]))
    return torch.cat(values)


@backends_param
def test_compress_int8_rounds_half_to_even_by_division(backend):
    block = 256
    x = ties_bucket(64, block, seed=5)
    q, scales = torch.empty(x.numel(), dtype=torch.int8), torch.empty(64)
    ref.reference_compress_ef_(x.clone(), torch.full_like(x, -0.0), q, 1.0, scales=scales, block=block)
    ratio = x.double() / per_element(scales, x.numel(), block).double()
    tie = (ratio - ratio.floor()) == 0.5
    assert tie.sum() > 1000 and torch.all(q[tie] % 2 == 0), "the reference does not round ties to even"
    _test_compress_ef_on(backend, x, torch.int8, block)


def _test_compress_ef_on(device: torch.device, grad: torch.Tensor, dtype: torch.dtype, block: int) -> None:
    """compress_ef_ of a given gradient (weight 1, residual -0.0: x is grad) against the reference."""
    n = grad.numel()
    nb = ref.nblocks(n, block) if dtype == torch.int8 else 0
    exp_payload, exp_residual = torch.empty(n, dtype=dtype), torch.full_like(grad, -0.0)
    exp_scales = torch.empty(nb) if dtype == torch.int8 else None
    ref.reference_compress_ef_(grad, exp_residual, exp_payload, 1.0, scales=exp_scales, block=block)
    payload, residual = torch.empty(n, dtype=dtype, device=device), torch.full_like(grad, -0.0).to(device)
    scales = torch.empty(nb, device=device) if dtype == torch.int8 else None
    ops.compress_ef_(grad.to(device), residual, payload, 1.0, scales=scales, block=block)
    assert_same(payload, exp_payload, "payload")
    assert_same(residual, exp_residual, "residual")
    if scales is not None:
        assert_same(scales, exp_scales, "scales")


@backends_param
@pytest.mark.parametrize("dtype", PAYLOADS, ids=str)
def test_compress_ef_all_zero(backend, dtype):
    n = 300
    grad, residual = torch.zeros(n, device=backend), torch.zeros(n, device=backend)
    payload = torch.ones(n, dtype=dtype, device=backend)
    scales = torch.full((ref.nblocks(n, 256),), 7.0, device=backend) if dtype == torch.int8 else None
    assert ops.compress_ef_(grad, residual, payload, 1.0, scales=scales, block=256) is False
    assert torch.all(payload.cpu() == 0) and torch.all(residual.cpu() == 0)
    if scales is not None:
        assert torch.all(scales.cpu() == 0), "an all-zero block must have scale 0 (not NaN)"


@backends_param
def test_empty_bucket(backend):
    empty = torch.empty(0, device=backend)
    for dtype in HALVES:
        payload = torch.empty(0, dtype=dtype, device=backend)
        assert ops.compress_ef_(empty, empty.clone(), payload, 1.0) is False
        assert ops.decompress_avg_(payload, empty.clone(), 0.5) is False
    q = torch.empty(0, dtype=torch.int8, device=backend)
    assert ops.compress_ef_(empty, empty.clone(), q, 1.0, scales=empty.clone()) is False
    assert ops.decompress_avg_(q, empty.clone(), 0.5, scales=empty.clone()) is False
    for dtype in PAYLOADS:
        payloads = torch.empty(2, 0, dtype=dtype, device=backend)
        scales = torch.empty(2, 0, device=backend) if dtype == torch.int8 else None
        assert ops.decompress_sum_(payloads, empty.clone(), 0.5, scales=scales) is False
        out_scales = empty.clone() if dtype == torch.int8 else None
        assert ops.reduce_compress_ef_(payloads, empty.clone(), torch.empty(0, dtype=dtype, device=backend), 0.5,
                                       in_scales=scales, out_scales=out_scales) is False


OVERFLOW = {  # (largest float32 that stays finite, smallest that rounds to inf, a few beyond)
    torch.float16: (65519.996, 65520.0, [65535.0, 65536.0, 70000.0, 3e38]),
    torch.bfloat16: (torch.tensor(0x7F7F7FFF, dtype=torch.int32).view(torch.float32).item(),
                     torch.tensor(0x7F7F8000, dtype=torch.int32).view(torch.float32).item(), [3.4e38]),
}


@backends_param
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_compress_ef_overflow_is_flagged(backend, dtype):
    """A finite x that rounds to inf is flagged, and its residual is 0; the largest x that
    does not is neither."""
    largest, first_inf, beyond = OVERFLOW[dtype]
    for value, overflows in [(largest, False), (first_inf, True)] + [(v, True) for v in beyond]:
        for sign in (1.0, -1.0):
            grad = torch.tensor([1.0, sign * value, 2.0**-25, 3 * 2.0**-25], device=backend)
            residual = torch.zeros_like(grad)
            payload = torch.empty(grad.numel(), dtype=dtype, device=backend)
            assert ops.compress_ef_(grad, residual, payload, 1.0) is overflows, (value, overflows)
            assert_same(payload, grad.cpu().to(dtype), "payload")
            assert bool(torch.isinf(payload.cpu()[1])) is overflows
            r = residual.cpu()
            kept = grad.cpu()[1] - payload.cpu()[1].float()
            assert torch.all(torch.isfinite(r)) and (r[1] == 0 if overflows else r[1] == kept)


# ---------------------------------------------------------------------------------------------
# fp16 / bf16 conversion: every 16-bit pattern, and float32 values around every rounding point


def all_patterns(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def _test_conversion(device: torch.device, dtype: torch.dtype) -> None:
    # 16 bits -> float32: decompress_avg_ with inv_n = 1 is exactly float32(payload).
    patterns = all_patterns(dtype)
    out = torch.empty(patterns.numel(), device=device)
    assert ops.decompress_avg_(patterns.to(device), out, 1.0) is True  # the patterns include inf and NaN
    assert_same(out, patterns.float(), "float32 of every bit pattern")
    # float32 -> 16 bits and back: every value of the format comes back as itself (residual 0).
    # A residual of -0.0 makes x = grad * 1 + (-0.0) exactly grad, -0.0 included.
    values = patterns.float()
    payload = torch.empty(values.numel(), dtype=dtype, device=device)
    residual = torch.full_like(values, -0.0).to(device)
    assert ops.compress_ef_(values.to(device), residual, payload, 1.0) is True
    assert_same(payload, patterns, "every bit pattern converted back")
    assert torch.all(residual.cpu() == 0)
    # Rounding points: the midpoint between every two neighbours (ties to even), one float32
    # step either side of it, the overflow threshold, and random float32 bit patterns.
    positive = all_patterns(dtype)[2**15:].double()
    finite = positive[torch.isfinite(positive)]
    past_max = torch.tensor([2.0**16 if dtype == torch.float16 else 2.0**128], dtype=torch.float64)
    upper = torch.cat([finite[1:], past_max])
    mids = ((finite + upper) / 2).float()  # exact in float32
    around = torch.cat([mids, torch.nextafter(mids, torch.tensor(0.0)),
                        torch.nextafter(mids, torch.tensor(float("inf")))])
    gen = torch.Generator().manual_seed(1)
    random_bits = torch.randint(-2**31, 2**31 - 1, (2**18,), dtype=torch.int32, generator=gen).view(torch.float32)
    edges = torch.tensor([0.0, 65504.0, 65519.996, 65520.0, 65536.0, 2.0**-24, 2.0**-25, 2.0**-14, 2.0**-126,
                          2.0**-149, 3.4028235e38, float("inf"), float("nan")])
    x = torch.cat([around, -around, edges, -edges, random_bits])
    payload = torch.empty(x.numel(), dtype=dtype, device=device)
    residual = torch.full_like(x, -0.0).to(device)
    assert ops.compress_ef_(x.to(device), residual, payload, 1.0) is True
    assert_same(payload, x.to(dtype), f"float32 -> {dtype} rounding")
    ok = torch.isfinite(payload.cpu())
    torch.testing.assert_close(payload.cpu().double()[ok] + residual.cpu().double()[ok], x.double()[ok],
                               rtol=0, atol=0)


@backends_param
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_conversion_is_torchs(backend, dtype):
    _test_conversion(backend, dtype)


# ---------------------------------------------------------------------------------------------
# decompress_avg_


def _test_decompress_avg(device: torch.device, dtype: torch.dtype, n: int, block: int = 512,
                         nonfinite: bool = False, seed: int = 0) -> None:
    inv_n = 1.0 / 3.0
    grad, residual = bucket(n, seed)
    payload = torch.empty(n, dtype=dtype)
    scales = torch.empty(ref.nblocks(n, block)) if dtype == torch.int8 else None
    if dtype == torch.float32:
        payload.copy_(grad)
    else:
        ref.reference_compress_ef_(grad, residual, payload, 1.0, scales=scales, block=block)
    if nonfinite:  # an fp16 sum that overflowed; an int8 scale that did
        if dtype == torch.int8:
            scales[-1] = float("inf")
            payload[-1] = 1
        else:
            payload[n // 2] = float("inf")
    exp_out = torch.empty(n)
    exp_flag = ref.reference_decompress_avg_(payload, exp_out, inv_n, scales=scales, block=block)
    out = torch.full((n,), 5.0, device=device)
    flag = ops.decompress_avg_(payload.to(device), out, inv_n, scales=None if scales is None else scales.to(device),
                               block=block)
    assert flag is nonfinite is exp_flag
    assert_same(out, exp_out, "out")
    # out is float32(payload) / n up to one rounding (int8: two)
    if dtype == torch.int8:
        exact = payload.double() * per_element(scales, n, block).double() / 3
    else:
        exact = payload.double() / 3
    ok = torch.isfinite(exact)
    torch.testing.assert_close(out.cpu().double()[ok], exact[ok], rtol=3 * EPS32, atol=0)


@backends_param
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", PAYLOADS + [torch.float32], ids=str)
def test_decompress_avg(backend, dtype, n):
    _test_decompress_avg(backend, dtype, n)


@backends_param
@pytest.mark.parametrize("block", BLOCKS)
def test_decompress_int8_blocks(backend, block):
    _test_decompress_avg(backend, torch.int8, 3 * block + 1, block=block, seed=block)


@backends_param
@pytest.mark.parametrize("dtype", PAYLOADS + [torch.float32], ids=str)
def test_decompress_avg_flags_inf(backend, dtype):
    _test_decompress_avg(backend, dtype, 2**16 + 1, nonfinite=True)


# ---------------------------------------------------------------------------------------------
# decompress_sum_


def copies(dtype: torch.dtype, k: int, m: int, block: int, seed: int):
    """k ranks' encodings of their own gradients, as the compress step makes them: payloads
    [k, m] and (int8) scales [k, ceil(m / block)], on CPU."""
    payloads = torch.empty(k, m, dtype=dtype)
    scales = torch.empty(k, ref.nblocks(m, block)) if dtype == torch.int8 else None
    for rank in range(k):
        grad, residual = bucket(m, seed + rank)
        ref.reference_compress_ef_(grad, residual, payloads[rank], 1.0,
                                   scales=None if scales is None else scales[rank], block=block)
    return payloads, scales


def make_nonfinite(payloads: torch.Tensor, scales: torch.Tensor | None) -> None:
    """NaN in the first copy, +Inf in the last; with two copies or more also +Inf + -Inf (a NaN
    sum) and a finite sum past float32's range (int8: an Inf scale and one of 3e38)."""
    k, m = payloads.shape
    if scales is not None:
        scales[k - 1, 0] = float("inf")
        scales[:, -1] = 3e38
        return
    payloads[0, m // 3] = float("nan")
    payloads[k - 1, m // 2] = float("inf")
    if k > 1:
        payloads[0, m - 1], payloads[1, m - 1] = float("inf"), float("-inf")


def composed(device, payloads, scales, block) -> torch.Tensor:
    """What decompress_sum_ replaces: zeros, plus decompress_avg_(row, 1.0) of each row in turn."""
    k, m = payloads.shape
    total, copy = torch.zeros(m, device=device), torch.empty(m, device=device)
    for row in range(k):
        ops.decompress_avg_(payloads[row], copy, 1.0, scales=None if scales is None else scales[row], block=block)
        total.add_(copy)
    return total


def _test_decompress_sum(device: torch.device, dtype: torch.dtype, k: int, m: int, block: int = 512,
                         nonfinite: bool = False, seed: int = 0) -> None:
    inv_n = 1.0 / 3.0
    payloads, scales = copies(dtype, k, m, block, seed)
    if dtype != torch.int8:  # -0.0 in every copy: the sum from 0.0 is +0.0, as zeros + copies gives
        payloads[:, 0] = -0.0
    if nonfinite:
        make_nonfinite(payloads, scales)
    exp_out = torch.empty(m)
    exp_flag = ref.reference_decompress_sum_(payloads, exp_out, inv_n, scales=scales, block=block)
    p, s = payloads.to(device), None if scales is None else scales.to(device)
    out = torch.full((m,), 5.0, device=device)
    flag = ops.decompress_sum_(p, out, inv_n, scales=s, block=block)
    assert flag is nonfinite is exp_flag, f"the non-finite flag is {flag}, the data has NaN/Inf: {nonfinite}"
    assert_same(out, exp_out, "out")
    # with inv_n = 1: the bits of the decompress_avg_ + add composition it replaces
    assert ops.decompress_sum_(p, out, 1.0, scales=s, block=block) is nonfinite
    assert_same(out, composed(device, p, s, block), "out vs decompress_avg_ + add_")
    # out is the exact sum / 3 up to one rounding per add and one for the multiply
    values = payloads.double()
    if dtype == torch.int8:
        values = values * torch.stack([per_element(row, m, block) for row in scales]).double()
    exact = values.sum(dim=0)
    ok = torch.isfinite(exact) & torch.isfinite(exp_out)
    err = (out.cpu().double() - exact).abs()
    bound = (k + 1) * EPS32 * 1.01 * values.abs().sum(dim=0)
    assert torch.all(err[ok] <= bound[ok]), "out is further from the exact sum than k + 1 roundings"


@backends_param
@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", PAYLOADS, ids=str)
def test_decompress_sum(backend, dtype, k, m):
    _test_decompress_sum(backend, dtype, k, m, seed=k * m)


@backends_param
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("dtype", PAYLOADS, ids=str)
def test_decompress_sum_flags_nan_and_inf(backend, dtype, k):
    _test_decompress_sum(backend, dtype, k, 2**16 + 1, nonfinite=True, seed=k)


@backends_param
@pytest.mark.parametrize("block", BLOCKS)
def test_decompress_sum_int8_blocks(backend, block):
    _test_decompress_sum(backend, torch.int8, 3, 4 * block + 3, block=block, seed=block)
    _test_decompress_sum(backend, torch.int8, 2, 2 * block - 1, block=block, nonfinite=True, seed=block)


@backends_param
@pytest.mark.parametrize("dtype", [torch.float16, torch.int8], ids=str)
def test_decompress_sum_big_bucket(backend, dtype):
    _test_decompress_sum(backend, dtype, 3, BIG, nonfinite=True, seed=4)


@backends_param
@pytest.mark.parametrize("dtype", PAYLOADS, ids=str)
def test_decompress_sum_of_zeros_is_plus_zero(backend, dtype):
    # -0.0 copies (fp16/bf16) and zero codes and scales (int8) sum to +0.0 in every bit
    payloads = torch.full((3, 300), -0.0 if dtype != torch.int8 else 0, dtype=dtype, device=backend)
    scales = torch.zeros(3, ref.nblocks(300, 256), device=backend) if dtype == torch.int8 else None
    out = torch.full((300,), 7.0, device=backend)
    assert ops.decompress_sum_(payloads, out, 0.5, scales=scales, block=256) is False
    assert torch.equal(bits(out), bits(torch.zeros(300))), "a sum of zeros is not +0.0"


# ---------------------------------------------------------------------------------------------
# reduce_compress_ef_: decompress_sum_(.., 1.0) then compress_ef_, fused


def owner_residual(m: int, seed: int) -> torch.Tensor:
    """An owner's residual from earlier steps: small, non-zero, -0.0 at element 0."""
    residual = torch.randn(m, generator=torch.Generator().manual_seed(seed)) * 2.0**-12
    residual[:1] = -0.0
    return residual


def _test_reduce_compress_ef_on(device: torch.device, payloads: torch.Tensor, scales: torch.Tensor | None,
                                residual: torch.Tensor, weight: float, block: int = 512) -> bool:
    """reduce_compress_ef_ on device against the reference (CPU copies), and against the two ops
    it fuses run on the same backend; returns its answer."""
    m, dtype = payloads.shape[1], payloads.dtype
    nb = ref.nblocks(m, block) if dtype == torch.int8 else 0

    def outputs():
        return (residual.clone().to(device), torch.empty(m, dtype=dtype, device=device),
                torch.full((nb,), 5.0, device=device) if dtype == torch.int8 else None)

    exp_residual, exp_payload, exp_scales = (residual.clone(), torch.empty(m, dtype=dtype),
                                             torch.empty(nb) if dtype == torch.int8 else None)
    exp_flag = ref.reference_reduce_compress_ef_(payloads, exp_residual, exp_payload, weight, in_scales=scales,
                                                 out_scales=exp_scales, block=block)
    p, s = payloads.to(device), None if scales is None else scales.to(device)
    r, out, out_scales = outputs()
    flag = ops.reduce_compress_ef_(p, r, out, weight, in_scales=s, out_scales=out_scales, block=block)
    assert flag is exp_flag, f"the non-finite flag is {flag}, the reference says {exp_flag}"
    assert torch.equal(bits(p), bits(payloads)), "reduce_compress_ef_ changed the copies"
    assert_same(out, exp_payload, "out_payload")
    assert_same(r, exp_residual, "residual")
    if scales is not None:
        assert_same(out_scales, exp_scales, "out_scales")
    # the bits of the two ops it replaces, on this same backend
    r2, out2, out_scales2 = outputs()
    total = torch.empty(m, device=device)
    summed_bad = ops.decompress_sum_(p, total, 1.0, scales=s, block=block)
    encoded_bad = ops.compress_ef_(total, r2, out2, weight, scales=out_scales2, block=block)
    assert flag is (summed_bad or encoded_bad)
    assert_same(out, out2, "out_payload vs decompress_sum_ + compress_ef_")
    assert_same(r, r2, "residual vs decompress_sum_ + compress_ef_")
    if scales is not None:
        assert_same(out_scales, out_scales2, "out_scales vs decompress_sum_ + compress_ef_")
    return flag


def _test_reduce_compress_ef(device: torch.device, dtype: torch.dtype, k: int, m: int, block: int = 512,
                             nonfinite: bool = False, seed: int = 0) -> None:
    payloads, scales = copies(dtype, k, m, block, seed)
    if dtype != torch.int8:
        payloads[:, 0] = -0.0
    if nonfinite:
        make_nonfinite(payloads, scales)
    flag = _test_reduce_compress_ef_on(device, payloads, scales, owner_residual(m, seed), 1.0 / k, block)
    assert flag is nonfinite, f"the non-finite flag is {flag}, the copies hold NaN/Inf: {nonfinite}"


@backends_param
@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", PAYLOADS, ids=str)
def test_reduce_compress_ef(backend, dtype, k, m):
    _test_reduce_compress_ef(backend, dtype, k, m, seed=k * m + 1)


@backends_param
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("dtype", PAYLOADS, ids=str)
def test_reduce_compress_ef_flags_nan_and_inf(backend, dtype, k):
    _test_reduce_compress_ef(backend, dtype, k, 5000, nonfinite=True, seed=k)


@backends_param
@pytest.mark.parametrize("block", BLOCKS)
def test_reduce_compress_ef_int8_blocks(backend, block):
    _test_reduce_compress_ef(backend, torch.int8, 3, 4 * block + 3, block=block, seed=block)
    _test_reduce_compress_ef(backend, torch.int8, 2, 2 * block - 1, block=block, nonfinite=True, seed=block)


@backends_param
@pytest.mark.parametrize("dtype", [torch.float16, torch.int8], ids=str)
def test_reduce_compress_ef_big_bucket(backend, dtype):
    _test_reduce_compress_ef(backend, dtype, 3, BIG, nonfinite=True, seed=4)


@backends_param
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_reduce_compress_ef_sums_past_the_format_and_subnormals(backend, dtype):
    """Two copies whose sum overflows the format (fp16: each at 65504; bf16: past float32's range
    too) are flagged with residual 0; subnormal copies and -0.0 copies re-encode as compress_ef_
    would encode their sum."""
    k, m = 2, 3000
    payloads, _ = copies(dtype, k, m, 512, seed=9)
    largest = torch.finfo(dtype).max
    payloads[:, 100:104] = torch.tensor([largest, -largest, largest, largest]).to(dtype)
    tiny = torch.finfo(dtype).smallest_normal
    payloads[:, 200:264] = (torch.arange(64) * tiny / 64).to(dtype)  # subnormals of the format
    payloads[:, 300:310] = -0.0
    residual = owner_residual(m, seed=9)
    residual[200:232] = 0.0  # x is the subnormal sum itself there
    for weight in (1.0, 0.75):  # fp16: 2 * 65504 * 0.75 is still past 65520
        assert _test_reduce_compress_ef_on(backend, payloads, None, residual, weight) is True


@backends_param
def test_reduce_compress_ef_int8_zero_and_tiny_blocks(backend):
    """A block whose copies are all zero codes (and residual 0) gets scale 0 and codes 0, never
    NaN; a block whose copies have scale 0, or subnormal scales, re-encodes its residual."""
    k, m, block = 3, 4 * 256 + 5, 256
    payloads, scales = copies(torch.int8, k, m, block, seed=11)
    residual = owner_residual(m, seed=11)
    payloads[:, :256], residual[:256] = 0, 0.0
    scales[:, 1] = 0.0
    scales[:, 2] = 1e-40
    assert _test_reduce_compress_ef_on(backend, payloads, scales, residual, 1.0 / k, block) is False
    out, out_scales = torch.empty(m, dtype=torch.int8), torch.empty(5)
    ref.reference_reduce_compress_ef_(payloads, residual.clone(), out, 1.0 / k, scales, out_scales, block)
    assert out_scales[0] == 0 and torch.all(out[:256] == 0)


# ---------------------------------------------------------------------------------------------
# Bad calls: a ValueError with one sentence, from every backend alike (checked before dispatch)


def z(*shape, dtype=torch.float32, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


F16, BF16, I8 = torch.float16, torch.bfloat16, torch.int8
COMPRESS, DECOMPRESS, SUM, OWNER = ops.compress_ef_, ops.decompress_avg_, ops.decompress_sum_, ops.reduce_compress_ef_
BAD_CALLS = {  # case: (op, args, kwargs, words the message must hold)
    "grad float64": (COMPRESS, (z(8, dtype=torch.float64), z(8), z(8, dtype=F16), 1.0), {}, "grad is torch.float64"),
    "residual shorter": (COMPRESS, (z(8), z(7), z(8, dtype=F16), 1.0), {}, "residual has 7 elements"),
    "payload float32": (COMPRESS, (z(8), z(8), z(8), 1.0), {}, "payload is torch.float32"),
    "payload shorter": (COMPRESS, (z(8), z(8), z(6, dtype=BF16), 1.0), {}, "payload has 6"),
    "grad 2-D": (COMPRESS, (z(2, 4), z(8), z(8, dtype=F16), 1.0), {}, "flat 1-D"),
    "grad strided": (COMPRESS, (z(16)[::2], z(8), z(8, dtype=F16), 1.0), {}, "not contiguous"),
    "other device": (COMPRESS, (z(8), z(8, device="meta"), z(8, dtype=F16), 1.0), {}, "one device"),
    "int8 no scales": (COMPRESS, (z(8), z(8), z(8, dtype=I8), 1.0), {}, "needs scales"),
    "scales too long": (COMPRESS, (z(600), z(600), z(600, dtype=I8), 1.0), {"scales": z(3)}, "need shape (2,)"),
    "scales float16": (COMPRESS, (z(8), z(8), z(8, dtype=I8), 1.0), {"scales": z(1, dtype=F16)}, "is torch.float16"),
    "block 128": (COMPRESS, (z(8), z(8), z(8, dtype=I8), 1.0), {"scales": z(1), "block": 128}, "block is 128"),
    "block 2048": (COMPRESS, (z(8), z(8), z(8, dtype=I8), 1.0), {"scales": z(1), "block": 2048}, "256 to 1024"),
    "block float": (COMPRESS, (z(8), z(8), z(8, dtype=I8), 1.0), {"scales": z(1), "block": 512.0}, "block is 512.0"),
    "scales for fp16": (COMPRESS, (z(8), z(8), z(8, dtype=F16), 1.0), {"scales": z(1)}, "int8 payloads only"),
    "weight text": (COMPRESS, (z(8), z(8), z(8, dtype=F16), "heavy"), {}, "weight is 'heavy'"),
    "out float16": (DECOMPRESS, (z(8, dtype=F16), z(8, dtype=F16), 0.5), {}, "out is torch.float16"),
    "out shorter": (DECOMPRESS, (z(8, dtype=F16), z(4), 0.5), {}, "out has 4"),
    "payload int32": (DECOMPRESS, (z(8, dtype=torch.int32), z(8), 0.5), {}, "payload is torch.int32"),
    "decompress int8 no scales": (DECOMPRESS, (z(8, dtype=I8), z(8), 0.5), {}, "needs scales"),
    "payloads 1-D": (SUM, (z(8, dtype=F16), z(8), 0.5), {}, "2-D [ranks, elements]"),
    "payloads no ranks": (SUM, (z(0, 8, dtype=F16), z(8), 0.5), {}, "at least one rank's copy"),
    "payloads float32": (SUM, (z(2, 8), z(8), 0.5), {}, "payloads is torch.float32"),
    "payloads strided": (SUM, (z(2, 16, dtype=BF16)[:, ::2], z(8), 0.5), {}, "not contiguous"),
    "sum out float16": (SUM, (z(2, 8, dtype=F16), z(8, dtype=F16), 0.5), {}, "out is torch.float16"),
    "sum out shorter": (SUM, (z(2, 8, dtype=F16), z(7), 0.5), {}, "out has 7 elements but each row of payloads"),
    "sum other device": (SUM, (z(2, 8, dtype=F16), z(8, device="meta"), 0.5), {}, "one device"),
    "sum int8 no scales": (SUM, (z(2, 8, dtype=I8), z(8), 0.5), {}, "needs scales"),
    "sum scales 1-D": (SUM, (z(2, 8, dtype=I8), z(8), 0.5), {"scales": z(2)}, "2-D [ranks, elements]"),
    "sum scales one row": (SUM, (z(2, 8, dtype=I8), z(8), 0.5), {"scales": z(1, 1)}, "need shape (2, 1)"),
    "sum scales float16": (SUM, (z(2, 8, dtype=I8), z(8), 0.5), {"scales": z(2, 1, dtype=F16)}, "is torch.float16"),
    "sum scales for bf16": (SUM, (z(2, 8, dtype=BF16), z(8), 0.5), {"scales": z(2, 1)}, "int8 payloads only"),
    "sum block 2048": (SUM, (z(2, 8, dtype=I8), z(8), 0.5), {"scales": z(2, 1), "block": 2048}, "256 to 1024"),
    "sum inv_n text": (SUM, (z(2, 8, dtype=F16), z(8), "a third"), {}, "inv_n is 'a third'"),
    "owner payloads 1-D": (OWNER, (z(8, dtype=F16), z(8), z(8, dtype=F16), 0.5), {}, "2-D [ranks, elements]"),
    "owner no ranks": (OWNER, (z(0, 8, dtype=F16), z(8), z(8, dtype=F16), 0.5), {}, "at least one rank's copy"),
    "owner payloads float32": (OWNER, (z(2, 8), z(8), z(8, dtype=F16), 0.5), {}, "payloads is torch.float32"),
    "owner out other format": (OWNER, (z(2, 8, dtype=F16), z(8), z(8, dtype=BF16), 0.5), {},
                               "out_payload is torch.bfloat16 but payloads is torch.float16"),
    "owner residual float16": (OWNER, (z(2, 8, dtype=F16), z(8, dtype=F16), z(8, dtype=F16), 0.5), {},
                               "residual is torch.float16"),
    "owner residual shorter": (OWNER, (z(2, 8, dtype=F16), z(7), z(8, dtype=F16), 0.5), {},
                               "residual has 7 elements but each row of payloads"),
    "owner out shorter": (OWNER, (z(2, 8, dtype=F16), z(8), z(6, dtype=F16), 0.5), {}, "out_payload has 6"),
    "owner other device": (OWNER, (z(2, 8, dtype=F16), z(8, device="meta"), z(8, dtype=F16), 0.5), {}, "one device"),
    "owner no in_scales": (OWNER, (z(2, 8, dtype=I8), z(8), z(8, dtype=I8), 0.5), {"out_scales": z(1)},
                           "needs in_scales"),
    "owner no out_scales": (OWNER, (z(2, 8, dtype=I8), z(8), z(8, dtype=I8), 0.5), {"in_scales": z(2, 1)},
                            "needs out_scales"),
    "owner out_scales 2-D": (OWNER, (z(2, 8, dtype=I8), z(8), z(8, dtype=I8), 0.5),
                             {"in_scales": z(2, 1), "out_scales": z(2, 1)}, "flat 1-D"),
    "owner in_scales one row": (OWNER, (z(2, 8, dtype=I8), z(8), z(8, dtype=I8), 0.5),
                                {"in_scales": z(1, 1), "out_scales": z(1)}, "need shape (2, 1)"),
    "owner in_scales for fp16": (OWNER, (z(2, 8, dtype=F16), z(8), z(8, dtype=F16), 0.5), {"in_scales": z(2, 1)},
                                 "int8 payloads only"),
    "owner block 128": (OWNER, (z(2, 8, dtype=I8), z(8), z(8, dtype=I8), 0.5),
                        {"in_scales": z(2, 1), "out_scales": z(1), "block": 128}, "block is 128"),
    "owner weight text": (OWNER, (z(2, 8, dtype=F16), z(8), z(8, dtype=F16), "half"), {}, "weight is 'half'"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_call_is_a_value_error_sentence(case):
    op, args, kwargs, words = BAD_CALLS[case]
    with pytest.raises(ValueError) as error:
        op(*args, **kwargs)
    message = str(error.value)
    assert words in message, message
    assert message.endswith(".") and "\n" not in message and message.count(". ") == 0, message


# ---------------------------------------------------------------------------------------------
# Choosing the backend


def test_environment_forces_the_reference_on_cpu(monkeypatch):
    from transientvod.gradients.ops import cpu

    def numba_must_not_run(*args, **kwargs):
        raise AssertionError("the numba kernel ran although TRANSIENTVOD_KERNELS=torch")

    monkeypatch.setattr(cpu, "compress_ef_", numba_must_not_run)
    monkeypatch.setenv(ops.KERNELS_ENV, "torch")
    assert ops.backend_for("cpu")[0] == "torch"
    payload = torch.empty(10, dtype=torch.float16)
    assert ops.compress_ef_(torch.ones(10), torch.zeros(10), payload, 0.5) is False
    assert torch.all(payload == 0.5)
    monkeypatch.delenv(ops.KERNELS_ENV)  # read at every call: now numba's turn
    with pytest.raises(AssertionError, match="numba kernel ran"):
        ops.compress_ef_(torch.ones(10), torch.zeros(10), payload, 0.5)


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is absent")
def test_cpu_tensors_get_numba(monkeypatch):
    monkeypatch.delenv(ops.KERNELS_ENV, raising=False)
    backend, why = ops.backend_for(torch.device("cpu"))
    assert backend == "numba" and "numba" in why
    assert backend in ops.BACKENDS


@pytest.mark.skipif(HAS_CUDA, reason="checks the machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cupy"])
def test_cuda_override_without_cuda_is_one_runtime_error(monkeypatch, name):
    monkeypatch.setenv(ops.KERNELS_ENV, name)
    with pytest.raises(RuntimeError, match=f"{ops.KERNELS_ENV}={name} cannot be used: CUDA is not available") as error:
        ops.compress_ef_(torch.ones(4), torch.zeros(4), torch.empty(4, dtype=torch.float16), 1.0)
    assert "\n" not in str(error.value)
    monkeypatch.delenv(ops.KERNELS_ENV)
    backend, why = ops.backend_for("cuda")
    assert backend == "torch" and "CUDA" in why


def test_unknown_override_is_one_runtime_error(monkeypatch):
    monkeypatch.setenv(ops.KERNELS_ENV, "fortran")
    with pytest.raises(RuntimeError, match="names no kernel backend"):
        ops.backend_for("cpu")
    monkeypatch.setenv(ops.KERNELS_ENV, "numba")
    with pytest.raises(RuntimeError, match="CPU tensors"):
        ops.backend_for("meta")


# ---------------------------------------------------------------------------------------------
# flag=: OR into a caller's device flag instead of returning a bool (no wait on a GPU)


@backends_param
@pytest.mark.parametrize("payload_dtype", PAYLOADS, ids=str)
def test_flag_argument_ors_what_the_bool_would_say_and_returns_none(backend, payload_dtype):
    n, block = 3000, 512
    scaled = payload_dtype == torch.int8
    nb = -(-n // block)
    gen = torch.Generator().manual_seed(7)
    clean = torch.randn(n, generator=gen)
    dirty = clean.clone()
    dirty[1234] = float("nan")
    for grad, expected in ((clean, 0), (dirty, 1)):
        results, owner_answers = [], []
        for use_flag in (False, True):
            residual = torch.zeros(n, device=backend)
            payload = torch.empty(n, dtype=payload_dtype, device=backend)
            scales = torch.empty(nb, device=backend) if scaled else None
            flag = torch.zeros(1, dtype=torch.int32, device=backend) if use_flag else None
            said = ops.compress_ef_(grad.to(backend), residual, payload, WEIGHT, scales=scales, block=block, flag=flag)
            out = torch.empty(n, device=backend)
            said_avg = ops.decompress_avg_(payload, out, 0.5, scales=scales, block=block, flag=flag)
            total = torch.empty(n, device=backend)
            said_sum = ops.decompress_sum_(payload.reshape(1, n).repeat(2, 1), total, 0.5,
                                           scales=scales.reshape(1, nb).repeat(2, 1) if scaled else None,
                                           block=block, flag=flag)
            # the owner's op on two copies of the payload, with a flag of its own (an int8 payload
            # carries no NaN: its copies are clean)
            owner_payload = torch.empty(n, dtype=payload_dtype, device=backend)
            owner_carry = torch.ones(n, device=backend)
            owner_scales = torch.empty(nb, device=backend) if scaled else None
            owner_flag = torch.zeros(1, dtype=torch.int32, device=backend) if use_flag else None
            said_owner = ops.reduce_compress_ef_(payload.reshape(1, n).repeat(2, 1), owner_carry, owner_payload, 0.5,
                                                 in_scales=scales.reshape(1, nb).repeat(2, 1) if scaled else None,
                                                 out_scales=owner_scales, block=block, flag=owner_flag)
            if use_flag:
                assert (said, said_avg, said_sum, said_owner) == (None, None, None, None)
                assert flag.item() == expected, "the flag must say what the bools say"
                owner_answers.append(owner_flag.item())
            else:
                assert said is bool(expected)
                owner_answers.append(int(said_owner))
            results.append((residual.cpu(), payload.cpu(), out.cpu(), total.cpu(), owner_payload.cpu(),
                            owner_carry.cpu()) + (() if owner_scales is None else (owner_scales.cpu(),)))
        for with_bool, with_flag in zip(*results):
            assert_same(with_flag, with_bool, "the same results with flag=")
        assert owner_answers == [0 if scaled else expected] * 2, "reduce_compress_ef_'s flag must match its bool"


@backends_param
def test_flag_argument_keeps_a_set_flag_set(backend):
    """An OR: a clean op never clears what an earlier op set."""
    flag = torch.ones(1, dtype=torch.int32, device=backend)
    payload = torch.zeros(600, dtype=torch.float16, device=backend)
    assert ops.decompress_avg_(payload, torch.empty(600, device=backend), 1.0, flag=flag) is None
    assert flag.item() == 1


@pytest.mark.parametrize("flag, message", [
    (torch.zeros(1), "flag is torch.float32; it must be torch.int32."),
    (torch.zeros(2, dtype=torch.int32), "flag has 2 elements; it must be one int32, zeroed by the caller."),
    (True, "flag is a bool; it must be a torch.Tensor."),
    (torch.zeros(1, dtype=torch.int32, device="meta"),
     "flag is on meta but payload is on cpu; all tensors of one call must be on one device."),
], ids=["float32", "two", "python-bool", "other-device"])
def test_a_bad_flag_is_one_sentence(flag, message):
    payload = torch.zeros(8, dtype=torch.float16)
    with pytest.raises(ValueError) as raised:
        ops.decompress_avg_(payload, torch.empty(8), 1.0, flag=flag)
    assert str(raised.value) == message
