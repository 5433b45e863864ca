"""What a job's newest durable checkpoint says of its progress: the step and the world size
it ran at. `transientvod status` reads it from the store itself (an s3:// prefix or a
directory), so the answer is the job's durable record, not a local file that may be stale.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from transientvod.checkpoint import open_store


@dataclass(frozen=True)
class CheckpointProgress:
    step: int
    world_size: int | None  # None: the checkpoint records none (a state without the loop's progress)
    location: str


def newest_progress(uri: str, endpoint_url: str | None = None) -> CheckpointProgress | None:
    """The newest intact checkpoint's step and world size, or None when the store holds none.
    Raises CheckpointError (one sentence) for a store that cannot be read. `endpoint_url`: an
    S3-compatible endpoint for an s3:// `uri` (else the environment's, as for a job)."""
    if uri.startswith("s3://") and endpoint_url:
        from transientvod.checkpoint.s3 import S3CheckpointStore
        store = S3CheckpointStore(uri, endpoint_url=endpoint_url)
    elif "://" not in uri and not os.path.isdir(uri):
        return None  # a reader makes nothing: the local store would create the directory
    else:
        store = open_store(uri)
    checkpoint = store.load_latest()
    if checkpoint is None:
        return None
    progress = checkpoint.state.get("progress") if isinstance(checkpoint.state, dict) else None
    world_sizes = (progress or {}).get("world_sizes") or []
    return CheckpointProgress(step=checkpoint.step, world_size=int(world_sizes[-1]) if world_sizes else None,
                              location=checkpoint.location)
