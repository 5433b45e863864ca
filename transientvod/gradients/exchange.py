"""Gradient exchange: synchronous, or bounded staleness s over Horovod's ring.

    exchange = GradientExchange(optimizer, model.parameters(), staleness=2, codec="fp16")
    for step, (x, y) in enumerate(batches):
        exchange.zero_grad()
        loss_fn(model(x), y).backward()
        exchange.step(step)          # starts step t's exchange, applies step t - s's average
    exchange.drain()                 # applies the last s steps' averages

At step t every rank encodes its gradient buckets and starts their exchange with Horovod's
async ops (the codec's protocol: `transientvod.gradients.codecs`); training goes on, and the optimizer
applies the averaged gradient of step t - s, waiting only for what step t - s started.
Buckets are cut in backward order (the last parameters first) and each starts from the
gradient hooks as soon as backward has made all of its gradients, while backward goes on
with the layers before it, as Horovod's DistributedOptimizer and DDP start theirs; `step`
starts whatever backward did not (a ring's first step, gradients set by hand, unused
parameters). So each step takes one backward: a second one before `step` raises, unless
`start_in_backward=False`.
Each step in flight moves on to its next phase as soon as a poll finds the one before it
done: polls run at `step` and `zero_grad`, from backward's gradient hooks (every
POLL_EVERY_GRADS parameters), and while `step` waits for the oldest step; so a multi-phase
protocol overlaps the next s steps of compute too. Every rank joins every collective in the
same order, so it stays a ring (no parameter server). `staleness=0` is synchronous training
and gives the same parameters, bit for bit, as `hvd.DistributedOptimizer` (tested on 3 ranks).

`SynchronousStep` (synchronous.py) puts `hvd.DistributedOptimizer` behind the same calls (zero_grad, step,
drain, reset) for the plain synchronous case (staleness 0, codec none), where Horovod's own
hooks overlap the allreduce with backward; the training loop then has one step path.

Gradients are bucketed: each bucket is one flat fp32 buffer, and every parameter's `.grad`
is a view into it (so `zero_grad` here, never `optimizer.zero_grad`, which would replace
the views). What is in flight is never dropped while the ring is whole: `drain()` applies it
at a graceful reset (a host leaves at a commit) and at the end of training. Only a lost peer
(HorovodInternalError) drops it: `reset()` then clears every residual, the senders' and the
owners', on every rank, so that a new rank (which has none) and the old ones agree."""
from __future__ import annotations

import logging
import time
import weakref
from collections import deque

import torch

import horovod.torch as hvd
from horovod.torch.optimizer import _DistributedOptimizer

from transientvod.gradients.buckets import Bucket, InFlight
from transientvod.gradients.codecs import Transfer, Wire, check_codec
from transientvod.gradients.horovod_wait import POLL_SECONDS
from transientvod.gradients.staleness import default_bucket_elements

log = logging.getLogger(__name__)

POLL_EVERY_GRADS = 8  # during backward, move the steps in flight on every this many parameters' gradients
MIN_COMPRESS_ELEMENTS = 1 << 16  # smaller buckets go uncompressed: the saving is not worth a pass


