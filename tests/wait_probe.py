"""Run by tests/test_horovod_wait.py under `horovodrun -np 2`: prints one JSON line per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/wait_probe.py

Rank 0 joins each collective LATE_SECONDS late; rank 1 waits for it three ways and reports
the CPU seconds its process (every thread) spent per second of each wait:
- spin: Horovod's own `synchronize` (the control: it spins);
- wait: horovod_wait.wait on an async allreduce;
- optimizer: hvd.DistributedOptimizer's allreduces, started by backward's hooks, waited for
  with horovod_wait.wait_for_distributed_optimizer before its step().
Each rank also reports what it received, so the test checks the results as well.
"""
from __future__ import annotations

import json
import time

import torch

import horovod.torch as hvd

from transientvod.horovod_wait import wait, wait_for_distributed_optimizer

LATE_SECONDS = 2.0


def timed(fn):
    """(fn's result, CPU seconds per wall second while it ran)."""
    wall, cpu = time.monotonic(), time.process_time()
    result = fn()
    return result, (time.process_time() - cpu) / (time.monotonic() - wall)


def late():
    if hvd.rank() == 0:
        time.sleep(LATE_SECONDS)


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    hvd.allreduce(torch.zeros(1), name="warm-up")  # the ring and the response cache are ready
    mine = torch.full((1000,), float(hvd.rank() + 1))
    report = {"rank": hvd.rank()}

    late()
    spun, report["spin_cpu"] = timed(lambda: hvd.synchronize(hvd.allreduce_async(mine, name="spin", op=hvd.Sum)))
    late()
    waited, report["wait_cpu"] = timed(lambda: wait([hvd.allreduce_async(mine, name="wait", op=hvd.Sum)])[0])
    report["sums"] = [spun[0].item(), waited[0].item()]

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                         named_parameters=model.named_parameters())
    late()
    model(torch.full((1, 4), float(hvd.rank() + 1))).sum().backward()  # grad = the input
    _, report["optimizer_cpu"] = timed(lambda: wait_for_distributed_optimizer(optimizer))
    before = model.weight.detach().clone()
    optimizer.step()
    report["optimizer_update"] = (before - model.weight.detach()).flatten().tolist()  # lr 1: the average
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
