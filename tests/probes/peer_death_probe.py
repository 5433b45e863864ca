"""Run by tests/worker/test_peer_death.py under elastic `horovodrun -np 2`: rank 0 dies (SIGKILL) while
rank 1 enqueues allreduces as fast as it can, as a gradient hook does during backward.

Rank 1 must learn of the death as HorovodInternalError (from an enqueue or a synchronize), and
every op it was given a handle for must then complete (with an error): a handle that never
completes is a survivor that never recovers. It prints one JSON line: where the error came
from, how many ops it enqueued, and how many handles were still not done 10 s later.

Horovod 0.28.1 hung here in about half of the runs: its background thread, shutting down after
the read error, destroyed the queued ops' tensors (which takes the GIL) under the locks that
rank 1's enqueue, holding the GIL, was waiting for (launch/horovod-0.28.1-transient.patch).
"""
from __future__ import annotations

import json
import os
import signal
import time

import torch

import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError

RANK0_SECONDS = 0.5  # rank 0's traffic before it dies
DONE_WITHIN_SECONDS = 10.0


def rank0_dies() -> None:
    tensor, handles = torch.ones(64), []
    deadline = time.monotonic() + RANK0_SECONDS
    for i in range(10**9):
        handles.append(hvd.allreduce_async(tensor, name=f"op{i}"))
        if len(handles) > 50:  # keep up with rank 1 only loosely: its queue grows
            for handle in handles[:25]:
                hvd.synchronize(handle)
            del handles[:25]
        if time.monotonic() > deadline:
            os.kill(os.getpid(), signal.SIGKILL)


def rank1_survives() -> dict:
    tensor, handles, raised_by = torch.ones(64), [], None
    enqueued = 0
    while raised_by is None:
        try:
            handles.append(hvd.allreduce_async(tensor, name=f"op{enqueued}"))
            enqueued += 1
        except HorovodInternalError:
            raised_by = "enqueue"
        if enqueued % 16 == 0:
            for handle in [h for h in handles if hvd.poll(h)]:
                handles.remove(handle)
                try:
                    hvd.synchronize(handle)
                except HorovodInternalError:
                    raised_by = raised_by or "synchronize"
    deadline = time.monotonic() + DONE_WITHIN_SECONDS
    while handles and time.monotonic() < deadline:
        handles = [h for h in handles if not hvd.poll(h)]
        time.sleep(0.01)
    return {"rank": 1, "raised_by": raised_by, "enqueued": enqueued, "never_done": len(handles)}


def main() -> None:
    hvd.init()
    hvd.allreduce(torch.ones(1), name="ring_formed")
    if hvd.rank() == 0:
        rank0_dies()
    print(json.dumps(rank1_survives()), flush=True)


if __name__ == "__main__":
    main()
