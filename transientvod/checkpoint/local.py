"""Checkpoints in a directory on a local or shared file system (the layout: format.py).

A step directory is written as `.tmp-step-000000200-<pid>` and renamed into place, so it
appears complete or not at all; every file and every directory change is fsynced before
the next one, so that a crash or power loss keeps either the old checkpoint or the new one.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import time
from pathlib import Path

from transientvod.checkpoint.format import (
    LATEST_FILE,
    MANIFEST_FILE,
    CheckpointError,
    CorruptCheckpoint,
    step_of_dir_name,
)
from transientvod.checkpoint.store import STALE_TEMP_SECONDS, CheckpointStore

log = logging.getLogger(__name__)

# The temporary directory of a step (or file of `latest`) of the writer with that pid. One
# whose process is gone is removed at the next save; one whose pid looks alive (pid reuse,
# or a writer on another host sharing the directory) once it is STALE_TEMP_SECONDS old.
_TEMP_ENTRY = re.compile(r"^\.tmp-(?:step-\d+|latest)-(\d+)(?:-old)?$")


class LocalCheckpointStore(CheckpointStore):
    """Checkpoints in a directory on a local or shared file system."""

    def __init__(self, root: str | os.PathLike, keep_last: int = 3):
        super().__init__(keep_last)
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(
                f"checkpoint directory {self.root} cannot be created ({_reason(e)}); "
                f"choose a writable checkpoint.dir.") from None

    @property
    def location(self) -> str:
        return str(self.root)

    def __repr__(self) -> str:
        return f"LocalCheckpointStore({str(self.root)!r}, keep_last={self.keep_last})"

    # -- writing ---------------------------------------------------------------------------

    def _write_step(self, name: str, files: dict[str, bytes]) -> None:
        final = self.root / name
        temp = self.root / f".tmp-{name}-{os.getpid()}"
        aside = self.root / f".tmp-{name}-{os.getpid()}-old"
        try:
            for leftover in (temp, aside):  # from a save of this process that failed
                shutil.rmtree(leftover, ignore_errors=True)
            temp.mkdir()
            for file_name, data in files.items():  # manifest.json last
                _write_durably(temp / file_name, data)
            _fsync_directory(temp)
            if final.exists():
                # A re-save of a step (after a rollback): the directory cannot be renamed
                # over a full one, so the old one steps aside first. A crash between the
                # two renames loses this step only; older checkpoints stay.
                os.rename(final, aside)
                os.rename(temp, final)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(temp, final)
            _fsync_directory(self.root)
        except OSError as e:
            shutil.rmtree(temp, ignore_errors=True)
            raise self._write_failure(e) from None

    def _write_latest(self, data: bytes) -> None:
        temp = self.root / f".tmp-{LATEST_FILE}-{os.getpid()}"
        try:
            _write_durably(temp, data)
            os.replace(temp, self.root / LATEST_FILE)
            _fsync_directory(self.root)
        except OSError as e:
            raise self._write_failure(e) from None

    def _write_failure(self, error: OSError) -> CheckpointError:
        fix = "free space there" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
        return CheckpointError(f"checkpoint directory {self.root} cannot be written ({_reason(error)}); "
                               f"{fix} or choose another checkpoint.dir.")

    def _delete_step(self, name: str) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)

    def _remove_abandoned_writes(self) -> None:
        now = time.time()
        for entry in self._entries():
            if not entry.name.startswith(".tmp-"):
                continue
            match = _TEMP_ENTRY.match(entry.name)
            pid = int(match.group(1)) if match else None
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            dead = pid is not None and pid != os.getpid() and not _process_alive(pid)
            if dead or age > STALE_TEMP_SECONDS:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    Path(entry.path).unlink(missing_ok=True)
                log.info("removed %s, left by a checkpoint writer that died", entry.path)

    # -- reading ---------------------------------------------------------------------------

    def _list_steps(self) -> list[tuple[int, str]]:
        found = []
        for entry in self._entries():
            step = step_of_dir_name(entry.name)
            if step is not None and entry.is_dir(follow_symlinks=False):
                found.append((step, entry.name))
        return sorted(found)

    def _has_manifest(self, name: str) -> bool:
        return (self.root / name / MANIFEST_FILE).is_file()

    def _read_file(self, name: str, file_name: str) -> bytes:
        try:
            return (self.root / name / file_name).read_bytes()
        except FileNotFoundError:
            raise
        except OSError as e:
            raise CorruptCheckpoint(f"cannot be read: {_reason(e)}") from None

    def _read_latest(self) -> bytes | None:
        try:
            return (self.root / LATEST_FILE).read_bytes()
        except OSError:  # missing or unreadable: the listing decides anyway
            return None

    def _step_location(self, name: str) -> str:
        return str(self.root / name)

    def _entries(self) -> list[os.DirEntry]:
        try:
            with os.scandir(self.root) as it:
                return list(it)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CheckpointError(
                f"checkpoint directory {self.root} cannot be listed ({_reason(e)}); "
                f"check that it exists and is readable.") from None


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_directory(path: Path) -> None:
    # Makes the names (new files, a rename) durable, not only the bytes inside the files.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some file systems (certain network mounts) cannot fsync a directory; the data
        # files themselves were fsynced, which is the most they offer.
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__