class GradientExchange:
    """Wraps an optimizer (plain torch, not hvd.DistributedOptimizer) with the exchange."""

    __slots__ = ("optimizer", "staleness", "stale_from_step", "codec_name", "block", "min_compress_elements",
                 "compress_from_step", "start_in_backward", "params", "buckets", "queue", "skipped_steps",
                 "applied_steps", "started_in_backward", "waited_seconds",
                 "wire", "name", "_ring", "_next_step", "_starting", "_made", "_grads_seen", "_hooks", "__weakref__")

    def __init__(self, optimizer: torch.optim.Optimizer, parameters, staleness: int = 0, codec: str = "none",
                 block: int = 512, min_compress_elements: int = MIN_COMPRESS_ELEMENTS, compress_from_step: int = 0,
                 bucket_elements: int | None = None, name: str = "transientvod.grads", stale_from_step: int = 0,
                 start_in_backward: bool = True):
        """`name` prefixes the exchange's Horovod op names: two exchanges alive in one process
        at once (tests do that) need different names, since Horovod refuses a name in flight.
        Steps before `stale_from_step` are synchronous (finished in their own `step` call); from
        it on, a step is applied s steps later (staleness.StalenessRule says why). With
        `start_in_backward` off, every bucket starts in `step` (one backward's gradients may
        then be accumulated over several). `bucket_elements` None: `default_bucket_elements`."""
        if isinstance(optimizer, _DistributedOptimizer):
            raise ValueError("wrap the plain torch optimizer: the exchange replaces hvd.DistributedOptimizer.")
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ValueError(f"exchange.staleness is {staleness!r}; it must be 0 (synchronous) or more steps.")
        check_codec(codec, block)
        params = [p for p in parameters if p.requires_grad]
        if bucket_elements is None:
            bucket_elements = default_bucket_elements(sum(p.numel() for p in params), staleness)
        if isinstance(bucket_elements, bool) or not isinstance(bucket_elements, int) or bucket_elements < 1:
            raise ValueError(f"exchange.bucket_elements is {bucket_elements!r}; it must be a whole number, "
                             "at least 1 (or null: chosen by the staleness).")
        self.optimizer = optimizer
        self.staleness = staleness
        self.stale_from_step = stale_from_step
        self.codec_name = codec
        self.block = block
        self.min_compress_elements = min_compress_elements
        self.compress_from_step = compress_from_step
        self.start_in_backward = start_in_backward
        self.params = params
        self.buckets = [Bucket(i, group) for i, group in enumerate(self.cut_buckets(params, bucket_elements))]
        self.queue: deque[InFlight] = deque()
        self.skipped_steps = 0
        self.applied_steps = 0
        self.started_in_backward = 0  # buckets whose exchange a gradient hook started
        self.waited_seconds = 0.0  # in step() and drain(), for the oldest step: the communication not hidden
        self.wire = Wire()
        self.name = name
        self._ring: int | None = None
        self._next_step: int | None = None  # known once the ring has made a step: the next is one more
        self._starting: InFlight | None = None  # the step whose buckets backward is starting
        self._made: list[set[int]] = [set() for _ in self.buckets]  # ids of the params with this step's gradient
        self._grads_seen = 0
        self._hooks = self._hook_buckets()

    def _hook_buckets(self) -> list:
        """A hook on every parameter, to start its bucket once backward has made the bucket's
        gradients (_gradient_made)."""
        # A protocol's next phase starts when a poll finds the last one done. Polled only at
        # step(), a scatter-reduce's second phase started a step late and the link idled
        # meanwhile. Backward is most of a step, so poll from there too, as Horovod's
        # DistributedOptimizer starts its allreduces from the same hooks (on the autograd
        # thread, while the caller waits in backward()). On 4 testbed hosts at 25mbit/400ms,
        # int8 at staleness 2 went from 2.54-2.59 steps/s to 2.88-2.89 with these hooks, and
        # to 3.21-3.23 with the polls in zero_grad and in the wait for the oldest step too.
        # The hooks hold the exchange weakly: a discarded exchange must not stay alive (with its
        # buffers) for as long as the model does.
        this = weakref.ref(self)

        def hook_of(bucket: Bucket):
            index = bucket.index  # not the bucket: its codecs' residuals must go with the exchange
            def gradient_made(param: torch.nn.Parameter) -> None:
                exchange = this()
                if exchange is not None:
                    exchange._gradient_made(exchange.buckets[index], param)
            return gradient_made

        return [p.register_post_accumulate_grad_hook(hook_of(bucket))
                for bucket in self.buckets for p in bucket.params]

    @staticmethod
    def cut_buckets(params, bucket_elements: int) -> list[list[torch.nn.Parameter]]:
        """Buckets in backward order: backward makes the last parameters' gradients first (the
        usual case; another order costs overlap, not correctness). A bucket closes once it holds
        `bucket_elements`; a smaller remainder (the first layers) joins the bucket before it if
        under half that, since it completes only at the end of backward anyway."""
        groups, current, size = [], [], 0
        for p in reversed(params):
            if current and p.device != current[0].device:
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel()
            if size >= bucket_elements:
                groups.append(current)
                current, size = [], 0
        if current:
            if groups and size < bucket_elements // 2 and groups[-1][0].device == current[0].device:
                groups[-1].extend(current)
            else:
                groups.append(current)
        return groups

    def rebucket(self, bucket_elements: int) -> bool:
        """Cut the gradient into buckets of `bucket_elements` afresh (bucket_tuning.py), between
        two steps with none in flight (drain() first), at the same step on every rank. Error
        feedback carries over: each codec's residuals, owners' folded into senders', follow
        their parameters into the new buckets. False if the cut is the one in use."""
        if self.queue or self._starting is not None:
            raise RuntimeError("gradient exchange: rebucket() with steps in flight; drain() first.")
        groups = self.cut_buckets(self.params, bucket_elements)
        if [len(group) for group in groups] == [len(bucket.params) for bucket in self.buckets]:
            return False
        carried: dict[str, dict[int, torch.Tensor]] = {}  # codec name -> id(param) -> its residual
        for bucket in self.buckets:
            for name, codec in bucket.codecs.items():  # none before the first step
                residual = codec.carried_residual(hvd.size(), hvd.rank())
                if residual is not None:
                    pieces = residual.split([p.numel() for p in bucket.params])
                    carried.setdefault(name, {}).update(zip(map(id, bucket.params), pieces))
        for hook in self._hooks:
            hook.remove()
        self.buckets = [Bucket(i, group) for i, group in enumerate(groups)]
        for name, residuals in carried.items():
            for bucket in self.buckets:
                pieces = [residuals[id(p)] if id(p) in residuals else torch.zeros(p.numel(), device=p.device)
                          for p in bucket.params]
                bucket.codec(name, self.block).load_residual(torch.cat(pieces))
        self._made = [set() for _ in self.buckets]
        self._hooks = self._hook_buckets()
        return True

    def zero_grad(self) -> None:
        if self.queue:
            self._advance()  # a phase that ended since step() starts its successor before forward
        if self._starting is not None:
            raise RuntimeError(f"gradient exchange: zero_grad() after backward without step({self._starting.step}); "
                               "call step() once after every backward.")
        for bucket in self.buckets:
            bucket.bind_grads()
            bucket.grad.zero_()
        self._forget_made()

    def step(self, step: int) -> bool:
        """Start step `step`'s exchange (what backward has not); apply step `step - s`'s
        average. True if applied."""
        if self._ring is None:
            self._ring = step  # the ring's first step: the same on every rank, new or old
        record, self._starting = self._starting, None
        if record is None:
            record = self._unstarted(step)
        elif record.step != step:
            raise RuntimeError(f"gradient exchange: step({step}) came after step({record.step - 1}); within a ring "
                               "the steps must count up by one (reset() starts a new ring).")
        for bucket in self.buckets:
            if record.transfers[bucket.index] is None:
                record.transfers[bucket.index] = self._start(bucket, step)
        self.queue.append(record)
        self._next_step = step + 1
        self._forget_made()  # the next backward is the next step's, zero_grad() or not
        self._advance()
        delay = self.staleness if step >= self.stale_from_step else 0
        if len(self.queue) <= delay:
            return False  # the first s steps only fill the pipeline
        return self._finish_oldest()

    def drain(self) -> int:
        """Apply every step in flight, oldest first, while the ring is still whole; how many
        were applied (a non-finite step is skipped on every rank, as in `step`)."""
        applied, drained = 0, len(self.queue)
        while self.queue:
            applied += self._finish_oldest()
        if drained:
            log.info("gradient exchange: drained %d step(s) of gradients in flight", drained)
        return applied

    def reset(self) -> None:
        """After an elastic reset (reset callback): drop what is still in flight, which after a
        drain is nothing, and restart error feedback from zero on every rank, owners' too."""
        dropped = len(self.queue) + (self._starting is not None)
        self.queue.clear()
        self._ring = self._next_step = self._starting = None
        self._forget_made()
        self._reset_residuals()
        if dropped:
            log.info("gradient exchange: dropped %d step(s) of gradients in flight at the reset", dropped)

    # -- steps in flight --------------------------------------------------------------------

    def _gradient_made(self, bucket: Bucket, param: torch.nn.Parameter) -> None:
        """A gradient hook: start the bucket once backward has made all its gradients (from the
        ring's second step on, when the step's number is known), and poll now and then."""
        self._grads_seen += 1
        if self.start_in_backward:
            made = self._made[bucket.index]
            if id(param) in made:
                raise RuntimeError("gradient exchange: a second backward() before step(); the exchange starts each "
                                   "bucket from the first, so pass start_in_backward=False to accumulate gradients.")
            made.add(id(param))
            if len(made) == len(bucket.params) and self._next_step is not None:
                if self._starting is None:
                    self._starting = self._unstarted(self._next_step)
                self._starting.transfers[bucket.index] = self._start(bucket, self._next_step)
                self.started_in_backward += 1
        if (self.queue or self._starting) and self._grads_seen % POLL_EVERY_GRADS == 0:
            self._advance()

    def _unstarted(self, step: int) -> InFlight:
        return InFlight(step, hvd.size(), [None] * len(self.buckets))

    def _forget_made(self) -> None:
        for made in self._made:
            made.clear()

    def _start(self, bucket: Bucket, step: int) -> Transfer:
        """Encode the bucket and start its first phase, under a name no op in flight has.
        Horovod refuses an op whose name is still in flight. Names carry the ring and the
        step's slot, step % (s + 1): at most s + 1 steps are in flight, and a slot's last step
        was finished (every handle waited for) before its successor's backward begins; a stable
        name per slot also lets Horovod's response cache know the op. The ring's first step
        keeps a new ring's names apart from any op a reset dropped, as commit.CommitVote does,
        and drain() leaves nothing behind for the next exchange in the same process. The
        bucket count tells the cuts of rebucket() apart, each with its own cached sizes."""
        name = f"{self.name}.r{self._ring}.s{step % (self.staleness + 1)}.b{bucket.index}of{len(self.buckets)}"
        codec = self._codec_for(bucket, step)
        return Transfer(codec.start(bucket.grad, self.wire, name, hvd.size(), hvd.rank()))

    def _codec_for(self, bucket: Bucket, step: int):
        compress = step >= self.compress_from_step and bucket.grad.numel() >= self.min_compress_elements
        return bucket.codec(self.codec_name if compress else "none", self.block)

    def _advance(self) -> None:
        """Move every step in flight on to its next phase where the last one is done, without
        blocking. A bucket's newer step never overtakes an older one: an owner's residual must
        see the steps in order."""
        records = [*self.queue, self._starting] if self._starting is not None else self.queue
        for index in range(len(self.buckets)):
            older_done = None  # phases the older step of this bucket has done; None: complete
            for record in records:
                transfer = record.transfers[index]
                if transfer is None:
                    break  # not started yet (only the newest step has such buckets)
                transfer.advance(until=older_done)
                older_done = None if transfer.complete else transfer.phases_done

    def _finish_oldest(self) -> bool:
        """Wait for the oldest step in flight and apply it. The wait keeps moving every step in
        flight on (a blocking wait on the oldest alone left the link idle whenever a younger
        step's phase ended meanwhile: its next phase waited for the next poll)."""
        oldest, began = self.queue[0], time.perf_counter()
        while True:
            self._advance()
            if all(transfer.complete for transfer in oldest.transfers):
                break
            time.sleep(POLL_SECONDS)
        self.waited_seconds += time.perf_counter() - began
        return self._finish(self.queue.popleft())

    def _finish(self, record: InFlight) -> bool:
        if record.world != hvd.size():
            raise RuntimeError(f"gradient exchange: step {record.step} was started by {record.world} ranks and "
                               f"finished by {hvd.size()}; drain() or reset() must run when the ring changes.")
        flags = [transfer.finish(bucket.grad) for bucket, transfer in zip(self.buckets, record.transfers)]
        if _any_set(flags):
            # Every rank decodes the same bytes and the same max-reduced flags: all skip together.
            self.skipped_steps += 1
            log.warning("gradient exchange: NaN/Inf in step %d's gradients; skipped it on every rank "
                        "and restarted error feedback", record.step)
            self._reset_residuals()
            return False
        self.optimizer.step()
        self.applied_steps += 1
        return True

    def _reset_residuals(self) -> None:
        for bucket in self.buckets:
            for codec in bucket.codecs.values():
                codec.reset_residual()


def _any_set(flags: list[torch.Tensor]) -> bool:
    """Whether any bucket's non-finite flag is set, in one read for the whole step: on a GPU
    each read waits for the stream, which would hold the next bucket's launches back."""
    if not flags:
        return False
    joined = torch.cat([flag.reshape(1).float().to(flags[0].device) for flag in flags])
    return bool(joined.max().item() > 0)
