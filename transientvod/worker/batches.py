"""What the loop needs to know of a batch it did not make: a task's batch is whatever its data
set's samples collate into (tensors, or tuples, lists and dicts of them)."""
from __future__ import annotations

import torch


def to_device(batch, device: torch.device):
    """`batch` with every tensor in it on `device` (the same structure)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(value, device) for value in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def batch_length(batch) -> int:
    """How many samples `batch` holds: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        return batch_length(value)
    return len(batch)
