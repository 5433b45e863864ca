"""How fast the fused compression ops run, beside the memory bandwidth that bounds them.

    .venv/bin/python benchmarks/kernels.py                      # CPU: numba kernels, 1M 16M 64M
    .venv/bin/python benchmarks/kernels.py --sizes 16M --reps 9
    .venv/bin/python benchmarks/kernels.py --device cuda        # the CUDA kernels (a GPU host)

Each op is a pass over memory, so the yardstick is the STREAM triad (a = b + s * c) run in the
same process on buckets of the same size: by a numba parallel kernel, and by
`torch.add(b, c, alpha=s, out=a)`; on CUDA a device-to-device copy. Bandwidth counts the
ideal bytes (each array read or written once, as the op needs it; write-allocate traffic not
counted): compress fp16/bf16 14 B per element (grad 4 + residual 4 in, payload 2 + residual 4
out), int8 13 B + 4 per block, decompress fp16/bf16 6 B, int8 5 B, decompress_sum_ of k = 3
copies of m elements k * 2 + 4 = 10 B per summed element (int8: k * 1 + 4 = 7 B, and k * 4 per
block), reduce_compress_ef_ (the owner's sum re-encoded: k copies in, residual 4 in and 4 out,
payload out) k * 2 + 10 = 16 B per summed element (int8: k * 1 + 9 = 12 B, and (k + 1) * 4 per
block), the triad 12 B, a copy 8 B. "eager" is the same math as separate PyTorch ops
(mul, add, to(fp16), to(fp32), sub: a temporary per op and no non-finite check); for int8 it
is the plain-PyTorch reference; for decompress_sum_ it is what the op replaced, a
decompress_avg_ (fused) of each copy into a scratch row added to a zeroed total; for
reduce_compress_ef_ the two fused ops it replaced, decompress_sum_ into an fp32 total, then
compress_ef_ of it (10 + 14 = 24 B per summed element for fp16, 7 + 13 = 20 B for int8). The reps of
all variants of one row are interleaved and the best of each is kept, so a noisy neighbour on
the machine slows them alike.

Goals at 16M elements on CPU: the fused fp16/bf16 compression reaches >= 0.7x the numba
triad's bandwidth and runs >= 4x faster than eager PyTorch.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transientvod.gradients import ops  # noqa: E402
from transientvod.gradients.ops import reference  # noqa: E402

GOAL_SIZE = 16 << 20
GOAL_TRIAD_RATIO = 0.7
GOAL_EAGER_SPEEDUP = 4.0
BLOCK = 512
RANKS = 3


def numba_triad():
    from numba import njit, prange

    @njit(parallel=True)
    def triad(a, b, c, s):
        for i in prange(a.shape[0]):
            a[i] = b[i] + s * c[i]

    return triad


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def label(n: int) -> str:
    return f"{n >> 20}M" if n % (1 << 20) == 0 else str(n)


class Timer:
    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def best(self, variants: dict, reps: int) -> dict:
        """Best seconds of each variant; one warm-up call each (JIT), then reps interleaved."""
        for fn in variants.values():
            fn()
        self.sync()
        best = {name: float("inf") for name in variants}
        for _ in range(reps):
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                self.sync()
                best[name] = min(best[name], time.perf_counter() - start)
        return best


def eager_compress(grad, residual, payload, weight):
    x = grad * weight + residual
    payload.copy_(x)
    torch.sub(x, payload.float(), out=residual)


def eager_decompress(payload, out, inv_n):
    torch.mul(payload.float(), inv_n, out=out)


def measure(n: int, device: torch.device, reps: int, triad) -> list[dict]:
    timer = Timer(device)
    gen = torch.Generator().manual_seed(n)
    grad = torch.randn(n, generator=gen).to(device)
    residual = (torch.randn(n, generator=gen) * 1e-3).to(device)
    rows = []

    # The yardsticks, on the very buffers the ops read (b, c) and one as large as they write (a).
    a, b, c = torch.empty(n, device=device), grad, residual
    if device.type == "cuda":
        yard = timer.best({"copy": lambda: a.copy_(b)}, reps)
        yard_name, yard_gbs = "d2d copy", 8 * n / yard["copy"] / 1e9
        rows.append({"op": "device-to-device copy", "bytes": 8, "fused": yard["copy"]})
    else:
        an, bn, cn, s = a.numpy(), b.numpy(), c.numpy(), np.float32(0.5)
        yard = timer.best({"numba": lambda: triad(an, bn, cn, s),
                           "torch": lambda: torch.add(b, c, alpha=0.5, out=a)}, reps)
        yard_name, yard_gbs = "numba triad", 12 * n / yard["numba"] / 1e9
        rows.append({"op": "triad numba (a = b + s*c)", "bytes": 12, "fused": yard["numba"]})
        rows.append({"op": "triad torch.add(alpha=s)", "bytes": 12, "fused": yard["torch"]})
    del a, b, c

    out = torch.empty(n, device=device)
    for dtype, name in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        payload = torch.empty(n, dtype=dtype, device=device)
        t = timer.best({"fused": lambda: ops.compress_ef_(grad, residual, payload, 0.5),
                        "eager": lambda: eager_compress(grad, residual, payload, 0.5)}, reps)
        rows.append({"op": f"compress_ef_ {name}", "bytes": 14, "goal": True, **t})
        t = timer.best({"fused": lambda: ops.decompress_avg_(payload, out, 0.25),
                        "eager": lambda: eager_decompress(payload, out, 0.25)}, reps)
        rows.append({"op": f"decompress_avg_ {name}", "bytes": 6, **t})
        del payload

    q = torch.empty(n, dtype=torch.int8, device=device)
    scales = torch.empty(reference.nblocks(n, BLOCK), device=device)
    t = timer.best({"fused": lambda: ops.compress_ef_(grad, residual, q, 0.5, scales=scales, block=BLOCK),
                    "eager": lambda: reference.reference_compress_ef_(grad, residual, q, 0.5, scales=scales,
                                                                      block=BLOCK)}, max(2, reps // 2))
    rows.append({"op": f"compress_ef_ int8 (block {BLOCK})", "bytes": 13 + 4 / BLOCK, **t})
    t = timer.best({"fused": lambda: ops.decompress_avg_(q, out, 0.25, scales=scales, block=BLOCK),
                    "eager": lambda: reference.reference_decompress_avg_(q, out, 0.25, scales=scales,
                                                                        block=BLOCK)}, reps)
    rows.append({"op": "decompress_avg_ int8", "bytes": 5 + 4 / BLOCK, **t})
    del grad, residual, out

    rows += measure_sum(n, device, reps, timer, gen)
    rows += measure_owner(n, device, reps, timer, gen)
    for row in rows:
        row["n"], row["gbs"] = n, row["bytes"] * n / row["fused"] / 1e9
        row["yard"], row["yard_name"], row["yard_gbs"] = row["gbs"] / yard_gbs, yard_name, yard_gbs
    return rows


def composed_sum(payloads, total, copy, scales):
    """The owner's sum before decompress_sum_: a decompress_avg_ pass per copy, and an add."""
    total.zero_()
    for row in range(payloads.shape[0]):
        ops.decompress_avg_(payloads[row], copy, 1.0, scales=None if scales is None else scales[row], block=BLOCK)
        total.add_(copy)


