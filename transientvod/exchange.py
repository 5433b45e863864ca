"""Gradient exchange: synchronous, or bounded staleness s over Horovod's ring.

    exchange = GradientExchange(optimizer, model.parameters(), staleness=2, codec="fp16")
    for step, (x, y) in enumerate(batches):
        exchange.zero_grad()
        loss_fn(model(x), y).backward()
        exchange.step(step)          # starts step t's exchange, applies step t - s's average

At step t every rank compresses its gradient bucket and starts the collective with
Horovod's async ops; training goes on, and the optimizer applies the averaged gradient of
step t - s, waiting only if it has not arrived. Every rank joins every collective in the
same order, so it stays a ring (no parameter server); staleness only lets a slow rank's
exchange overlap the next s steps of compute. `staleness=0` is synchronous training and
gives the same parameters, bit for bit, as `hvd.DistributedOptimizer` (tested on 2 ranks).

`SynchronousStep` puts `hvd.DistributedOptimizer` behind the same three calls (zero_grad,
step, reset) for the plain synchronous case (staleness 0, codec none), where Horovod's own
hooks overlap the allreduce with backward; the training loop then has one step path.

Gradients are bucketed: each bucket is one flat fp32 buffer, and every parameter's `.grad`
is a view into it (so `zero_grad` here, never `optimizer.zero_grad`, which would replace
the views). After an elastic reset, `reset()` drops what was in flight (at most s steps of
gradients) without waiting on it, and zeroes the error-feedback residuals on every rank, so
that a new rank (which has none) and the old ones agree.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import torch

import horovod.torch as hvd
from horovod.torch.optimizer import _DistributedOptimizer

from transientvod.codecs import Codec
from transientvod.config import CODECS

log = logging.getLogger(__name__)

BUCKET_ELEMENTS = 1 << 22  # 16 MB of fp32 per bucket: big enough to use the link well
MIN_COMPRESS_ELEMENTS = 1 << 16  # smaller buckets go uncompressed: the saving is not worth a pass


class Bucket:
    """A run of parameters whose gradients live in one flat fp32 buffer."""

    __slots__ = ("index", "params", "grad", "codecs")

    def __init__(self, index: int, params: list[torch.nn.Parameter]):
        self.index = index
        self.params = params
        numel = sum(p.numel() for p in params)
        self.grad = torch.zeros(numel, dtype=torch.float32, device=params[0].device)
        self.codecs: dict[str, Codec] = {}
        self.bind_grads()

    def bind_grads(self) -> None:
        """Make every parameter's .grad a view into the flat buffer again if something replaced
        it (Horovod's broadcast_optimizer_state gives a fresh optimizer new zero .grad tensors)."""
        offset = 0
        for p in self.params:
            view = self.grad[offset:offset + p.numel()]
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view.view_as(p)
            offset += p.numel()

    def codec(self, name: str, block: int) -> Codec:
        if name not in self.codecs:
            self.codecs[name] = Codec(name, self.grad.numel(), self.grad.device, block)
        return self.codecs[name]


@dataclass
class InFlight:
    """One bucket of one step on the wire."""
    bucket: Bucket
    codec: Codec
    payload: torch.Tensor
    scales: torch.Tensor | None
    flag: torch.Tensor  # this rank's "saw NaN/Inf", max-reduced
    handles: list = field(default_factory=list)


class SynchronousStep:
    """hvd.DistributedOptimizer behind the exchange's interface, so that the loop has one step
    path: zero_grad, backward, step(step), and reset after an elastic reset."""

    __slots__ = ("optimizer",)

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self, step: int) -> bool:
        self.optimizer.step()  # waits for the gradients' allreduce, started during backward
        return True

    def reset(self) -> None:
        pass  # nothing in flight between steps


