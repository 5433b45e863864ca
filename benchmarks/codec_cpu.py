"""What each codec costs in CPU on unshaped links, and how much of it the kernels alone take.

    .venv/bin/python benchmarks/codec_cpu.py [--ranks 4] [--steps 300] [--rounds 2] [--staleness 0]
                                             [--bucket-elements N]

One `horovodrun` job of --ranks ranks on this host (loopback, Gloo), training ResNet-32 on the
embedded digits (batch 16 a rank, torch and numba at one thread, as train.py gives workers
that share the cores). The codecs take turns, --rounds times, each on a fresh model and
exchange, so drift on a shared machine falls on all of them; `none` is Horovod's
DistributedOptimizer, as in training. Per codec, over its timed steps (after 20 warm-up):

- wall: ms a step, and the cost against `none`'s (the goal: at most 10 %);
- CPU: ms a step of each rank's process (every thread), the mean over ranks; of it, `main`
  on the thread that trains (the mean over ranks) and `others` on the rest (Horovod's
  background thread, Gloo's);
- rank 0's calling-thread CPU in the protocol's parts: the fused kernels (`transientvod.gradients.ops`:
  encode, the owner's sum, decode; with their argument checks), the packing into and out of
  the collectives' buffers (`codecs/framing.py`, `codecs/packing.py`), and starting the
  alltoalls (`Wire`);
- floor: the kernels' ms turned into wall time and set against `none`'s step. With R ranks
  on C cores (R > C) each rank has C / R of a core, so a ms of CPU on every rank costs about
  R / C ms of a step. So long as the kernels stay as they are, no change elsewhere in the
  protocol can bring a codec's cost below this.
The kernels are timed by wrapping the functions the protocol calls, in the worker only.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

from local_job import REPO, print_rows, run_worker_job

CODECS = ("none", "fp16", "bf16", "int8")
WARMUP_STEPS = 20
BATCH = 16
PARTS = ("kernels", "packing", "alltoall")


class CpuTally:
    """The calling thread's CPU seconds inside chosen functions, by part."""

    def __init__(self):
        self.seconds: collections.Counter[str] = collections.Counter()

    def wrap(self, owner, attribute: str, part: str) -> None:
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            began = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[part] += time.thread_time() - began
        setattr(owner, attribute, timed)


