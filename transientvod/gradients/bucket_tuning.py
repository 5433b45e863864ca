"""The exchange's bucket size, picked on each ring by timing both cuts.

Buckets started during backward hide communication where the link is slow: on 4 testbed
hosts at 25mbit/400ms, fp16 at staleness 0 ran 1.14x faster in 3 buckets than in one. But
every bucket costs the same CPU on every rank whatever its size, so where the link is fast
one bucket wins: on 4 ranks sharing 2 cores the codecs cost 11-19 % of a step over `none` in
3 buckets, -1 to 7.5 % in one (benchmarks/RESULTS.md, "Buckets started during backward" and
"Bucket size and a codec's CPU"). Which cut is faster depends on the links and the hosts,
which a job cannot know before it runs, so it measures them.

Once the gradients are compressed and stale (after compress_after and a synchronous warm-up),
each ring runs TURNS turns in the order A B B A (so that a drift in speed favours neither),
A being `staleness.default_bucket_elements` and B the other cut. A turn skips its first
steps (the switch, and at staleness s the s steps that refill the pipeline) and times the
next MEASURED_STEPS, each from the end of the step before: the whole loop, since waits
outside the exchange's step depend on the cut too (at staleness 2 and 25 Mbit the commit
vote's allreduce queued behind the exchange's ops for 100-125 ms a step, more in 3 buckets,
and timing only zero_grad to step kept the cut that ran 1.72 steps/s against 1.89). A cut's
time is the mean of its steps' times, leaving out any step during which the job evaluated or
committed (the loop says so: `other_work`), since those cost the same in either cut. Not the
median: on a slow link a stale step's times are skewed (a step that waits for the link, then
steps that do not), and the median then fell far below the link's pace (fp16 at staleness 2,
100 Mbit: 98.6 ms a step for 3 buckets, which ran 146-150 ms a step in jobs of their own,
against 128.2 for one, which ran 136), and the tuner kept the slower cut.
The ranks average their means (one small allreduce) so that all of them keep the same cut,
the faster one. A new ring tunes again: its links may differ, and a worker that joins starts
from cut A like every other rank.
"""
from __future__ import annotations

import logging
import statistics
import time

import torch

import horovod.torch as hvd

from transientvod.gradients.exchange import GradientExchange
from transientvod.gradients.staleness import default_bucket_elements
from transientvod.gradients.horovod_wait import wait

log = logging.getLogger(__name__)

MEASURED_STEPS = 10  # timed in each turn
TURNS = ("A", "B", "B", "A")
SETTLE_STEPS = 3  # after the ring starts, before the first turn: its first steps run slow


def cuts(params: list[torch.nn.Parameter], staleness: int) -> list[int]:
    """The bucket sizes to try for these parameters' gradients: the default by staleness
    first, then the other of BACKWARD_BUCKETS and one bucket; only the first where both cut
    the parameters alike (a small model goes in one bucket either way)."""
    numel = sum(p.numel() for p in params)
    default = default_bucket_elements(numel, staleness)
    other = default_bucket_elements(numel, 1 if staleness == 0 else 0)
    same = (len(GradientExchange.cut_buckets(params, default)) == len(GradientExchange.cut_buckets(params, other)))
    return [default] if same else [default, other]


