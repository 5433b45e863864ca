"""Durable checkpoints written in the background, so that the ring does not wait for them.

Rank 0 used to call `store.save` inside the step loop: torch.save, SHA-256, fsync, or an S3
upload, while every other rank waited for it in the next collective. The loop now only takes
a snapshot (every tensor copied to CPU memory, everything else deep-copied: a memory copy,
cheap next to a step) and hands it to a thread, which calls the same `store.save`. So the
atomicity and the checksums are the store's own, unchanged: a process that dies mid-write
leaves a temporary directory (local) or a step without its manifest (S3), and `load_latest`
returns the checkpoint before it.

At most one write runs at a time (a store has one writer). A snapshot that arrives while a
write runs waits as the *pending* one; a newer snapshot replaces a pending one that has not
started (coalescing). Why coalesce rather than wait: waiting would stall the ring exactly
when writes are slowest (a slow disk, S3 throttling), which is what this module exists to
avoid; and a job resumes from its newest checkpoint only, so an older one that was never
written costs nothing once a newer one is. Memory stays bounded at two snapshots (the one
being written and the pending one). Every skipped step is logged.

A write that fails is not lost in the thread: the error (the store's one-sentence
CheckpointError) is raised by the next `submit` and by `wait`, in the training loop's own
thread, so a job with a broken store stops as it did when it saved synchronously. The job's
end calls `wait`, so the summary is written only after the last checkpoint is durable.
"""
from __future__ import annotations

import collections
import copy
import logging
import threading
import time

import torch

from transientvod.checkpoint import CheckpointStore

log = logging.getLogger(__name__)


def cpu_snapshot(value, reuse=None):
    """A copy of `value` that later training steps cannot change: every tensor copied to CPU
    memory (a state_dict's tensors are the live parameters), dicts, lists and tuples rebuilt
    around the copies, anything else deep-copied.

    `reuse` is an older snapshot of the same structure that nothing reads any more: its
    tensors of matching shape and dtype are copied into rather than allocated. Fresh memory
    costs a page fault per 4 KiB on first touch, which made a 200 MB snapshot take about
    twice as long as the copy itself.
    """
    if isinstance(value, torch.Tensor):
        if (isinstance(reuse, torch.Tensor) and reuse.device.type == "cpu" and reuse.shape == value.shape
                and reuse.dtype == value.dtype):
            return reuse.copy_(value.detach())
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        old = reuse if isinstance(reuse, dict) else {}
        items = [(key, cpu_snapshot(item, old.get(key))) for key, item in value.items()]
        copied = collections.OrderedDict(items) if isinstance(value, collections.OrderedDict) else dict(items)
        if hasattr(value, "_metadata"):
            # A module's state_dict carries per-module versions that load_state_dict reads.
            copied._metadata = copy.deepcopy(value._metadata)
        return copied
    if isinstance(value, (list, tuple)) and (type(value) is list or type(value) is tuple):
        old = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else [None] * len(value)
        return type(value)(cpu_snapshot(item, spare) for item, spare in zip(value, old))
    return copy.deepcopy(value)


class BackgroundCheckpointWriter:
    """Writes snapshots to `store` in a thread of its own, one at a time, newest first."""

    def __init__(self, store: CheckpointStore):
        self.store = store
        self.last_location: str | None = None  # of the newest checkpoint written
        self._changed = threading.Condition()
        self._pending: tuple[int, dict, str] | None = None
        self._writing_step: int | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._spare: dict | None = None  # a snapshot already written (or replaced): memory to reuse

    def submit(self, step: int, state: dict, config_yaml: str) -> float:
        """Snapshot `state` now and write it in the background; returns the seconds the
        snapshot took (the only part the caller waits for). Raises the error of an earlier
        write that failed."""
        self.raise_failure()
        with self._changed:
            spare, self._spare = self._spare, None
        started = time.monotonic()
        snapshot = cpu_snapshot(state, reuse=spare)
        took = time.monotonic() - started
        with self._changed:
            if self._pending is not None:
                log.info("checkpoint of step %d was not written: step %d replaces it while step %d is "
                         "being written", self._pending[0], step, self._writing_step)
                self._spare = self._pending[1]  # never handed to the store: nothing reads it
            self._pending = (step, snapshot, config_yaml)
            if self._thread is None:
                # A daemon: a worker that exits without wait() (it crashed) is not held up by
                # a write, and the store's atomicity covers a write cut short.
                self._thread = threading.Thread(target=self._write_forever, name="checkpoint-writer", daemon=True)
                self._thread.start()
            self._changed.notify_all()
        return took

    def busy(self) -> bool:
        """True while a write runs or waits to run."""
        with self._changed:
            return self._pending is not None or self._writing_step is not None

    def wait(self, timeout: float | None = None) -> str | None:
        """Block until every submitted snapshot is written (or replaced); return the newest
        checkpoint's location. Raises the error of a write that failed, and TimeoutError if
        `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._error is None and (self._pending is not None or self._writing_step is not None):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"the checkpoint of step {self._writing_step} was still being written "
                                       f"after {timeout} s")
                self._changed.wait(left)
        self.raise_failure()
        return self.last_location

    def raise_failure(self) -> None:
        """Raise the error of a background write that failed, if one did."""
        with self._changed:
            error = self._error
        if error is not None:
            raise error

    def _write_forever(self) -> None:
        while True:
            with self._changed:
                while self._pending is None:
                    self._changed.wait()
                step, snapshot, config_yaml = self._pending
                self._pending = None
                self._writing_step = step
            try:
                location = self.store.save(step, snapshot, config_yaml)
            except BaseException as e:  # noqa: BLE001 - handed to the training thread, never lost
                with self._changed:
                    # The first failure is the one to report; later snapshots are not written
                    # (the job stops at its next submit or wait).
                    self._error = self._error or e
                    self._pending = None
                    self._writing_step = None
                    self._changed.notify_all()
                log.debug("background checkpoint of step %d failed: %s", step, e)
                continue
            with self._changed:
                self.last_location = location
                self._writing_step = None
                self._spare = snapshot  # encoded and written: its tensors can hold the next one
                self._changed.notify_all()
