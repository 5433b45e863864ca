"""What packing one bucket's collectives costs as the ring grows: by runs of equal segments
(codecs/packing.py) against one copy per segment, side by side in one process.

    .venv/bin/python benchmarks/packing.py [--worlds 4,16,64,256] [--reps 7]

One bucket (131,149 elements: BUCKET_ELEMENTS and a remainder, so shards differ in size and
int8's last block is short), split among N owners as the protocol splits it (ShardLayout).
Per N and payload, the three packings of one step: the shards to their owners (phase 1),
an owner's copies of its reduced shard (phase 2), and the owners' segments back into scales,
flags and one payload (phase 3). "per segment" writes and reads each segment with its own
slice copies, the plain way, as packing did before runs. Only int8 packs side rows now
(codecs/framing.py: fp16 and bf16 send their payload alone); fp16 stands for a 2-byte payload. Each variant takes the best of
--reps rounds of 200 calls, the rounds interleaved, warm (one process, one thread).

Goal: packing by runs costs the same at N = 256 as at N = 4 (within 1.5x), where one copy
per segment grows with N.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transientvod.gradients.codecs import ShardLayout  # noqa: E402
from transientvod.gradients.codecs.packing import (SegmentLayout, pack_copies, pack_shards,  # noqa: E402
                                         segment_bytes, unpack_segments)
from transientvod.gradients.staleness import BUCKET_ELEMENTS  # noqa: E402

NUMEL = BUCKET_ELEMENTS + 77
BLOCK = 512
CALLS = 200
GOAL_GROWTH = 1.5
PAYLOADS = {"fp16": (torch.float16, False), "int8": (torch.int8, True)}


def per_segment_pack(scales: list[torch.Tensor], flag: torch.Tensor, payloads: list[torch.Tensor]) -> torch.Tensor:
    sizes = [segment_bytes(s.numel() + 1, p.numel(), p.element_size()) for s, p in zip(scales, payloads)]
    buffer = torch.zeros(sum(sizes), dtype=torch.uint8)
    at = 0
    for own_scales, payload, size in zip(scales, payloads, sizes):
        side = torch.cat((own_scales, flag)).view(torch.uint8)
        body = payload.view(torch.uint8)
        buffer[at:at + side.numel()] = side
        buffer[at + side.numel():at + side.numel() + body.numel()] = body
        at += size
    return buffer


def per_segment_unpack(buffer: torch.Tensor, shards: ShardLayout, dtype: torch.dtype):
    sides, payloads, at = [], [], 0
    for count, elements in zip(shards.scales, shards.elements):
        side_bytes, payload_bytes = 4 * (count + 1), elements * dtype.itemsize
        sides.append(buffer[at:at + side_bytes].view(torch.float32))
        payloads.append(buffer[at + side_bytes:at + side_bytes + payload_bytes])
        at += segment_bytes(count + 1, elements, dtype.itemsize)
    return (torch.cat([side[:-1] for side in sides]), torch.stack([side[-1] for side in sides]),
            torch.cat(payloads).view(dtype))


def variants(world: int, dtype: torch.dtype, scaled: bool) -> dict:
    shards = ShardLayout.of(NUMEL, world, BLOCK, scaled)
    payload = torch.randn(NUMEL).to(dtype) if dtype != torch.int8 else torch.randint(-127, 128, (NUMEL,), dtype=dtype)
    scales = torch.rand(sum(shards.scales))
    flag = torch.zeros(1)
    mine, my_scales = shards.elements[0], shards.scales[0]
    reduced, reduced_scales = payload[:mine].clone(), scales[:my_scales].clone()
    layout = SegmentLayout(shards.scales, shards.elements, dtype.itemsize)
    copies = SegmentLayout([my_scales] * world, [mine] * world, dtype.itemsize)
    scale_parts = list(torch.split(scales, shards.scales)) if scaled else [flag[:0]] * world
    payload_parts = list(torch.split(payload, shards.elements))
    received = pack_shards(layout, scales if scaled else None, flag, payload)
    if not torch.equal(received, per_segment_pack(scale_parts, flag, payload_parts)):
        raise SystemExit(f"packing: runs and per-segment packing differ at N = {world}; fix packing.py first.")

    def by_runs():
        pack_shards(layout, scales if scaled else None, flag, payload)
        pack_copies(copies, reduced_scales if scaled else None, flag, reduced)
        unpack_segments(received, layout, dtype)

    def by_segment():
        per_segment_pack(scale_parts, flag, payload_parts)
        per_segment_pack([reduced_scales if scaled else flag[:0]] * world, flag, [reduced] * world)
        per_segment_unpack(received, shards, dtype)
    return {"by runs": by_runs, "per segment": by_segment}


def best_microseconds(functions: dict, reps: int) -> dict:
    best = {name: float("inf") for name in functions}
    for function in functions.values():
        function()  # warm
    for _ in range(reps):
        for name, function in functions.items():
            began = time.perf_counter()
            for _ in range(CALLS):
                function()
            best[name] = min(best[name], (time.perf_counter() - began) / CALLS * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="4,16,64,256", help="ring sizes N, comma-separated")
    parser.add_argument("--reps", type=int, default=7, help="interleaved rounds; the best is kept")
    args = parser.parse_args()
    try:
        worlds = [int(w) for w in args.worlds.split(",")]
    except ValueError:
        parser.error(f"--worlds is {args.worlds!r}; give ring sizes as whole numbers, e.g. 4,16,64.")
    if any(w < 2 for w in worlds) or args.reps < 1:
        parser.error("every ring size in --worlds must be at least 2, and --reps at least 1.")
    torch.set_num_threads(1)
    print(f"one bucket of {NUMEL:,} elements; µs per step's three packings, best of {args.reps} x {CALLS} calls")
    print(f"{'payload':8} {'N':>4} {'by runs':>9} {'per segment':>12} {'ratio':>6}")
    results = {}
    for name, (dtype, scaled) in PAYLOADS.items():
        for world in worlds:
            best = best_microseconds(variants(world, dtype, scaled), args.reps)
            results[(name, world)] = best
            print(f"{name:8} {world:4} {best['by runs']:9.1f} {best['per segment']:12.1f} "
                  f"{best['per segment'] / best['by runs']:6.2f}", flush=True)
    for name in PAYLOADS:
        first, last = results[(name, worlds[0])], results[(name, worlds[-1])]
        for variant in ("by runs", "per segment"):
            growth = last[variant] / first[variant]
            verdict = (f"{'met' if growth <= GOAL_GROWTH else 'NOT MET'}: at most {GOAL_GROWTH}x"
                       if variant == "by runs" else "for comparison")
            print(f"{name} {variant}: N = {worlds[-1]} costs {growth:.2f}x N = {worlds[0]} ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