def measure_sum(n: int, device: torch.device, reps: int, timer: Timer, gen: torch.Generator) -> list[dict]:
    """decompress_sum_ of RANKS copies of m = n // RANKS elements (n payload elements in all, as
    the other rows read), fp16 and int8. Its bytes are counted per payload element (n = RANKS * m):
    RANKS * m payload elements in, m float32 out."""
    m = n // RANKS
    total, copy = torch.empty(m, device=device), torch.empty(m, device=device)
    rows = []
    for dtype, name in ((torch.float16, "fp16"), (torch.int8, "int8")):
        if dtype == torch.int8:
            payloads = torch.randint(-127, 128, (RANKS, m), dtype=torch.int8, generator=gen).to(device)
            scales = torch.rand(RANKS, reference.nblocks(m, BLOCK), generator=gen).to(device)
            payload_bytes = 1 + 4 / BLOCK
        else:
            payloads = torch.randn(RANKS, m, generator=gen).to(dtype).to(device)
            scales, payload_bytes = None, 2
        t = timer.best({"fused": lambda: ops.decompress_sum_(payloads, total, 1.0, scales=scales, block=BLOCK),
                        "eager": lambda: composed_sum(payloads, total, copy, scales)}, reps)
        rows.append({"op": f"decompress_sum_ {name} k={RANKS}", "bytes": (RANKS * payload_bytes + 4) / RANKS, **t})
    return rows


