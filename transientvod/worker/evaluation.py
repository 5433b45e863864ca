"""Evaluation on the test split, sharded: every rank scores its own slice and one allreduce
sums what they counted, so no rank waits for rank 0 to score the whole split alone.

A collective: every rank must call `evaluate` at the same step. A peer lost meanwhile raises
HorovodInternalError, which `hvd.elastic.run` recovers from like a failure in a training step.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, Subset

import horovod.torch as hvd

from transientvod.gradients.horovod_wait import wait
from transientvod.tasks import top1_correct
from transientvod.worker.batches import to_device


def evaluation_slice(total: int, rank: int, size: int) -> slice:
    """This rank's part of a split of `total` samples: contiguous, disjoint from every other
    rank's, all of them together the whole split; sizes differ by at most one."""
    return slice(total * rank // size, total * (rank + 1) // size)


@torch.no_grad()
def count_correct(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
                  batch_size: int = 512) -> int:
    """How many of `x` the model classifies as `y`, in eval mode (BatchNorm's running statistics):
    one process scoring tensors in memory, the yardstick the tests hold the sharded score to."""
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(y), batch_size):
        predicted = model(x[start:start + batch_size].to(device)).argmax(dim=1)
        correct += (predicted == y[start:start + batch_size].to(device)).sum().item()
    model.train(was_training)
    return correct


def share_buffers(model: torch.nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm's running statistics), one broadcast per dtype.

    Training never averages them: each rank's follow its own batches, and eval mode uses them.
    Without this, ranks evaluating slices would score different models. Rank 0's are the ones
    the checkpoints keep, so the sharded score is the score of the checkpointed model
    (PyTorch's DDP broadcasts rank 0's buffers the same way, at every forward). Training mode
    does not read the running statistics, so this changes no rank's training.
    """
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for buffer in model.buffers():
        by_dtype.setdefault(buffer.dtype, []).append(buffer)
    for dtype, buffers in sorted(by_dtype.items(), key=lambda item: str(item[0])):
        flat = torch.cat([b.detach().reshape(-1).cpu() for b in buffers])
        name = f"transientvod.eval.buffers.{str(dtype).split('.')[-1]}"
        flat = wait([hvd.broadcast_async(flat, root_rank=0, name=name)])[0]
        for buffer, part in zip(buffers, torch.split(flat, [b.numel() for b in buffers])):
            buffer.copy_(part.view_as(buffer))


def evaluate(model: torch.nn.Module, test_set, device: torch.device,
             evaluate_batch: Callable = top1_correct, batch_size: int = 512, workers: int = 0) -> dict[str, float]:
    """Each metric `evaluate_batch` sums, over the whole test split, divided by its size.

    Every rank returns the same numbers, equal to one process scoring the whole split with
    rank 0's model (and rank 0's BatchNorm statistics). The sums travel in one float64
    allreduce (exact for counts up to 2^53); ranks that finish their slice sooner wait there
    without spinning (horovod_wait.py). Every rank's slice holds at least one sample (the
    launcher and the sampler check that the split has one per worker), so every rank knows
    the metrics' names.
    """
    with torch.no_grad():
        share_buffers(model)
    part = evaluation_slice(len(test_set), hvd.rank(), hvd.size())
    loader = DataLoader(Subset(test_set, range(part.start, part.stop)), batch_size=batch_size, num_workers=workers)
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    with torch.no_grad():
        for inputs, target in loader:
            inputs, target = to_device(inputs, device), to_device(target, device)
            for name, value in evaluate_batch(model(inputs), target).items():
                sums[name] = sums.get(name, 0.0) + float(value)
    model.train(was_training)
    names = sorted(sums)
    counted = torch.tensor([sums[name] for name in names] + [part.stop - part.start], dtype=torch.float64)
    totals = wait([hvd.allreduce_async(counted, op=hvd.Sum, name=f"transientvod.eval.sums.{len(names)}")])[0]
    return {name: totals[i].item() / totals[-1].item() for i, name in enumerate(names)}
