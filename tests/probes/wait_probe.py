"""Run by tests/gradients/test_horovod_wait.py under `horovodrun -np 2`: prints one JSON line per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/probes/wait_probe.py

Rank 0 joins each collective LATE_SECONDS late; rank 1 waits for it in every way the job
waits, and reports the CPU seconds its process (every thread) spent per second of each wait:
- busy: a Python loop that never waits (the control: what a spinning waiter would cost on
  this machine at this moment);
- idle: both ranks asleep (the floor: Horovod's background thread coordinates with its peers
  every cycle, HOROVOD_CYCLE_TIME, whatever the rank's own thread does);
- synchronize, allreduce, broadcast_object: Horovod's own blocking calls (our build's
  `hvd.synchronize` sleeps between polls: launch/horovod-0.28.1-transient.patch);
- wait: horovod_wait.wait on an async allreduce;
- optimizer: hvd.DistributedOptimizer's allreduces, started by backward's hooks, waited for
  with horovod_wait.wait_for_distributed_optimizer before its step();
- evaluate: train.evaluate (a broadcast of rank 0's BatchNorm statistics, an allreduce of
  the counts);
- broadcast: horovod_wait.broadcast_parameters (the elastic state's extra broadcast);
- state_sync, commit: the elastic state's sync after a ring change (Horovod's TorchState.sync:
  model, optimizer and sampler broadcasts, then ours) and a commit's host-update check.
Each rank also reports what it received, so the test checks the results as well.
"""
from __future__ import annotations

import json
import time

import torch
from torch.utils.data import TensorDataset

import horovod.torch as hvd

from transientvod.gradients.horovod_wait import broadcast_parameters, wait, wait_for_distributed_optimizer
from transientvod.tasks.resnet.data import Dataset
from transientvod.worker.commit import CommitPolicy
from transientvod.worker.evaluation import count_correct, evaluate
from transientvod.worker.schedule import LearningRateRule
from transientvod.worker.state import ShardSampler, TransientState

LATE_SECONDS = 2.0


def timed(fn):
    """(fn's result, CPU seconds per wall second while it ran)."""
    wall, cpu = time.monotonic(), time.process_time()
    result = fn()
    return result, (time.process_time() - cpu) / (time.monotonic() - wall)


def late():
    if hvd.rank() == 0:
        time.sleep(LATE_SECONDS)


def busy_loop(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    hvd.allreduce(torch.zeros(1), name="warm-up")  # the ring and the response cache are ready
    mine = torch.full((1000,), float(hvd.rank() + 1))
    report = {"rank": hvd.rank()}

    _, report["busy_cpu"] = timed(lambda: busy_loop(LATE_SECONDS))
    _, report["idle_cpu"] = timed(lambda: time.sleep(LATE_SECONDS))
    late()
    synced, report["synchronize_cpu"] = timed(
        lambda: hvd.synchronize(hvd.allreduce_async(mine, name="synchronize", op=hvd.Sum)))
    late()
    reduced, report["allreduce_cpu"] = timed(lambda: hvd.allreduce(mine, name="allreduce", op=hvd.Sum))
    late()
    waited, report["wait_cpu"] = timed(lambda: wait([hvd.allreduce_async(mine, name="wait", op=hvd.Sum)])[0])
    report["sums"] = [synced[0].item(), reduced[0].item(), waited[0].item()]
    late()
    report["object"], report["broadcast_object_cpu"] = timed(
        lambda: hvd.broadcast_object({"from rank": hvd.rank()}, root_rank=0, name="object"))

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

    # The same weights on every rank, but each rank's own BatchNorm statistics: evaluate must
    # score rank 0's model on every rank.
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                              torch.nn.Linear(8, 2))
    net(torch.randn(64, 1, 2, 2) * (1 + 3 * hvd.rank()) + hvd.rank())
    images, labels = torch.randn(200, 1, 2, 2), torch.randint(0, 2, (200,))
    data = Dataset("probe", images, labels, images, labels, num_classes=2)
    if hvd.rank() == 0:
        report["rank0_alone"] = count_correct(net, images, labels, torch.device("cpu")) / len(labels)
    late()
    test_set = TensorDataset(data.test_x, data.test_y)
    report["accuracy"], report["evaluate_cpu"] = timed(
        lambda: evaluate(net, test_set, torch.device("cpu"))["test_accuracy"])

    state = {"b": torch.full((1000,), float(hvd.rank() + 1)), "a": torch.arange(3) * (hvd.rank() + 1)}
    late()
    _, report["broadcast_cpu"] = timed(lambda: broadcast_parameters(state, root_rank=0))
    report["broadcast"] = [state["a"].tolist(), state["b"].unique().tolist()]

    # The elastic state as train.py builds it, each rank's different: sync gives every rank
    # rank 0's model, optimizer state and attributes.
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if hvd.rank() == 0:  # rank 0 has momentum; a new rank's optimizer has none yet
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
    sampler = ShardSampler(list(range(100)), shuffle=True, seed=0)
    elastic = TransientState(model, optimizer, sampler, LearningRateRule(0.1, "linear", 0, "constant", 100),
                             CommitPolicy(10, 10, 100))
    elastic.step = 7 * (hvd.rank() + 1)
    elastic.save()
    late()
    _, report["state_sync_cpu"] = timed(elastic.sync)
    report["state"] = {"step": elastic.step, "weight": model.weight.sum().item(),
                       "momentum": sum(s["momentum_buffer"].sum().item() for s in optimizer.state.values())}
    late()
    _, report["commit_cpu"] = timed(elastic.commit)  # no host update: the check's broadcast, no interrupt
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