def owner_copies(dtype: torch.dtype, m: int, device: torch.device, gen: torch.Generator):
    """RANKS copies of m elements as an owner receives them: payloads [RANKS, m], (int8) scales
    [RANKS, ceil(m / BLOCK)], and the bytes of one payload element (int8: with its share of a scale)."""
    if dtype == torch.int8:
        payloads = torch.randint(-127, 128, (RANKS, m), dtype=torch.int8, generator=gen).to(device)
        return payloads, torch.rand(RANKS, reference.nblocks(m, BLOCK), generator=gen).to(device), 1 + 4 / BLOCK
    return torch.randn(RANKS, m, generator=gen).to(dtype).to(device), None, 2


def measure_owner(n: int, device: torch.device, reps: int, timer: Timer, gen: torch.Generator) -> list[dict]:
    """reduce_compress_ef_ of RANKS copies of m = n // RANKS elements (as measure_sum) with a
    residual, against decompress_sum_ + compress_ef_, fp16 and int8. Bytes per payload element
    (n = RANKS * m): RANKS * m payload elements in, m residuals in and out, m payloads out."""
    m = n // RANKS
    residual, total = (torch.randn(m, generator=gen) * 1e-3).to(device), torch.empty(m, device=device)
    rows = []
    for dtype, name in ((torch.float16, "fp16"), (torch.int8, "int8")):
        payloads, scales, payload_bytes = owner_copies(dtype, m, device, gen)
        out = torch.empty(m, dtype=dtype, device=device)
        out_scales = torch.empty(reference.nblocks(m, BLOCK), device=device) if dtype == torch.int8 else None

        def fused():
            ops.reduce_compress_ef_(payloads, residual, out, 1 / RANKS, in_scales=scales, out_scales=out_scales,
                                    block=BLOCK)

        def two_ops():
            ops.decompress_sum_(payloads, total, 1.0, scales=scales, block=BLOCK)
            ops.compress_ef_(total, residual, out, 1 / RANKS, scales=out_scales, block=BLOCK)

        t = timer.best({"fused": fused, "eager": two_ops}, reps)
        rows.append({"op": f"reduce_compress_ef_ {name} k={RANKS}",
                     "bytes": (RANKS * payload_bytes + 8 + payload_bytes) / RANKS, **t})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1M,16M,64M", help="bucket sizes in float32 elements, e.g. 1M,16M")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per variant (best is kept)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device cuda: CUDA is not available to torch {torch.__version__} on this machine.")
    backend, why = ops.backend_for(device)
    triad = numba_triad() if device.type == "cpu" else None
    print(f"backend: {backend} ({why}); torch threads: {torch.get_num_threads()}; "
          f"sizes: {args.sizes}; best of {args.reps} after a warm-up")
    header = f"{'op':<34} {'size':>5} {'ms':>8} {'GB/s':>7} {'x yard':>7} {'eager ms':>9} {'speed-up':>8}"
    print(header)
    print("-" * len(header))
    verdicts = []
    for n in (parse_size(s) for s in args.sizes.split(",")):
        rows = measure(n, device, args.reps, triad)
        for row in rows:
            eager = f"{row['eager'] * 1e3:>9.2f} {row['eager'] / row['fused']:>7.1f}x" if "eager" in row else ""
            print(f"{row['op']:<34} {label(n):>5} {row['fused'] * 1e3:>8.2f} {row['gbs']:>7.1f} "
                  f"{row['yard']:>6.2f}x {eager}")
            if row.get("goal") and n == GOAL_SIZE and device.type == "cpu":
                speedup = row["eager"] / row["fused"]
                met = row["yard"] >= GOAL_TRIAD_RATIO and speedup >= GOAL_EAGER_SPEEDUP
                verdicts.append(f"{row['op']} at {label(n)}: {row['yard']:.2f}x the {row['yard_name']} "
                                f"({row['yard_gbs']:.1f} GB/s; goal >= {GOAL_TRIAD_RATIO}x), {speedup:.1f}x eager "
                                f"(goal >= {GOAL_EAGER_SPEEDUP:.0f}x): {'met' if met else 'NOT met'}")
        print()
    print("'x yard' is the op's GB/s over the first yardstick row's (numba triad on CPU, copy on CUDA).")
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
