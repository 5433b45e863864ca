"""The rules every checkpoint store keeps, written once: which steps may be saved, which
checkpoints are kept, how the newest intact one is found, and what the `latest` pointer is
trusted for. A store (local.py, s3.py, gs.py) supplies only its storage: list the step
directories, read a file, write a step and the pointer in their order, delete a step.

One writer at a time per store (rank 0 of one job); readers may look at any time.
"""
from __future__ import annotations

import abc
import functools
import logging
import threading
import time
from dataclasses import dataclass

from transientvod.checkpoint.format import (
    LATEST_FILE,
    CheckpointError,
    CorruptCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
    step_dir_name,
    step_of_dir_name,
)

log = logging.getLogger(__name__)

# A writer that died leaves its partial write behind (a temporary directory, an unfinished
# multipart upload). One this old is from a dead writer, not one still writing: far longer
# than any write takes.
STALE_TEMP_SECONDS = 3600.0


@dataclass
class Checkpoint:
    step: int
    state: dict  # what was saved (torch objects allowed: tensors, state_dicts)
    config_yaml: str  # the resolved config saved with it
    location: str  # where it lives (directory path or URI)


class CheckpointStore(abc.ABC):
    """Where a job's checkpoints live. Implementations: LocalCheckpointStore (a directory),
    S3CheckpointStore (an s3:// prefix), GcsCheckpointStore (a gs:// prefix)."""

    # True where a step appears whole or not at all (a directory renamed into place): one
    # without its manifest was damaged afterwards, and load_latest warns about it. False
    # where a step's files appear one by one (S3): one without its manifest is still being
    # written, or its writer died, and readers pass over it in silence.
    steps_appear_whole: bool = True
    # Errors of the storage underneath that the public methods turn into the store's
    # one-sentence CheckpointError (see `_failure`); none where the primitives raise
    # CheckpointError themselves.
    storage_errors: tuple[type[Exception], ...] = ()

    def __init__(self, keep_last: int):
        if keep_last < 1:
            raise ValueError(f"keep_last is {keep_last}; it must be at least 1 so that a job can resume.")
        self.keep_last = keep_last
        # The revocation-notice watcher may ask for a checkpoint while the training loop
        # writes its periodic one; both would write the same step's files.
        self._save_lock = threading.Lock()

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """The root of the store (a directory path or URI)."""

    # -- the rules -------------------------------------------------------------------------

    def save(self, step: int, state: dict, config_yaml: str) -> str:
        """Write the checkpoint of `step` durably and return its location. Replaces an
        existing checkpoint of the same step; keeps only the newest `keep_last`."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step is {step!r}; it must be an int of at least 0.")
        files = encode_checkpoint(step, state, config_yaml)
        name = step_dir_name(step)
        started = time.monotonic()
        with self._save_lock:
            try:
                self._write_step(name, files)
                # After the whole step, so that `latest` never names half a checkpoint.
                self._write_latest(f"{name}\n".encode("ascii"))
            except self.storage_errors as e:
                raise self._failure(e, "cannot be written") from None
            self._prune(keep_step=step)
        log.info("saved checkpoint %s (step %d, %.1f MB) in %.1f s", self._step_location(name), step,
                 sum(len(data) for data in files.values()) / 1e6, time.monotonic() - started)
        return self._step_location(name)

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints present (those with a manifest), ascending."""
        try:
            return [step for step, name in self._list_steps() if self._has_manifest(name)]
        except self.storage_errors as e:
            raise self._failure(e, "cannot be listed") from None

    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint whose bytes match its manifest, or None if there is none.
        Each corrupted one on the way is skipped with a warning that names it."""
        started = time.monotonic()
        try:
            for step, name in self._candidates():
                location = self._step_location(name)
                try:
                    state, config_yaml = decode_checkpoint(step, functools.partial(self._read_file, name))
                except CorruptCheckpoint as e:
                    log.warning("checkpoint %s is corrupted (%s); skipping it", location, e)
                    continue
                log.info("loaded checkpoint %s (step %d) in %.1f s", location, step, time.monotonic() - started)
                return Checkpoint(step=step, state=state, config_yaml=config_yaml, location=location)
        except self.storage_errors as e:
            raise self._failure(e, "cannot be read") from None
        return None

    def _candidates(self) -> list[tuple[int, str]]:
        """(step, name) to try, newest first. The listing decides, not `latest`: a writer that
        died after its step was whole but before updating `latest` left a newer complete
        checkpoint than the one `latest` names."""
        candidates = [(step, name) for step, name in reversed(self._list_steps())
                      if self.steps_appear_whole or self._has_manifest(name)]
        pointer = self._latest_step()
        if candidates and pointer is not None and pointer != candidates[0][0]:
            log.info("%s/%s names step %s but the newest checkpoint is step %d; trying newest first",
                     self.location, LATEST_FILE, pointer, candidates[0][0])
        return candidates

    def _latest_step(self) -> int | None:
        data = self._read_latest()
        try:
            return None if data is None else step_of_dir_name(data.decode("ascii").strip())
        except UnicodeDecodeError:
            return None

    def _prune(self, keep_step: int) -> None:
        """Keep the newest `keep_last` complete checkpoints (and the one just written, even if
        older ones with higher steps exist); remove older steps and what writers that died
        left behind."""
        found = self._list_steps()
        complete = {step for step, name in found if self._has_manifest(name)}
        kept = set(sorted(complete)[-self.keep_last:]) | {keep_step}
        oldest_kept = min(kept)
        for step, name in found:
            # A step without a manifest older than every kept one can never be resumed from;
            # newer ones may be a checkpoint being written (or one to look at), and stay.
            if step not in kept and (step in complete or step < oldest_kept):
                self._delete_step(name)
                log.debug("removed old checkpoint %s", self._step_location(name))
        self._remove_abandoned_writes()

    def _failure(self, error: Exception, failed: str) -> CheckpointError:
        """The one sentence a user needs to fix `error` (one of `storage_errors`)."""
        return CheckpointError(f"checkpoint store {self.location} {failed} ({type(error).__name__}); "
                               f"check it and try again.")

    # -- the storage: what each store implements -------------------------------------------

    @abc.abstractmethod
    def _list_steps(self) -> list[tuple[int, str]]:
        """(step, name) of every step directory present, complete or not, ascending."""

    @abc.abstractmethod
    def _has_manifest(self, name: str) -> bool:
        """Whether step directory `name` holds a manifest (its last file)."""

    @abc.abstractmethod
    def _read_file(self, name: str, file_name: str) -> bytes:
        """The bytes of `file_name` in step directory `name`. Raises FileNotFoundError if it
        is missing, CorruptCheckpoint if the storage itself says its bytes are unusable."""

    @abc.abstractmethod
    def _write_step(self, name: str, files: dict[str, bytes]) -> None:
        """Write the files of step directory `name` in their order (the manifest last),
        replacing a step of that name, so that no reader ever sees a manifest with files
        other than the ones it describes."""

    @abc.abstractmethod
    def _write_latest(self, data: bytes) -> None:
        """Replace the `latest` pointer with `data`."""

    @abc.abstractmethod
    def _read_latest(self) -> bytes | None:
        """The bytes of the `latest` pointer, or None if there is none."""

    @abc.abstractmethod
    def _delete_step(self, name: str) -> None:
        """Remove step directory `name`, manifest first where files go one by one."""

    @abc.abstractmethod
    def _remove_abandoned_writes(self) -> None:
        """Remove what writers that died left behind; a failure here costs storage only."""

    @abc.abstractmethod
    def _step_location(self, name: str) -> str:
        """Where step directory `name` lives (a path or URI), for messages and callers."""
