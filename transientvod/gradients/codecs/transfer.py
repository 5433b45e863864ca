"""One bucket of one step on the wire: a codec's protocol, advanced phase by phase.

A protocol is a generator: it starts a phase's ops and yields their handles; it is resumed
with their results once all of them are done, and starts the next phase; its return value
is the last step, `decode(out) -> flag`, run only when the optimizer wants the
gradient (the bucket's buffer holds newer gradients until then). The flag is a one-element
tensor on the bucket's device, above 0 if the average is not finite: the exchange reads the
flags of a step's buckets once, together, since on a GPU each read waits for the stream. `advance` never blocks:
it polls the handles and moves on only if they are done, so the exchange can call it at
every step and a phase starts as soon as the one before it ends, without waiting for the
step that finishes it. `finish` waits for whatever is left (polling: horovod_wait.py).
"""
from __future__ import annotations

from typing import Callable, Generator

import torch

import horovod.torch as hvd

from transientvod.gradients.horovod_wait import wait

Decode = Callable[[torch.Tensor], torch.Tensor]
Protocol = Generator[list, list, Decode]


class Transfer:
    """A protocol in flight; `phases_done` counts the phases whose results it has taken."""

    __slots__ = ("_protocol", "_handles", "_decode", "phases_done")

    def __init__(self, protocol: Protocol):
        self._protocol = protocol
        self._decode: Decode | None = None
        self.phases_done = 0
        self._handles = self._resume(None)

    @property
    def complete(self) -> bool:
        return self._decode is not None

    def advance(self, until: int | None = None) -> None:
        """Take the results of every finished phase and start the next, without blocking;
        stop at `until` phases done (a newer transfer must not overtake an older one)."""
        while not self.complete and (until is None or self.phases_done < until):
            if not all(hvd.poll(h) for h in self._handles):
                return
            self._handles = self._resume([hvd.synchronize(h) for h in self._handles])

    def finish(self, out: torch.Tensor) -> torch.Tensor:
        """Wait for the rest of the protocol, decode the average into `out`; its non-finite flag
        (a one-element tensor, above 0 if not finite), not yet read."""
        while not self.complete:
            self._handles = self._resume(wait(self._handles))
        return self._decode(out)

    def _resume(self, results: list | None) -> list:
        try:
            handles = self._protocol.send(results)
        except StopIteration as done:
            self._decode = done.value
            handles = []
        if results is not None:
            self.phases_done += 1
        return handles
