"""What a collective's wait costs: Horovod 0.28.1's yielding loop against our build's sleeping
`hvd.synchronize` and transientvod's own poll (horovod_wait.wait), side by side in one job.

    .venv/bin/python benchmarks/wait_latency.py [--ops 1000] [--rounds 3]

Two ranks on this host through `horovodrun`, each running back-to-back allreduces (a 1-float
tensor and a 256 K-float one, 1 MB) and waiting for each in three ways:
- yield loop: `hvd.poll` and `os.sched_yield()` until done, what Horovod 0.28.1's
  `synchronize` does in C++ (`WaitAndClear`);
- synchronize: `hvd.synchronize`, which our build (launch/horovod-0.28.1-transient.patch)
  makes sleep 0.5 ms between polls;
- horovod_wait: transientvod's poll with a 0.5 ms sleep.
The ways take turns, --rounds times, so drift on a shared machine falls on all of them. Rank 0
prints, per way and size, the median and mean microseconds per op and the CPU
milliseconds its process (every thread) spent per op, and each mean's ratio to the yield loop's.
Goal: a sleeping wait adds at most its 0.5 ms poll interval to an op's latency, while it
costs less CPU per op than the yield loop.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from local_job import REPO, print_rows, run_worker_job

SIZES = {"1 float": 1, "1 MB": 256 * 1024}
WAYS = ("yield loop", "synchronize", "horovod_wait")


def worker(ops: int, rounds: int) -> None:
    import torch

    import horovod.torch as hvd

    sys.path.insert(0, str(REPO))
    from transientvod.gradients.horovod_wait import wait

    def yield_loop(handle):
        while not hvd.poll(handle):
            os.sched_yield()
        return hvd.synchronize(handle)

    waits = {"yield loop": yield_loop, "synchronize": hvd.synchronize, "horovod_wait": lambda h: wait([h])[0]}
    hvd.init()
    torch.set_num_threads(1)
    samples = {(way, size): [] for way in WAYS for size in SIZES}
    cpu = {(way, size): 0.0 for way in WAYS for size in SIZES}
    for size_name, numel in SIZES.items():
        tensor = torch.ones(numel)
        for _ in range(10):  # the ring and the response cache are ready
            hvd.allreduce(tensor, name=f"warm {size_name}")
        for _ in range(rounds):
            for way in WAYS:
                started_cpu = time.process_time()
                for i in range(ops):
                    start = time.perf_counter()
                    waits[way](hvd.allreduce_async(tensor, name=f"{way} {size_name}"))
                    samples[(way, size_name)].append(time.perf_counter() - start)
                cpu[(way, size_name)] += time.process_time() - started_cpu
    if hvd.rank() == 0:
        rows = [{"way": way, "size": size, "median_us": statistics.median(samples[(way, size)]) * 1e6,
                 "mean_us": statistics.fmean(samples[(way, size)]) * 1e6,
                 "cpu_ms_per_op": cpu[(way, size)] / len(samples[(way, size)]) * 1e3}
                for size in SIZES for way in WAYS]
        print_rows(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000, help="allreduces per way, size and round")
    parser.add_argument("--rounds", type=int, default=3, help="turns each way takes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ops < 1 or args.rounds < 1:
        parser.error("--ops and --rounds must be at least 1.")
    if args.worker:
        worker(args.ops, args.rounds)
        return 0
    print(f"2 ranks on this host, {args.ops} allreduces per way, size and round, {args.rounds} rounds", flush=True)
    rows = run_worker_job(__file__, 2, ["--ops", str(args.ops), "--rounds", str(args.rounds)])
    if rows is None:
        return 1
    base = {row["size"]: row for row in rows if row["way"] == "yield loop"}
    print(f"{'size':8} {'way':13} {'median us':>10} {'mean us':>9} {'CPU ms/op':>10} {'mean/yield':>11} {'CPU/yield':>10}")
    for row in rows:
        ref = base[row["size"]]
        print(f"{row['size']:8} {row['way']:13} {row['median_us']:10.0f} {row['mean_us']:9.0f} "
              f"{row['cpu_ms_per_op']:10.3f} {row['mean_us'] / ref['mean_us']:11.2f} "
              f"{row['cpu_ms_per_op'] / ref['cpu_ms_per_op']:10.2f}")
    for row in rows:
        if row["way"] == "yield loop":
            continue
        ref = base[row["size"]]
        added = row["mean_us"] - ref["mean_us"]
        print(f"{row['size']:8} {row['way']:13} adds {added:6.0f} us per op to the yield loop's mean "
              f"({'met' if added <= 500 else 'NOT MET'}: at most 500), CPU per op "
              f"{'lower' if row['cpu_ms_per_op'] < ref['cpu_ms_per_op'] else 'NOT lower'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
