"""Waiting for Horovod's async ops without keeping a core busy.

Horovod 0.28.1's `synchronize(handle)` waits in a loop that only yields the CPU
(`WaitAndClear` in horovod/torch/mpi_ops_v2.cc: poll, std::this_thread::yield, again), so a
rank waiting for a slower peer keeps a core busy. Measured on this project's 2-core machine
with 4 Gloo ranks, 3 of them waiting 5 s for the fourth: 50-80 % of a core each and 50,000
to 200,000 context switches a second; waiting with `poll` and a 0.5 ms sleep instead: 14-17 %
of a core, about what an idle rank costs anyway (Horovod's background thread coordinates
with its peers once a millisecond, HOROVOD_CYCLE_TIME). Where workers share cores (several
slots on one host, or the testbed's namespaced hosts) the spin takes the CPU from the very
ranks the spinner waits for. The sleep adds at most POLL_SECONDS to a wait, less than the
background thread's own cycle.

Our Horovod build (launch/horovod-0.28.1-transient.patch) now sleeps the same way inside
`synchronize`, so Horovod's own blocking calls (hvd.allreduce, broadcast_object, the elastic
state's sync and each commit's host-update check) no longer spin either. This module stays:
the exchange does work between polls (it moves every step in flight on), and the job's own
waits stay polite on a Horovod built without the patch.
"""
from __future__ import annotations

import time
from typing import Iterable

import horovod.torch as hvd

POLL_SECONDS = 0.0005


def wait_until_done(handles: Iterable[int]) -> None:
    """Return once every one of Horovod's async `handles` is done (or failed: `synchronize`
    then raises, as it would have)."""
    for handle in handles:
        while not hvd.poll(handle):
            time.sleep(POLL_SECONDS)


def wait(handles: list[int]) -> list:
    """The results of `handles`, in order, as `hvd.synchronize` gives them, waited for politely."""
    wait_until_done(handles)
    return [hvd.synchronize(handle) for handle in handles]


def broadcast_parameters(state: dict, root_rank: int) -> None:
    """`hvd.broadcast_parameters(state, root_rank)` for a state dict, waited for politely:
    the same in-place broadcasts under the same names (the sorted keys)."""
    wait_until_done([hvd.broadcast_async_(tensor, root_rank, name) for name, tensor in sorted(state.items())])


def wait_for_distributed_optimizer(optimizer) -> None:
    """Wait politely for the allreduces that hvd.DistributedOptimizer's hooks started during
    backward, so that its `step()` (which synchronizes each) finds them done. Its handles
    live in `_handles` (Horovod 0.28.1, the last release): parameter -> (handle, context),
    where a handle is None for a gradient whose hook has not run (step() starts its allreduce
    itself) or a callable for a sparse one; only the started ones are ints."""
    wait_until_done(handle for handle, _ in optimizer._handles.values() if isinstance(handle, int))
