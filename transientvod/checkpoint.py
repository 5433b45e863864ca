"""Durable checkpoints: what a job resumes from when every one of its workers was lost.

Rank 0 writes one every `train.checkpoint_every` steps and at the end. A store holds
several; `load_latest` returns the newest one whose bytes are intact, so a checkpoint torn
by a crash, a full disk or a bad copy costs the steps since the one before it, not the run.

The layout is plain files, so that an S3 store can write the same bytes as objects::

    <root>/step-000000200/state.pt        torch.save of the state dict
    <root>/step-000000200/config.yaml     the resolved config the job ran with
    <root>/step-000000200/manifest.json   {"step", "created", "files": {name: {"sha256", "bytes"}}, "format"}
    <root>/latest                         "step-000000200": the newest step directory

Within a checkpoint the manifest is written last and `latest` is written after the whole
checkpoint, so a reader never mistakes half a checkpoint for a whole one. The local store
writes into `.tmp-step-000000200-<pid>` and renames it into place, so a step directory
appears complete or not at all; the checksums in the manifest catch what the rename cannot
(bytes damaged after they were written).

One writer at a time per store (rank 0 of one job); readers may look at any time.
"""
from __future__ import annotations

import abc
import errno
import hashlib
import io
import json
import logging
import os
import re
import shutil
import threading
import time
import typing
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FORMAT = 1  # manifest.json "format"; a reader skips checkpoints of a format it does not know
STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
LATEST_FILE = "latest"
# A writer that died leaves its temporary directory behind. One whose process is gone is
# removed at the next save; one whose pid looks alive (pid reuse, or a writer on another host
# sharing the directory) is removed once it is this old, far longer than any write takes.
STALE_TEMP_SECONDS = 3600.0

_STEP_DIR = re.compile(r"^step-(\d{9,})$")
_TEMP_ENTRY = re.compile(r"^\.tmp-(?:step-\d+|latest)-(\d+)(?:-old)?$")


class CheckpointError(RuntimeError):
    """The store cannot be used (a directory that cannot be created or written, an unknown
    URI scheme); the message is one sentence naming the location to fix."""


class CorruptCheckpoint(Exception):
    """One checkpoint's bytes do not match its manifest; the message says what is wrong.
    Stores catch it, log it and fall back to an older checkpoint."""


@dataclass
class Checkpoint:
    step: int
    state: dict  # what was saved (torch objects allowed: tensors, state_dicts)
    config_yaml: str  # the resolved config saved with it
    location: str  # where it lives (directory path or URI)


