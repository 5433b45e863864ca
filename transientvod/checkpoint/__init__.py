"""Durable checkpoints: what a job resumes from when every one of its workers was lost.

Rank 0 writes one every `train.checkpoint_every` steps and at the end. A store holds
several; `load_latest` returns the newest one whose bytes are intact, so a checkpoint torn
by a crash, a full disk or a bad copy costs the steps since the one before it, not the run.

    format.py   the bytes of one checkpoint: file names, manifest, SHA-256 checks, errors
    store.py    CheckpointStore: the rules every store keeps (steps, pruning, load_latest)
    local.py    LocalCheckpointStore: a directory (temporary directory renamed into place)
    s3.py       S3CheckpointStore: an s3:// prefix through boto3 (imported only when used)
    gs.py       GcsCheckpointStore: a gs:// prefix through google-cloud-storage (the `gcs`
                extra; imported only when used)

`open_store(uri)` picks the store a `checkpoint.dir` names.
"""
from __future__ import annotations

import os
import urllib.parse

from transientvod.checkpoint.format import (
    CONFIG_FILE,
    FORMAT,
    LATEST_FILE,
    MANIFEST_FILE,
    STATE_FILE,
    CheckpointError,
    CorruptCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
    step_dir_name,
    step_of_dir_name,
)
from transientvod.checkpoint.local import LocalCheckpointStore
from transientvod.checkpoint.store import STALE_TEMP_SECONDS, Checkpoint, CheckpointStore

__all__ = [
    "CONFIG_FILE", "FORMAT", "LATEST_FILE", "MANIFEST_FILE", "STALE_TEMP_SECONDS", "STATE_FILE",
    "Checkpoint", "CheckpointError", "CheckpointStore", "CorruptCheckpoint", "LocalCheckpointStore",
    "decode_checkpoint", "encode_checkpoint", "open_store", "step_dir_name", "step_of_dir_name",
]


def open_store(uri: str, keep_last: int = 3) -> CheckpointStore:
    """The store at `uri`: a directory path, a file:// URI, s3://bucket/prefix (an
    S3CheckpointStore; its endpoint, region and credentials come from the environment) or
    gs://bucket/prefix (a GcsCheckpointStore; Application Default Credentials)."""
    text = os.fspath(uri)
    if not text:
        raise CheckpointError("the checkpoint location is empty; set checkpoint.dir to a directory.")
    parsed = urllib.parse.urlsplit(text)
    scheme = parsed.scheme.lower()
    # A one-letter "scheme" is a Windows drive (C:\...), a path like any other.
    if scheme == "" or len(scheme) == 1:
        return LocalCheckpointStore(text, keep_last=keep_last)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise CheckpointError(f"checkpoint location {text} names host {parsed.netloc!r}; "
                                  f"a file:// URI must be file:///absolute/path.")
        return LocalCheckpointStore(urllib.parse.unquote(parsed.path), keep_last=keep_last)
    if scheme == "s3":
        # Imported here so that boto3 is loaded only by jobs that checkpoint to S3.
        try:
            from transientvod.checkpoint.s3 import S3CheckpointStore
        except ModuleNotFoundError as e:
            raise CheckpointError(f"checkpoint location {text} needs {e.name or 'boto3'}, which is not installed; "
                                  f"pip install boto3 or use a local directory.") from None
        return S3CheckpointStore(text, keep_last=keep_last)
    if scheme == "gs":
        # Imported here so that google-cloud-storage is needed only by jobs that checkpoint to GCS.
        try:
            from transientvod.checkpoint.gs import GcsCheckpointStore
        except ModuleNotFoundError as e:
            raise CheckpointError(f"checkpoint location {text} needs {e.name or 'google-cloud-storage'}, which is "
                                  f"not installed; pip install 'transientvod[gcs]' or use a local directory.") from None
        return GcsCheckpointStore(text, keep_last=keep_last)
    raise CheckpointError(f"checkpoint location {text} has scheme '{scheme}://', which is not supported; "
                          f"use a local directory, a file:// URI, an s3:// URI or a gs:// URI.")