def worker(steps: int, rounds: int, staleness: int, bucket_elements: int | None) -> None:
    sys.path.insert(0, str(REPO))
    import numba
    import torch

    import horovod.torch as hvd
    from transientvod.gradients import ops
    from transientvod.gradients.codecs import framing, wire
    from transientvod.config.schema import DataConfig, ModelConfig
    from transientvod.tasks.resnet.data import load_dataset
    from transientvod.gradients.exchange import GradientExchange
    from transientvod.gradients.synchronous import SynchronousStep
    from transientvod.tasks.resnet.models import build_model

    hvd.init()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    tally = CpuTally()
    for name in ("compress_ef_", "decompress_sum_", "decompress_avg_"):
        tally.wrap(ops, name, "kernels")  # scatter_reduce calls them as ops.<name>
    for framing_class in (framing.Bare, framing.Framed):
        for name in ("to_owners", "at_owner", "to_everyone", "from_owners"):
            tally.wrap(framing_class, name, "packing")
    tally.wrap(wire.Wire, "alltoall", "alltoall")

    data = load_dataset(DataConfig(), seed=0)
    rank = hvd.rank()
    x, y = data.train_x[BATCH * rank:BATCH * (rank + 1)], data.train_y[BATCH * rank:BATCH * (rank + 1)]
    loss_fn = torch.nn.CrossEntropyLoss()
    totals = {codec: collections.Counter() for codec in CODECS}
    for turn in range(rounds):
        for codec in CODECS:
            torch.manual_seed(0)
            model = build_model(ModelConfig(), data.in_channels, data.num_classes)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
            if codec == "none" and staleness == 0:
                exchange = SynchronousStep(hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters()))
            else:
                exchange = GradientExchange(optimizer, model.parameters(), staleness=staleness, codec=codec,
                                            bucket_elements=bucket_elements, name=f"codec_cpu.{codec}.{turn}")
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            for step in range(WARMUP_STEPS + steps):
                if step == WARMUP_STEPS:
                    tally.seconds.clear()
                    cpu, main, wall = time.process_time(), time.thread_time(), time.perf_counter()
                exchange.zero_grad()
                loss_fn(model(x), y).backward()
                exchange.step(step)
            wall, cpu, main = time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - main
            exchange.drain()
            mean_cpu, mean_main = hvd.allreduce(torch.tensor([cpu, main], dtype=torch.float64), op=hvd.Average,
                                                name=f"codec_cpu.cpu.{codec}.{turn}").tolist()
            totals[codec].update({"wall": wall, "cpu": mean_cpu, "main": mean_main, **tally.seconds})
    if rank == 0:
        timed = steps * rounds
        rows = [{"codec": codec, **{part: 1e3 * totals[codec][part] / timed for part in ("wall", "cpu", "main", *PARTS)}}
                for codec in CODECS]
        print_rows(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4, help="ranks on this host")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per codec and round")
    parser.add_argument("--rounds", type=int, default=2, help="turns each codec takes")
    parser.add_argument("--staleness", type=int, default=0, help="the exchange's staleness s")
    parser.add_argument("--bucket-elements", type=int, default=None,
                        help="the exchange's bucket size in elements (default: the product's, by staleness)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ranks < 2 or args.steps < 1 or args.rounds < 1 or args.staleness < 0 or (
            args.bucket_elements is not None and args.bucket_elements < 1):
        parser.error("--ranks must be at least 2, --steps, --rounds and --bucket-elements at least 1, "
                     "--staleness at least 0.")
    if args.worker:
        worker(args.steps, args.rounds, args.staleness, args.bucket_elements)
        return 0
    cores = os.cpu_count() or 1
    buckets = "the default buckets" if args.bucket_elements is None else f"buckets of {args.bucket_elements} elements"
    print(f"{args.ranks} ranks on this host's {cores} cores, s = {args.staleness}, {buckets}, {args.steps} steps "
          f"per codec and round after {WARMUP_STEPS} warm-up, {args.rounds} rounds", flush=True)
    found = run_worker_job(__file__, args.ranks, ["--steps", str(args.steps), "--rounds", str(args.rounds),
                                                   "--staleness", str(args.staleness),
                                                   *(["--bucket-elements", str(args.bucket_elements)]
                                                     if args.bucket_elements is not None else [])])
    if found is None:
        return 1
    rows = {row["codec"]: row for row in found}
    base = rows["none"]
    wall_per_cpu_ms = max(1.0, args.ranks / cores)
    cost = {codec: 100 * (row["wall"] / base["wall"] - 1) for codec, row in rows.items()}
    floor = {codec: 100 * row["kernels"] * wall_per_cpu_ms / base["wall"] for codec, row in rows.items()}
    print(f"{'codec':6} {'wall ms':>8} {'cost':>7} {'CPU ms':>7} {'+CPU':>6} {'main':>6} {'others':>7} "
          f"{'kernels':>8} {'packing':>8} {'alltoall':>9} {'floor':>6}")
    for codec, row in rows.items():
        print(f"{codec:6} {row['wall']:8.2f} {cost[codec]:6.1f}% {row['cpu']:7.2f} {row['cpu'] - base['cpu']:6.2f} "
              f"{row['main']:6.2f} {row['cpu'] - row['main']:7.2f} "
              f"{row['kernels']:8.2f} {row['packing']:8.2f} {row['alltoall']:9.2f} {floor[codec]:5.1f}%")
    for codec in rows:
        if codec == "none":
            continue
        print(f"{codec}: costs {cost[codec]:.1f} % against none ({'met' if cost[codec] <= 10 else 'NOT MET'}: "
              f"at most 10 %); its kernels alone would cost about {floor[codec]:.1f} %"
              f"{' (over the goal whatever else changes)' if floor[codec] > 10 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