class BucketTuner:
    """Drives one exchange's cut through each ring's turns, then keeps the faster cut."""

    __slots__ = ("exchange", "sizes", "tune_from_step", "total_steps", "skip", "chosen", "seconds",
                 "_ring", "_first", "_steps", "_last_step_ended", "_other_work")

    def __init__(self, exchange: GradientExchange, sizes: list[int], tune_from_step: int, total_steps: int):
        """`sizes`: the cuts to try, A first (`cuts`). `tune_from_step`: the first step at which
        the exchange runs as it will from then on, compressed and stale. A ring that cannot
        finish its turns before `total_steps` keeps cut A."""
        self.exchange = exchange
        self.sizes = sizes
        self.tune_from_step = tune_from_step
        self.total_steps = total_steps
        self.skip = exchange.staleness + 2  # the switch's step, and the s steps that refill the pipeline
        self.chosen: int | None = None  # the size this ring keeps, once known
        self.seconds: list[float] = []  # this rank's mean step time in each cut, for the log and tests
        self._ring = 0
        self._first = 0  # the ring's first tuned step
        self._steps: list[list[float]] = [[] for _ in sizes]
        self._last_step_ended: float | None = None
        self._other_work = False  # the step now running also evaluates or commits: not timed

    @property
    def turn_steps(self) -> int:
        return self.skip + MEASURED_STEPS

    def begin(self, ring_step: int) -> None:
        """Call where every rank starts on a (re)formed ring, with the step all of them hold:
        back to cut A, on every rank, and the turns from the start."""
        self.exchange.rebucket(self.sizes[0])
        self._ring = ring_step
        self._first = max(ring_step + SETTLE_STEPS, self.tune_from_step)
        self._steps = [[] for _ in self.sizes]
        self._last_step_ended = None
        self._other_work = False
        self.seconds = []
        ends = self._first + len(TURNS) * self.turn_steps
        self.chosen = None if len(self.sizes) > 1 and ends <= self.total_steps else self.sizes[0]

    def after_step(self, steps_done: int) -> None:
        """Call after the exchange's step, with the steps done on this ring so far (the next
        step's number): records the time since the step before ended, and at the end of a turn
        switches the cut."""
        if self.chosen is None:
            now = time.perf_counter()
            if self._last_step_ended is not None:
                self._record(steps_done - 1, None if self._other_work else now - self._last_step_ended)
            self._other_work = False
            self._last_step_ended = time.perf_counter()  # after a switch's drain and re-cut, if any

    def other_work(self) -> None:
        """Call when the job evaluates or commits between two steps: the time until the next
        step ends is not a step's own, so it is not counted. Every rank does this work at the
        same steps, so every rank leaves out the same ones."""
        self._other_work = True

    def _record(self, step: int, seconds: float | None) -> None:
        at = step - self._first
        if at < 0:
            return
        turn, within = divmod(at, self.turn_steps)
        if within >= self.skip and seconds is not None:
            self._steps[_cut_of(turn)].append(seconds)
        if within < self.turn_steps - 1:
            return
        if turn + 1 < len(TURNS):
            self._switch(self.sizes[_cut_of(turn + 1)])
        else:
            self._decide()

    def _switch(self, size: int) -> None:
        self.exchange.drain()  # at staleness s, the s steps in flight: on every rank at this step
        self.exchange.rebucket(size)

    def _decide(self) -> None:
        """Every rank's mean step time in each cut, averaged over the ranks: the same choice
        everywhere. Waited for without spinning, like the other blocking collectives. A cut
        whose every timed step held other work (a notice makes the job commit every step) counts
        as infinitely slow, on every rank alike: with both so, cut A stays."""
        self.seconds = [statistics.fmean(times) if times else float("inf") for times in self._steps]
        mine = torch.tensor(self.seconds, dtype=torch.float64)
        ring = wait([hvd.allreduce_async(mine, op=hvd.Average, name=f"transientvod.gradients.bucket_tuning.{self._ring}")])[0]
        best = min(range(len(self.sizes)), key=lambda index: ring[index].item())
        self._switch(self.sizes[best])
        self.chosen = self.sizes[best]
        if hvd.rank() == 0:
            tried = [f"{len(GradientExchange.cut_buckets(self.exchange.params, size))} bucket(s) {1000 * t:.1f} ms"
                     for size, t in zip(self.sizes, ring.tolist())]
            log.info("bucket tuning on a ring of %d: %s a step; keeping %d bucket(s)", hvd.size(), ", ".join(tried),
                     len(self.exchange.buckets))


def _cut_of(turn: int) -> int:
    return 0 if TURNS[turn] == "A" else 1


class FixedCut:
    """No tuning: the cut the config set, or none to tune (hvd.DistributedOptimizer's own)."""

    def begin(self, ring_step: int) -> None:
        pass

    def after_step(self, steps_done: int) -> None:
        pass

    def other_work(self) -> None:
        pass