class GradientExchange:
    """Wraps an optimizer (plain torch, not hvd.DistributedOptimizer) with the exchange."""

    __slots__ = ("optimizer", "staleness", "codec_name", "block", "min_compress_elements", "compress_from_step",
                 "buckets", "queue", "skipped_steps")

    def __init__(self, optimizer: torch.optim.Optimizer, parameters, staleness: int = 0, codec: str = "none",
                 block: int = 512, min_compress_elements: int = MIN_COMPRESS_ELEMENTS, compress_from_step: int = 0,
                 bucket_elements: int = BUCKET_ELEMENTS):
        if isinstance(optimizer, _DistributedOptimizer):
            raise ValueError("wrap the plain torch optimizer: the exchange replaces hvd.DistributedOptimizer.")
        if staleness < 0:
            raise ValueError(f"staleness is {staleness}; it must be 0 (synchronous) or more.")
        if codec not in CODECS:
            raise ValueError(f"codec is {codec!r}; it must be one of {', '.join(CODECS)}.")
        if bucket_elements < 1:
            raise ValueError(f"bucket_elements is {bucket_elements}; it must be at least 1.")
        self.optimizer = optimizer
        self.staleness = staleness
        self.codec_name = codec
        self.block = block
        self.min_compress_elements = min_compress_elements
        self.compress_from_step = compress_from_step
        self.buckets = self._make_buckets([p for p in parameters if p.requires_grad], bucket_elements)
        self.queue: deque[list[InFlight]] = deque()
        self.skipped_steps = 0

    @staticmethod
    def _make_buckets(params, bucket_elements: int) -> list[Bucket]:
        groups, current, size = [], [], 0
        for p in params:
            if current and (size + p.numel() > bucket_elements or p.device != current[0].device):
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel()
        if current:
            groups.append(current)
        return [Bucket(i, group) for i, group in enumerate(groups)]

    def zero_grad(self) -> None:
        for bucket in self.buckets:
            bucket.bind_grads()
            bucket.grad.zero_()

    def step(self, step: int) -> bool:
        """Start step `step`'s exchange; apply step `step - s`'s average. True if applied."""
        slot = step % (self.staleness + 1)
        self.queue.append([self._start(bucket, step, slot) for bucket in self.buckets])
        if len(self.queue) <= self.staleness:
            return False  # the first s steps only fill the pipeline
        return self._finish(self.queue.popleft())

    def reset(self) -> None:
        """After an elastic reset: drop what was in flight, restart error feedback from zero."""
        dropped = len(self.queue)
        self.queue.clear()
        for bucket in self.buckets:
            for codec in bucket.codecs.values():
                codec.reset_residual()
        if dropped:
            log.info("gradient exchange: dropped %d step(s) of gradients in flight at the reset", dropped)

    # -- one bucket ---------------------------------------------------------------------------

    def _codec_for(self, bucket: Bucket, step: int) -> Codec:
        compress = step >= self.compress_from_step and bucket.grad.numel() >= self.min_compress_elements
        return bucket.codec(self.codec_name if compress else "none", self.block)

    def _start(self, bucket: Bucket, step: int, slot: int) -> InFlight:
        codec = self._codec_for(bucket, step)
        payload, scales = codec.new_payload()
        flag = torch.tensor([1.0 if codec.compress(bucket.grad, payload, scales) else 0.0])
        name = f"transientvod.b{bucket.index}.s{slot}"
        work = InFlight(bucket, codec, payload, scales, flag)
        work.handles.append(hvd.allreduce_async_(flag, op=hvd.Max, name=name + ".flag"))
        if codec.name in ("none", "fp16"):
            work.handles.append(hvd.allreduce_async_(payload, op=hvd.Sum, name=name))
        elif codec.name == "bf16":
            # Horovod 0.28.1 has no bfloat16 type: gather the bit patterns, sum after.
            work.handles.append(hvd.allgather_async(payload.view(torch.int16), name=name))
        else:
            q_splits, s_splits = self._int8_splits(codec)
            work.handles.append(hvd.alltoall_async(payload, splits=q_splits, name=name + ".q"))
            work.handles.append(hvd.alltoall_async(scales, splits=s_splits, name=name + ".scales"))
        return work

    def _finish(self, step_work: list[InFlight]) -> bool:
        world = hvd.size()
        nonfinite = False
        for work in step_work:
            results = [hvd.synchronize(h) for h in work.handles]
            nonfinite |= bool(results[0].item() > 0)
            nonfinite |= self._average_into_grad(work, results[1:], world)
        if nonfinite:
            # Every rank sees the same flag (max-reduced) and the same sums: all skip together.
            self.skipped_steps += 1
            log.warning("gradient exchange: NaN/Inf in a step's gradients; skipped it on every rank "
                        "and restarted error feedback")
            for bucket in self.buckets:
                for codec in bucket.codecs.values():
                    codec.reset_residual()
            return False
        self.optimizer.step()
        return True

    def _average_into_grad(self, work: InFlight, results: list, world: int) -> bool:
        codec, out = work.codec, work.bucket.grad
        if codec.name in ("none", "fp16"):
            return codec.decompress_average(work.payload, None, out, world)
        if codec.name == "bf16":
            gathered = results[0].view(torch.bfloat16).view(world, codec.numel)
            torch.sum(gathered.float(), dim=0, out=out).mul_(1.0 / world)
            return not bool(torch.isfinite(out).all())
        # int8: reduce my shard of every rank's payload, requantize, gather the shards back.
        from transientvod import ops

        (q_in, _), (s_in, _) = results
        rank_blocks = self._int8_shard_blocks(codec)[hvd.rank()]
        q_mine = torch.empty(q_in.numel() // world, dtype=torch.int8)
        s_mine = torch.empty(rank_blocks, dtype=torch.float32)
        bad = ops.dequant_reduce_requant_(q_in.view(world, -1), s_in.view(world, -1), q_mine, s_mine, block=codec.block)
        q_all = hvd.allgather(q_mine, name=f"transientvod.b{work.bucket.index}.q_all")
        s_all = hvd.allgather(s_mine, name=f"transientvod.b{work.bucket.index}.s_all")
        bad_average = codec.decompress_average(q_all, s_all, out, world)
        return bad or bad_average

    # -- int8 shards: whole blocks per rank, the last rank takes the remainder ---------------

    def _int8_shard_blocks(self, codec: Codec) -> list[int]:
        blocks = -(-codec.numel // codec.block)
        world = hvd.size()
        base, extra = divmod(blocks, world)
        return [base + (1 if r < extra else 0) for r in range(world)]

    def _int8_splits(self, codec: Codec) -> tuple[torch.Tensor, torch.Tensor]:
        block_counts = self._int8_shard_blocks(codec)
        elements, start = [], 0
        for count in block_counts:
            end = min(codec.numel, start + count * codec.block)
            elements.append(end - start)
            start = end
        return torch.tensor(elements, dtype=torch.int32), torch.tensor(block_counts, dtype=torch.int32)