class CheckpointStore(abc.ABC):
    """Where a job's checkpoints live. Implementations: LocalCheckpointStore (a directory)."""

    @abc.abstractmethod
    def save(self, step: int, state: dict, config_yaml: str) -> str:
        """Write the checkpoint of `step` durably and return its location. Replaces an
        existing checkpoint of the same step; keeps only the newest `keep_last`."""

    @abc.abstractmethod
    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint whose bytes match its manifest, or None if there is none.
        Each corrupted one on the way is skipped with a warning that names it."""

    @abc.abstractmethod
    def steps(self) -> list[int]:
        """Steps of the complete checkpoints present (those with a manifest), ascending."""

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """The root of the store (a directory path or URI)."""


def step_dir_name(step: int) -> str:
    # Zero-padded so that a plain name sort (an S3 listing, `ls`) is also a step sort.
    return f"step-{step:09d}"


def step_of_dir_name(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def encode_checkpoint(step: int, state: dict, config_yaml: str) -> dict[str, bytes]:
    """The files of one checkpoint, by name, in the order to write them: manifest last."""
    buffer = io.BytesIO()
    # Serialized to bytes first so that the checksum is of exactly the bytes written, and an
    # object store can upload them without a temporary file.
    torch.save(state, buffer)
    files = {STATE_FILE: buffer.getvalue(), CONFIG_FILE: config_yaml.encode("utf-8")}
    manifest = {
        "step": step,
        "created": time.time(),
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                  for name, data in files.items()},
        "format": FORMAT,
    }
    files[MANIFEST_FILE] = json.dumps(manifest, indent=2).encode("utf-8")
    return files


def decode_checkpoint(step: int, read_file: typing.Callable[[str], bytes]) -> tuple[dict, str]:
    """(state, config_yaml) of the checkpoint of `step`, whose files `read_file(name)` returns
    (raising FileNotFoundError for a missing one). Raises CorruptCheckpoint saying why."""
    try:
        manifest_bytes = read_file(MANIFEST_FILE)
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{MANIFEST_FILE} is missing") from None
    try:
        manifest = json.loads(manifest_bytes)
        fmt, manifest_step, listed = manifest["format"], manifest["step"], manifest["files"]
        expected = {name: (str(listed[name]["sha256"]), int(listed[name]["bytes"]))
                    for name in (STATE_FILE, CONFIG_FILE)}
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{MANIFEST_FILE} is unreadable: {type(e).__name__}: {e}") from None
    if fmt != FORMAT:
        raise CorruptCheckpoint(f"{MANIFEST_FILE} has format {fmt!r}; this version reads format {FORMAT}")
    if manifest_step != step:
        raise CorruptCheckpoint(f"{MANIFEST_FILE} is of step {manifest_step!r}, not {step}")
    contents = {}
    for name, (sha256, size) in expected.items():
        try:
            data = read_file(name)
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{name} is missing") from None
        if len(data) != size:
            raise CorruptCheckpoint(f"{name} has {len(data)} bytes, the manifest says {size}")
        if hashlib.sha256(data).hexdigest() != sha256:
            raise CorruptCheckpoint(f"{name} does not match its sha256 in the manifest")
        contents[name] = data
    try:
        # weights_only=False: the state holds optimizer and sampler objects, and the checksum
        # above shows these are the bytes this package wrote.
        state = torch.load(io.BytesIO(contents[STATE_FILE]), map_location="cpu", weights_only=False)
        config_yaml = contents[CONFIG_FILE].decode("utf-8")
    except Exception as e:  # noqa: BLE001 - any failure here means the bytes are unusable
        raise CorruptCheckpoint(f"{STATE_FILE} cannot be loaded: {type(e).__name__}: {e}") from None
    return state, config_yaml


class LocalCheckpointStore(CheckpointStore):
    """Checkpoints in a directory on a local or shared file system."""

    def __init__(self, root: str | os.PathLike, keep_last: int = 3):
        if keep_last < 1:
            raise ValueError(f"keep_last is {keep_last}; it must be at least 1 so that a job can resume.")
        self.root = Path(root)
        self.keep_last = keep_last
        # The revocation-notice watcher may ask for a checkpoint while the training loop writes
        # its periodic one; both would use the same temporary directory.
        self._save_lock = threading.Lock()
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

    def save(self, step: int, state: dict, config_yaml: str) -> str:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step is {step!r}; it must be an int of at least 0.")
        files = encode_checkpoint(step, state, config_yaml)
        name = step_dir_name(step)
        final = self.root / name
        temp = self.root / f".tmp-{name}-{os.getpid()}"
        aside = self.root / f".tmp-{name}-{os.getpid()}-old"
        started = time.monotonic()
        with self._save_lock:
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
                self._write_latest(name)
            except OSError as e:
                shutil.rmtree(temp, ignore_errors=True)
                fix = "free space there" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
                raise CheckpointError(
                    f"checkpoint directory {self.root} cannot be written ({_reason(e)}); "
                    f"{fix} or choose another checkpoint.dir.") from None
            self._prune(keep_step=step)
        log.info("saved checkpoint %s (step %d, %.1f MB) in %.1f s", final, step,
                 sum(len(data) for data in files.values()) / 1e6, time.monotonic() - started)
        return str(final)

    def _write_latest(self, name: str) -> None:
        temp = self.root / f".tmp-{LATEST_FILE}-{os.getpid()}"
        _write_durably(temp, f"{name}\n".encode("ascii"))
        os.replace(temp, self.root / LATEST_FILE)
        _fsync_directory(self.root)

    def _prune(self, keep_step: int) -> None:
        """Keep the newest `keep_last` complete checkpoints (and the one just written, even if
        older ones with higher steps exist); remove older step directories and the temporary
        directories of writers that died."""
        complete = self.steps()
        kept = set(complete[-self.keep_last:]) | {keep_step}
        oldest_kept = min(kept)
        for step, path in self._step_dirs():
            # A step directory without a manifest is damaged; older than every kept one, it
            # can never be resumed from, newer ones stay to be looked at.
            if step not in kept and (step in complete or step < oldest_kept):
                shutil.rmtree(path, ignore_errors=True)
                log.debug("removed old checkpoint %s", path)
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

    def steps(self) -> list[int]:
        return sorted(step for step, path in self._step_dirs() if (path / MANIFEST_FILE).is_file())

    def load_latest(self) -> Checkpoint | None:
        started = time.monotonic()
        for step, path in self._candidates():
            try:
                state, config_yaml = decode_checkpoint(step, lambda name, d=path: (d / name).read_bytes())
            except CorruptCheckpoint as e:
                log.warning("checkpoint %s is corrupted (%s); skipping it", path, e)
                continue
            except OSError as e:
                log.warning("checkpoint %s is corrupted (cannot be read: %s); skipping it", path, _reason(e))
                continue
            log.info("loaded checkpoint %s (step %d) in %.1f s", path, step, time.monotonic() - started)
            return Checkpoint(step=step, state=state, config_yaml=config_yaml, location=str(path))
        return None

    def _candidates(self) -> list[tuple[int, Path]]:
        """Step directories, newest first. The listing decides, not `latest`: a writer that
        crashed after its rename but before updating `latest` left a newer complete checkpoint
        than the one `latest` names."""
        candidates = sorted(self._step_dirs(), reverse=True)
        pointer = self._read_latest()
        if candidates and pointer is not None and pointer != candidates[0][0]:
            log.info("%s names step %s but the newest checkpoint directory is step %d; "
                     "trying newest first", self.root / LATEST_FILE, pointer, candidates[0][0])
        return candidates

    def _read_latest(self) -> int | None:
        try:
            return step_of_dir_name((self.root / LATEST_FILE).read_text(encoding="ascii").strip())
        except (OSError, UnicodeDecodeError):
            return None

    def _step_dirs(self) -> list[tuple[int, Path]]:
        found = []
        for entry in self._entries():
            step = step_of_dir_name(entry.name)
            if step is not None and entry.is_dir(follow_symlinks=False):
                found.append((step, Path(entry.path)))
        return found

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


def open_store(uri: str, keep_last: int = 3) -> CheckpointStore:
    """The store at `uri`: a directory path, a file:// URI, or s3://bucket/prefix (an
    S3CheckpointStore; its endpoint, region and credentials come from the environment)."""
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
            from transientvod.checkpoint_s3 import S3CheckpointStore
        except ModuleNotFoundError as e:
            raise CheckpointError(f"checkpoint location {text} needs {e.name or 'boto3'}, which is not installed; "
                                  f"pip install boto3 or use a local directory.") from None
        return S3CheckpointStore(text, keep_last=keep_last)
    raise CheckpointError(f"checkpoint location {text} has scheme '{scheme}://', which is not supported; "
                          f"use a local directory, a file:// URI or an s3:// URI.")


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
